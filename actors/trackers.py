"""Where a job's metrics go besides RUN_DIR/metrics.jsonl and the plots: the trackers of `logging.report_to` —
wandb (`logging.wandb_mode`: offline by default, disabled turns it off) and TensorBoard (event files in
RUN_DIR/tensorboard/, through the `tensorboard` package: `tensorboard --logdir RUN_DIR`). Opened once the
workers are up, fed every step's numeric metrics, closed at the end."""

from __future__ import annotations


class Trackers:
    def __init__(self, cfg, run_dir):
        report_to = set(cfg.logging.report_to)
        self.wandb = _wandb(cfg, run_dir) if "wandb" in report_to and cfg.logging.wandb_mode != "disabled" else None
        self.tensorboard = None
        if "tensorboard" in report_to:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # torch's writer needs the tensorboard package
                raise RuntimeError(
                    "logging.report_to includes tensorboard, which needs the tensorboard package "
                    "(pip install 'fbrl[tensorboard]')"
                ) from None
            self.tensorboard = SummaryWriter(str(run_dir.path / "tensorboard"))

    def log(self, metrics: dict) -> None:
        numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.wandb is not None:
            self.wandb.log(numbers, step=metrics["step"])
        if self.tensorboard is not None:
            for k, v in numbers.items():
                self.tensorboard.add_scalar(k, v, global_step=metrics["step"])

    def close(self) -> str | None:
        """Flush and close every tracker; returns wandb's run directory (None without wandb)."""
        wandb_dir = None
        if self.wandb is not None:
            wandb_dir = getattr(self.wandb, "dir", None)
            self.wandb.finish()
        if self.tensorboard is not None:
            self.tensorboard.close()
        return wandb_dir


def _wandb(cfg, run_dir):
    import wandb

    from rl.config.secrets import redacted

    settings = None if cfg.logging.verbose else wandb.Settings(silent=True)  # its 30-line summary: metrics.jsonl
    return wandb.init(
        project=cfg.logging.wandb_project,
        entity=cfg.logging.wandb_entity,
        mode=cfg.logging.wandb_mode,
        dir=str(run_dir.path),
        config=redacted(cfg.to_dict()),
        resume="allow" if cfg.train.resume else None,
        name=run_dir.path.name,
        settings=settings,
    )
