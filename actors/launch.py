"""`fbrl train CONFIG [key=value ...] [--resume RUN_DIR]` — launch a GRPO-style job.

With no `ray.address` a local Ray is started (dashboard off, loopback only); on a cluster submit with
`ray job submit --address ... -- fbrl train configs/<gpu config>.yaml` (docs/CLUSTER.md). `--no-ray` runs the
same loop with in-process workers, for debugging. With no CONFIG the embedded default (configs/tiny.yaml) runs.
`--print-config` prints the resolved config (defaults included) and exits. What the console shows — one line per
step, a progress bar on a terminal, a summary, third-party output quieted unless `--verbose` — is
actors/console.py; the plots (written during the run) are rl/plots.py.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"


def add_arguments(p) -> None:
    p.add_argument("config", nargs="?", default=None, help="YAML config (default: the embedded tiny job)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. train.steps=4 (run_dir=PATH is "
                                                "short for train.run_dir=PATH)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    p.add_argument("--no-ray", action="store_true", help="in-process workers instead of Ray actors (debugging)")
    p.add_argument("--print-config", action="store_true",
                   help="print the fully resolved config (every default included) as YAML and exit")
    p.add_argument("--verbose", action="store_true",
                   help="show vLLM / Ray workers / DeepSpeed / wandb / transformers output (logging.verbose=true)")


def _environment(cfg) -> None:
    # Set before anything imports wandb / vllm / ray: these are read at import or process start.
    os.environ.setdefault("WANDB_MODE", cfg.logging.wandb_mode)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if cfg.ray.address is None:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local, loopback-only Ray


def load_train_config(args):
    """(config path, Config) from the command line: CONFIG (or the embedded default), overrides, flags."""
    from rl.config import load_config

    config_path = args.config or str(DEFAULT_CONFIG)
    if args.config and "=" in args.config and not Path(args.config).exists():  # `fbrl train key=value`
        args.overrides.insert(0, args.config)
        config_path = str(DEFAULT_CONFIG)
    # `run_dir=PATH` is the documented shorthand for `train.run_dir=PATH`
    overrides = [f"train.{o}" if o.startswith("run_dir=") else o for o in args.overrides]
    if args.resume:
        overrides += [f"train.resume={args.resume}", f"train.run_dir={args.resume}"]
    if getattr(args, "verbose", False):
        overrides.append("logging.verbose=true")
    return config_path, load_config(config_path, overrides)


def _workers_line(cfg, use_ray: bool) -> str:
    r, learner = cfg.rollout, cfg.learner
    where = "in-process workers" if not use_ray else (f"Ray at {cfg.ray.address}" if cfg.ray.address
                                                      else "local Ray")
    engines = f"{r.num_engines} {r.engine} engine{'s' if r.num_engines > 1 else ''} ({r.decode_mode} decoding)"
    n = learner.num_workers if use_ray else 1  # in-process: one rank (actors/local.py)
    learners = f"{n} DeepSpeed learner{'s' if n > 1 else ''} (ZeRO-{learner.zero_stage})"
    return (f"starting {where}: {engines}, {learners}, {cfg.likelihood.estimator} estimator, rewards "
            f"{', '.join(f.name or f.fn for f in cfg.reward.fns)}")


def run(args) -> int:
    config_path, cfg = load_train_config(args)
    if args.print_config:
        print(cfg.to_yaml(), end="")
        return 0

    from actors import console
    console.plain_text_streams()
    console.quiet_third_party(cfg.logging.verbose)
    _environment(cfg)
    from rl.data.tokenizer import load_tokenizer
    from rl.decode_modes import mode_warning
    from rl.loop import train
    from rl.plots import LivePlots
    from rl.run import RunDir

    run_dir = RunDir(cfg.train.run_dir)
    print(f"fbrl train: {config_path} -> {run_dir.path}", flush=True)
    if cfg.train.resume:  # refuse a changed experiment before starting any worker
        run_dir.check_resume_config(cfg)
    for wanted, key in ((cfg.rollout.decode_mode, "rollout.decode_mode"),
                        (cfg.train.eval_decode_modes, "train.eval_decode_modes")):
        warning = mode_warning(cfg.model.path, wanted, key)
        if warning:
            print(warning, flush=True)

    from actors.placement import build_workers
    t_start = time.perf_counter()
    print(_workers_line(cfg, not args.no_ray), flush=True)
    rollout, learner, rewards = build_workers(cfg, use_ray=not args.no_ray)
    print(f"workers ready in {time.perf_counter() - t_start:.0f} s", flush=True)
    tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.path)
    wandb_run = _wandb(cfg, run_dir)
    bar = console.progress_bar(cfg.train.steps, cfg.logging.progress)

    def on_step(metrics):
        if wandb_run is not None:
            wandb_run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=metrics["step"])
        if bar is not None:
            bar.n = metrics["step"]
            bar.refresh()
        plots.update(metrics)

    log = (lambda line: bar.write(line, file=sys.stdout)) if bar is not None else (lambda line: print(line,
                                                                                                       flush=True))
    plots = LivePlots(run_dir, title=_plot_title(cfg, run_dir), log=log)
    worker_logs = _worker_logs_dir(args.no_ray)
    try:
        train(cfg, tokenizer, rollout, learner, rewards, run_dir, log=log, progress=on_step)
    finally:
        if bar is not None:
            bar.close()
        written = plots.close()
        try:  # a reward's close() (its client, its pool) runs; a dead reward worker has nothing left to close
            rewards.close()
        except Exception as e:
            print(f"closing the rewards failed: {type(e).__name__}: {e}", flush=True)
        wandb_dir = None
        if wandb_run is not None:
            wandb_dir = getattr(wandb_run, "dir", None)
            wandb_run.finish()
        _shutdown(args.no_ray)
    wandb_dir = str(Path(wandb_dir).parent) if wandb_dir else None  # the run's folder, not its files/
    print()
    for line in console.summary_lines(run_dir, cfg, time.perf_counter() - t_start, written, wandb_dir,
                                      worker_logs if not cfg.logging.verbose else None):
        print(line)
    return 0


def _plot_title(cfg, run_dir) -> str:
    return (f"{run_dir.path.name}: {Path(cfg.model.path or 'model').name}, {cfg.data.task}, "
            f"{cfg.rollout.decode_mode} decoding, {cfg.likelihood.estimator} estimator, "
            f"{cfg.train.prompts_per_step}x{cfg.rollout.n_samples_per_prompt} samples per step")


def _wandb(cfg, run_dir):
    if cfg.logging.wandb_mode == "disabled":
        return None
    import wandb
    settings = None if cfg.logging.verbose else wandb.Settings(silent=True)  # its 30-line summary: metrics.jsonl
    return wandb.init(project=cfg.logging.wandb_project, entity=cfg.logging.wandb_entity,
                      mode=cfg.logging.wandb_mode, dir=str(run_dir.path), config=cfg.to_dict(),
                      resume="allow" if cfg.train.resume else None, name=run_dir.path.name, settings=settings)


def _worker_logs_dir(no_ray: bool) -> str | None:
    """Ray's log directory on this node (where the quieted workers' output goes), if Ray runs here."""
    if no_ray:
        return None
    try:
        import ray
        return ray._private.worker._global_node.get_logs_dir_path() if ray.is_initialized() else None
    except Exception:  # a private API: the summary line is optional
        return None


def _shutdown(no_ray: bool) -> None:
    if no_ray:
        return
    import ray
    if ray.is_initialized():
        ray.shutdown()
