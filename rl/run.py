"""The run directory: config, metrics.jsonl, atomic checkpoints, resume state and plots.

Layout of RUN_DIR:
    config.yaml                 the resolved config (resume compares against it)
    metrics.jsonl               one JSON object per step (and eval rows merged into their step)
    checkpoints/step_000010/    learner/ (model save_pretrained + optimizer state), trainer_state.json, rng
    checkpoints/latest          name of the newest complete checkpoint
    plots/*.png                 reward and accuracy curves, written at the end
A checkpoint is written under a temporary name and renamed into place, then `latest` is replaced: a crash at
any point leaves the previous checkpoint and pointer intact.
"""
from __future__ import annotations

import datetime
import json
import os
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rl.config import Config, check_resume, load_config


class RunDir:
    def __init__(self, path: str | None):
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        self.path = Path(path or f"runs/{stamp}")
        self.ckpt_root = self.path / "checkpoints"
        self.ckpt_root.mkdir(parents=True, exist_ok=True)
        for stale in self.ckpt_root.glob(".tmp-*"):  # half-written checkpoints of a crashed run
            shutil.rmtree(stale, ignore_errors=True)

    # ---- config ----------------------------------------------------------------------------------------
    def write_config(self, cfg: Config) -> None:
        _atomic_write_text(self.path / "config.yaml", cfg.to_yaml())

    def check_resume_config(self, cfg: Config) -> None:
        """Refuse to resume when a field that changes the experiment differs; the error names the field."""
        check_resume(load_config(self.path / "config.yaml"), cfg)

    # ---- metrics ---------------------------------------------------------------------------------------
    def log_metrics(self, row: dict) -> None:
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")

    def read_metrics(self) -> list[dict]:
        p = self.path / "metrics.jsonl"
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []

    def truncate_metrics_after(self, step: int) -> None:
        """On resume, drop rows logged after the checkpoint (they will be logged again)."""
        rows = [r for r in self.read_metrics() if r.get("step", 0) <= step]
        _atomic_write_text(self.path / "metrics.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))

    # ---- checkpoints -----------------------------------------------------------------------------------
    def save_checkpoint(self, step: int, learner, trainer_state: dict) -> Path:
        name = f"step_{step:06d}"
        tmp = self.ckpt_root / f".tmp-{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        learner.save_checkpoint(str(tmp / "learner"))
        state = dict(trainer_state, step=step, python_rng=_jsonable(random.getstate()))
        _atomic_write_text(tmp / "trainer_state.json", json.dumps(state, indent=1, sort_keys=True))
        save_file({"torch_rng": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        final = self.ckpt_root / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _atomic_write_text(self.ckpt_root / "latest", name)
        return final

    def latest_checkpoint(self) -> Path | None:
        pointer = self.ckpt_root / "latest"
        if not pointer.exists():
            return None
        path = self.ckpt_root / pointer.read_text().strip()
        return path if path.exists() else None

    def load_checkpoint(self, learner) -> dict:
        """Restore the learner and the RNGs; return the trainer state (step, version, sampler, ...)."""
        path = self.latest_checkpoint()
        if path is None:
            raise FileNotFoundError(f"{self.path}: no complete checkpoint to resume from")
        learner.load_checkpoint(str(path / "learner"))
        state = json.loads((path / "trainer_state.json").read_text())
        random.setstate(_tupled(state.pop("python_rng")))
        torch.set_rng_state(load_file(str(path / "rng.safetensors"))["torch_rng"])
        return state

    # ---- plots -----------------------------------------------------------------------------------------
    def plot(self) -> list[Path]:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        rows = self.read_metrics()
        out_dir = self.path / "plots"
        out_dir.mkdir(exist_ok=True)
        written = []
        for key, label in (("reward_mean", "train reward"), ("accuracy", "train accuracy"),
                           ("eval_accuracy", "held-out greedy accuracy")):
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if not pts:
                continue
            fig, ax = plt.subplots(figsize=(5, 3.2))
            ax.plot(*zip(*pts), marker="o" if key == "eval_accuracy" else None)
            ax.set_xlabel("step")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            fig.tight_layout()
            fig.savefig(out_dir / f"{key}.png", dpi=100)
            plt.close(fig)
            written.append(out_dir / f"{key}.png")
        return written


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _jsonable(x):
    return [_jsonable(v) for v in x] if isinstance(x, (tuple, list)) else x


def _tupled(x):
    return tuple(_tupled(v) for v in x) if isinstance(x, list) else x
