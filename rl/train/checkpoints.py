"""Checkpoints of a run directory: written atomically and fsynced, pruned, found again and loaded; what each learner
rank saved, checked before a checkpoint is kept (several nodes need shared storage).

`Checkpoints` is the half of `rl.train.run_dir.RunDir` that owns RUN_DIR/checkpoints/ (RunDir inherits it):

    checkpoints/step_000010/    learner/ (model save_pretrained + optimizer state), trainer_state.json, rng
    checkpoints/latest          name of the newest complete checkpoint
                                beside it best.json, with `train.keep_best`: the n best checkpoints by its metric
                                (rl/train/best_checkpoints.py; never pruned)

A checkpoint is written under a temporary name and renamed into place, then `latest` is replaced: a crash at any
point leaves the previous checkpoint and pointer intact. A full disk stops the job with a line naming it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import socket
import warnings
from pathlib import Path

from rl.atomic_files import disk_full, fsync_dir, fsync_tree, replace_dir, write_text
from rl.config.checkpointing import KeepBestConfig
from rl.train.best_checkpoints import BestCheckpoints
from rl.train.faults import EXIT_BAD_INPUT, EXIT_STOPPED, RunStopped


class Checkpoints:
    """RUN_DIR/checkpoints/ (`self.path`: the run directory, `self.ckpt_root`: its checkpoints/)."""

    path: Path
    ckpt_root: Path
    _best: BestCheckpoints | None = None

    def save_checkpoint(
        self, step: int, learner, trainer_state: dict, keep: int | None = None, best: KeepBestConfig | None = None
    ) -> Path:
        """Write checkpoint `step` under a temporary name, fsync its files and directories, rename it into place and
        point `latest` at it; then, with `best`, rank the checkpoints (best.json), and with `keep` delete all but
        the newest `keep` complete checkpoints (by recorded step; never the one `latest` names, never the best).
        A crash at any point leaves a resumable run."""
        name = f"step_{step:06d}"
        tmp = self.ckpt_root / f".tmp-{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        with self.full_disk_stops(tmp, remove=tmp):
            tmp.mkdir(parents=True)
            check_saved(tmp / "learner", learner.save_checkpoint(str(tmp / "learner")), self.path)
            state = dict(trainer_state, step=step, python_rng=_jsonable(random.getstate()))
            write_text(tmp / "trainer_state.json", json.dumps(state, indent=1, sort_keys=True))
            _save_torch_rng(tmp / "rng.safetensors")
            fsync_tree(tmp)  # after a power loss `latest` must not name files the disk never got
            final = self.ckpt_root / name
            replace_dir(tmp, final)  # a re-run of the same step: the old one stays whole until the new one is in
            fsync_dir(self.ckpt_root)
            write_text(self.ckpt_root / "latest", name)
            fsync_dir(self.ckpt_root)
        kept_best = self.best_checkpoints(best) if best is not None else []
        if keep is not None:
            self.prune_checkpoints(keep, protect=kept_best)
        return final

    def best_checkpoints(self, rule: KeepBestConfig) -> list[Path]:
        """The `rule.n` best complete checkpoints by `rule.metric`, best first, recorded in best.json."""
        if self._best is None or self._best.rule != rule:
            self._best = BestCheckpoints(rule, self.path / "metrics.jsonl")
        with self.full_disk_stops(self.ckpt_root / "best.json"):
            return self._best.choose(self.complete_checkpoints(), self.ckpt_root)

    @contextlib.contextmanager
    def full_disk_stops(self, path: Path, remove: Path | None = None):
        """A write to `path`: on failure `remove` (its half-written temporary) is deleted, and a full disk stops the
        job (exit 3) with one line naming the disk and the path; the last complete checkpoint stays `latest`."""
        try:
            yield
        except Exception as e:
            if remove is not None:
                shutil.rmtree(remove, ignore_errors=True)
            if not disk_full(e):
                raise
            latest = self.latest_checkpoint()
            last = f"from {latest.name}" if latest is not None else "(no checkpoint yet: start again)"
            raise RunStopped(
                f"the disk is full (no space left on device) writing {path}: free space on the disk of {self.path}, "
                f"then `fbrl train --resume {self.path}` continues {last}",
                exit_code=EXIT_STOPPED,
            ) from None

    def complete_checkpoints(self) -> list[Path]:
        """Checkpoints whose trainer state parses and whose learner state exists, oldest first (by recorded step)."""
        found = []
        for path in self.ckpt_root.glob("step_*"):
            try:
                step = json.loads((path / "trainer_state.json").read_text())["step"]
            except (OSError, ValueError, KeyError):
                continue
            if (path / "learner").is_dir():
                found.append((int(step), path))
        return [path for _, path in sorted(found)]

    def prune_checkpoints(self, keep: int, protect: list[Path] = ()) -> None:
        """Delete all but the newest `keep` complete checkpoints, never the one `latest` names nor those in
        `protect` (renamed aside first, so a kill mid-delete leaves a `.tmp-` directory the next start sweeps, not
        half a checkpoint)."""
        latest = self.latest_checkpoint()
        spared = {p.resolve() for p in protect} | ({latest.resolve()} if latest is not None else set())
        done = self.complete_checkpoints()
        for path in done[: max(len(done) - keep, 0)]:
            if path.resolve() in spared:
                continue
            doomed = self.ckpt_root / f".tmp-pruned-{path.name}-{os.getpid()}"
            os.replace(path, doomed)
            shutil.rmtree(doomed, ignore_errors=True)

    def latest_checkpoint(self) -> Path | None:
        """The checkpoint `latest` names when it is complete; else the newest complete one (with a warning: a crash
        or power loss after the pointer was written); None without any."""
        pointer = self.ckpt_root / "latest"
        named = self.ckpt_root / pointer.read_text().strip() if pointer.is_file() else None
        complete = self.complete_checkpoints()
        if named is not None and named in complete:
            return named
        if named is not None and complete:
            warnings.warn(
                f"{pointer} names {named.name}, which is incomplete; resuming from {complete[-1].name}", stacklevel=2
            )
        return complete[-1] if complete else None

    def load_checkpoint(self, learner) -> dict:
        """Restore the learner and the RNGs; return the trainer state (step, version, sampler, ...)."""
        path = self.latest_checkpoint()
        if path is None:
            raise FileNotFoundError(f"{self.path}: no complete checkpoint to resume from")
        learner.load_checkpoint(str(path / "learner"))
        state = json.loads((path / "trainer_state.json").read_text())
        random.setstate(_tupled(state.pop("python_rng")))
        _load_torch_rng(path / "rng.safetensors")
        return state


def saved_files(directory: str | Path, rank: int) -> dict:
    """What a learner rank reports after writing its part of a checkpoint: its host and every file it sees under
    `directory` with its size in bytes (with several nodes, only its own node's unless the storage is shared)."""
    root = Path(directory)
    files = {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}
    return {"rank": rank, "host": socket.gethostname(), "files": files}


def check_saved(directory: Path, receipts: list[dict] | None, run_path: Path) -> None:
    """Refuse a checkpoint the driver cannot see whole: a file a rank wrote that is not under `directory` here, or is
    here with another size (another node's copy, or shared storage that has not caught up), means resuming (or
    rebuilding the learner) from it would fail later or load torn state.
    `receipts`: the ranks' `saved_files` (None: a learner stand-in that reports none)."""
    if receipts is None:
        return
    missing = {}
    for r in receipts:
        seen = {f: _seen_size(directory / f) for f in r["files"]}
        lost = [f"{f} ({seen[f]} here, {size} written)" for f, size in r["files"].items() if seen[f] != size]
        if lost:
            missing[r["rank"]] = (r["host"], lost)
    if missing:
        ranks = "; ".join(
            f"rank {rank} on {host}: {len(lost)} files, e.g. {lost[0]}"
            for rank, (host, lost) in sorted(missing.items())
        )
        shutil.rmtree(directory.parent, ignore_errors=True)
        raise not_shared(
            f"the checkpoint is incomplete as this driver (on {socket.gethostname()}) sees it, and nothing of it was "
            f"kept: the learner ranks wrote files it cannot find under {directory} ({ranks})",
            run_path,
            "every learner rank",
        )


def _seen_size(path: Path) -> str | int:
    """A file's size in bytes as this process sees it; "missing" where it sees none."""
    return path.stat().st_size if path.is_file() else "missing"


def not_shared(what: str, run_path: Path, ranks: str) -> RunStopped:
    """The stop for files the learner ranks wrote where this driver cannot read them (nodes without shared
    storage): exit 2, naming `train.run_dir` and the fix."""
    return RunStopped(
        f"{what}. train.run_dir={run_path} must be on storage every node shares (NFS or a cluster filesystem), or "
        f"{ranks} on the driver's node",
        resumable=False,
        exit_code=EXIT_BAD_INPUT,
    )


def _jsonable(x):
    return [_jsonable(v) for v in x] if isinstance(x, (tuple, list)) else x


def _tupled(x):
    return tuple(_tupled(v) for v in x) if isinstance(x, list) else x


# torch is imported where it is used: the run directory's rules (which import this module) are checked before a job
# starts, and `fbrl train` starts Ray as soon as they hold
def save_file(tensors: dict, path: str) -> None:
    """safetensors' `save_file`, imported (with torch) on first use."""
    from safetensors.torch import save_file as save

    save(tensors, path)


def _save_torch_rng(path: Path) -> None:
    import torch

    save_file({"torch_rng": torch.get_rng_state()}, str(path))


def _load_torch_rng(path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    torch.set_rng_state(load_file(str(path))["torch_rng"])
