"""The run directory: config, metrics.jsonl, atomic checkpoints, resume state and plots.

Layout of RUN_DIR:
    config.yaml                 the resolved config (resume compares against it)
    metrics.jsonl               one JSON object per step (and eval rows merged into their step)
    checkpoints/                the checkpoints (rl/train/checkpoints.py: written atomically, pruned, loaded)
    policy/                     the policy as a save_pretrained directory (config, weights, tokenizer), replaced at
                                every checkpoint and at the end: load it with AutoModelForCausalLM, decode with vLLM
    plots/summary.png, *.png    every panel of rl/report/plots.py in one figure, and each panel alone; redrawn
                                during the run (after eval steps, else every 30 s or so) and at the end
`RunDir.new` (a new run) refuses a directory that already holds something, unless told to overwrite a previous
run there; `RunDir.existing` (resume) refuses a directory that is not a run with a checkpoint, and creates nothing.
Values under secret-looking keys (`api_key`, `token`, ...) are never written to config.yaml (`redacted`).
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import math
import os
import shutil
import socket
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from rl import atomic_files
from rl.atomic_files import fsync_dir, fsync_tree, replace_dir, sweep_leftovers, write_text
from rl.config import Config, check_resume, load_config
from rl.config.secrets import redacted
from rl.config.serialize import yaml_dump
from rl.decode_modes import rl_modes
from rl.errors import InputError
from rl.train.checkpoints import Checkpoints, not_shared
from rl.train.faults import RunStopped
from rl.train.policy_dir import build_policy_dir
from rl.train.resume_layout import layout_problem

if TYPE_CHECKING:
    from rl.train.workers import LearnerWorkers

# What a run directory holds (RunDir.new --overwrite deletes these, and fbrl's own temporaries, and nothing else:
# another file there, hidden or not, is the user's).
RUN_FILES = tuple(
    "config.yaml metrics.jsonl checkpoints weights plots wandb tensorboard policy policy_adapter base_model eval "
    "summary.md summary.json".split()
)


log = logging.getLogger(__name__)


class RunDirError(InputError):
    """The run directory cannot be used as asked; the message says why and what to do."""


LOCK_FILE = ".lock"
_LOCKS: dict[Path, int] = {}  # run directories this process holds (a descriptor each, open for the process's life)


def lock_run_dir(path: str | Path) -> None:
    """Hold RUN_DIR/.lock for the rest of this process (flock: the kernel releases it when the process ends, so a
    crash never leaves a stale lock). A second driver on the same directory (a requeue while the old one shuts
    down, a duplicate --resume) is refused naming the holder, before it deletes or appends anything."""
    import fcntl
    import socket

    p = Path(path).resolve()
    if p in _LOCKS:
        return
    p.mkdir(parents=True, exist_ok=True)
    fd = os.open(p / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise RunDirError(
            f"train.run_dir={path} is in use by {holder}: wait for that job to end, or choose another run_dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"fbrl train (pid {os.getpid()} on {socket.gethostname()})\n".encode(), 0)
    _LOCKS[p] = fd


RUNS_ENV = "FBRL_RUNS_DIR"  # where a run without train.run_dir goes inside `ray job submit` (default ~/fbrl-runs)


def in_ray_working_dir(cwd: str | Path) -> bool:
    """Whether `cwd` is Ray's per-session copy of a job's working directory (`ray job submit --working-dir`:
    <ray temp>/session_*/runtime_resources/working_dir_files/_ray_pkg_*), which goes when the cluster restarts."""
    parts = Path(cwd).resolve().parts
    return "runtime_resources" in parts and "working_dir_files" in parts


def durable_run_dir(run_dir: str | None, cwd: str | Path, env=os.environ) -> str | None:
    """`train.run_dir` as a job may use it. Outside Ray's working-dir copy: unchanged. Inside it (a submitted job):
    an absolute path stays; none becomes `$FBRL_RUNS_DIR/<time>` (default `~/fbrl-runs/<time>`, on the driver's
    node); a relative one is refused (RunDirError naming the key), as it would land in the copy."""
    if not in_ray_working_dir(cwd) or (run_dir and Path(run_dir).is_absolute()):
        return run_dir
    if run_dir:
        raise RunDirError(
            f"train.run_dir={run_dir} is relative, and this job runs in Ray's copy of its working "
            f"directory ({Path(cwd).resolve()}), which Ray deletes when the cluster restarts: give an "
            f"absolute path on storage that lasts (shared by the nodes for rollout.weight_sync: file), or "
            f"leave it unset for ${RUNS_ENV}/<time> (default ~/fbrl-runs/<time>)"
        )
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return str((Path(env.get(RUNS_ENV) or Path.home() / "fbrl-runs")).expanduser().absolute() / stamp)


class RunDir(Checkpoints):
    def __init__(self, path: str | None):
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        # absolute: the checkpoint and weight paths derived from it reach learner ranks and engines on other nodes
        # (and in other working directories), where a relative path would name another place
        self.path = Path(path or f"runs/{stamp}").absolute()
        self.ckpt_root = self.path / "checkpoints"
        self.ckpt_root.mkdir(parents=True, exist_ok=True)
        # half-written checkpoints and exports of a crashed driver, and what replace_dir left between its renames
        for line in sweep_leftovers(self.path) + sweep_leftovers(self.ckpt_root):
            log.info("run directory: %s", line)

    @classmethod
    def new(cls, path: str | None, overwrite: bool = False) -> RunDir:
        """The directory of a new run. One that holds anything is refused (its metrics would be appended to and
        its checkpoints overwritten), unless `overwrite` and it is an earlier run, whose files are deleted."""
        if path is not None and Path(path).exists():
            p = Path(path)
            if not p.is_dir():
                raise RunDirError(f"train.run_dir={path} is a file, not a directory")
            held = sorted(x.name for x in p.iterdir() if x.name != LOCK_FILE)
            if held and not overwrite:
                raise RunDirError(
                    f"train.run_dir={path} is not empty ({', '.join(held[:6])}{', ...' if len(held) > 6 else ''}): "
                    f"continue that run with `fbrl train --resume {path}`, choose another run_dir, or pass "
                    f"--overwrite to replace it"
                )
            lock_run_dir(p)  # before anything of an earlier run is deleted: it may still be running
            if held:
                strangers = [n for n in held if n not in RUN_FILES and not n.startswith(".")]
                if strangers or not (p / "config.yaml").exists():
                    raise RunDirError(
                        f"--overwrite: {path} does not look like an fbrl run directory (it holds "
                        f"{', '.join(strangers or held)}); nothing was deleted"
                    )
                for name in held:  # the user's own hidden files (.git, .env) stay
                    if name not in RUN_FILES and not atomic_files.is_temporary(name):
                        continue
                    if (p / name).is_dir() and not (p / name).is_symlink():
                        shutil.rmtree(p / name)
                    else:
                        (p / name).unlink()
        run = cls(path)
        lock_run_dir(run.path)
        return run

    @classmethod
    def existing(cls, path: str) -> RunDir:
        """The directory of a run to resume: it must hold config.yaml and a complete checkpoint. Nothing is
        created when it does not."""
        p = Path(path)
        if not p.is_dir():
            raise RunDirError(f"--resume {path}: no such run directory")
        if not (p / "config.yaml").is_file():
            raise RunDirError(f"--resume {path}: not an fbrl run directory (no config.yaml)")
        lock_run_dir(p)  # before reading its checkpoints: another driver may be writing one
        if not (p / "checkpoints").is_dir() or cls(path).latest_checkpoint() is None:
            raise RunDirError(
                f"--resume {path}: the run has no complete checkpoint yet (checkpoints/latest); "
                f"start it again as a new run (--overwrite)"
            )
        return cls(path)

    # ---- config ----------------------------------------------------------------------------------------
    def write_config(self, cfg: Config) -> None:
        write_text(self.path / "config.yaml", yaml_dump(redacted(cfg.to_dict())))

    def check_resume_config(self, cfg: Config) -> None:
        """Refuse to resume when a field that changes the experiment differs; the error names the field."""
        check_resume(load_config(self.path / "config.yaml"), cfg)

    def check_resume_layout(self, cfg: Config, ranks: int) -> None:
        """Refuse to resume with a learner of `ranks` ranks at `cfg.learner.zero_stage` that cannot load the latest
        checkpoint (rl/train/resume_layout.py): one line naming both sizes and the way on."""
        latest = self.latest_checkpoint()
        problem = latest and layout_problem(load_config(self.path / "config.yaml"), cfg, latest, ranks, self.path)
        if problem:
            raise RunDirError(problem)

    # ---- metrics ---------------------------------------------------------------------------------------
    def log_metrics(self, row: dict) -> None:
        """Append one row in a single write(2) on an O_APPEND descriptor: a crash or a full disk can cut the last
        row short (read_metrics drops it), never interleave two."""
        data, path = metrics_line(row).encode(), self.path / "metrics.jsonl"
        with self.full_disk_stops(path):
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                if os.write(fd, data) != len(data):
                    raise OSError(errno.ENOSPC, f"{path}: short write (No space left on device?)")
                os.fsync(fd)  # a step logged is on the disk before its checkpoint is written
            finally:
                os.close(fd)

    def read_metrics(self) -> list[dict]:
        """Every row. A last line cut short (a crash or a full disk during the append) is dropped with a warning:
        that step is logged again after a resume. Any other line that is not JSON is an error naming file:line."""
        p = self.path / "metrics.jsonl"
        if not p.exists():
            return []
        lines = p.read_text(errors="replace").splitlines()
        last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
        rows = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                if i == last:
                    warnings.warn(
                        f"{p}:{i + 1}: the last row is cut short (a crash mid-write); it is ignored", stacklevel=2
                    )
                    continue
                raise RunDirError(f"{p}:{i + 1}: not a JSON row ({e.msg} at column {e.colno})") from None
        return rows

    def truncate_metrics_after(self, step: int) -> None:
        """On resume, drop rows logged after the checkpoint (they will be logged again)."""
        rows = [r for r in self.read_metrics() if r.get("step", 0) <= step]
        write_text(self.path / "metrics.jsonl", "".join(metrics_line(r) for r in rows))

    def write_eval(self, step: int, record: dict) -> Path:
        """RUN_DIR/eval/step_<step>.json: one held-out evaluation's per-problem outcomes
        (`rl.train.heldout.heldout_accuracy`)."""
        path = self.path / "eval" / f"step_{step:06d}.json"
        path.parent.mkdir(exist_ok=True)
        write_text(path, json.dumps(record))
        return path

    def read_evals(self) -> list[dict]:
        """Every evaluation `write_eval` recorded, in step order."""
        return [json.loads(p.read_text()) for p in sorted((self.path / "eval").glob("step_*.json"))]

    # ---- the policy, for the user to take away -------------------------------------------------------------
    def export_policy(
        self,
        weights_file: str | Path,
        model_dir: str | Path,
        tokenizer_dir: str | Path | None = None,
        decode_modes: list[str] | None = None,
    ) -> Path:
        """`RUN_DIR/policy/`: the weights file the learner exported (one safetensors file, named as
        save_pretrained names them) as `model.safetensors`, beside the starting checkpoint's config (with
        `fbt_decode_modes` set to `decode_modes` when given: rl/decode_modes.py), generation config and tokenizer.
        Built in a temporary directory, then swapped in (the old one removed after)."""
        final, tmp = self.path / "policy", self.path / f".policy.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        with self.full_disk_stops(final, remove=tmp):
            build_policy_dir(tmp, weights_file, model_dir, tokenizer_dir, decode_modes)
            fsync_tree(tmp)  # the weights (a hard link to the learner's file) and the config reach the disk
            replace_dir(tmp, final)
            fsync_dir(self.path)
        return final

    # ---- plots -----------------------------------------------------------------------------------------
    def plot(self, title: str | None = None) -> list[Path]:
        """Draw plots/summary.png and one PNG per panel from metrics.jsonl (rl/report/plots.py); returns the paths."""
        from rl.report.plots import render

        return render(self.read_metrics(), self.path / "plots", title)


def weights_file(run: RunDir) -> str:
    """RUN_DIR/weights/policy.safetensors, absolute: learner rank 0 writes it wherever it runs."""
    return str(run.path.absolute() / "weights" / "policy.safetensors")


def restore_step(run: RunDir, cfg: Config, learner, sampler, version: int) -> tuple[int, int]:
    """Continue a run at the step after its last checkpoint with the same data order, RNGs, weights and optimizer:
    (that step, the policy version), or (0, `version`) when there is no checkpoint yet. Metrics rows after the
    checkpoint are dropped (those steps run again and log them again)."""
    run.check_resume_config(cfg)
    step = 0
    if run.latest_checkpoint() is not None or cfg.train.resume:
        state = run.load_checkpoint(learner)
        step, version = state["step"], max(state["version"], version)
        sampler.load_state_dict(state["sampler"])
    run.truncate_metrics_after(step if step else -1)
    return step, version


def save_step(run: RunDir, cfg: Config, learner, step: int, state: dict) -> bool:
    """After step `step`: its checkpoint when due (every `train.checkpoint_every` steps and the last one), and
    RUN_DIR/policy/ (the current weights as a save_pretrained dir; with LoRA also RUN_DIR/policy_adapter/ in
    peft's format) on the same schedule and at the end. True when the step was checkpointed."""
    every = cfg.train.checkpoint_every
    on_schedule = every > 0 and step % every == 0
    checkpointed = every > 0 and (on_schedule or step == cfg.train.steps)
    if checkpointed:
        run.save_checkpoint(step, learner, state, cfg.train.keep_checkpoints, cfg.train.keep_best)
    if step == cfg.train.steps or on_schedule:
        # exported here: only the file transport writes the weights file at every sync
        path = learner.export_weights(weights_file(run))
        if path is not None and not os.path.isfile(path):
            raise not_shared(
                f"learner rank 0 exported the policy's weights to {path}, which this driver (on "
                f"{socket.gethostname()}) cannot see",
                run.path,
                "learner rank 0",
            )
        if path is not None:  # (a learner stand-in in tests may export no file)
            run.export_policy(
                path, cfg.model.path, cfg.model.tokenizer, rl_modes(cfg.model.path, cfg.rollout.decode_mode)
            )
        if cfg.learner.lora is not None:
            learner.export_adapter(str(run.path / "policy_adapter"))
    return checkpointed


def stop_after_step(stop, run: RunDir, learner: LearnerWorkers, step: int, unsaved) -> None:
    """End the job after step `step` (checkpointed now when it was not: `unsaved` is its state)."""
    if isinstance(stop, RunStopped):
        raise stopped_before_step(stop, run, learner, step, unsaved)
    if unsaved is not None:
        run.save_checkpoint(step, learner, unsaved)
    raise RunStopped(
        f"{stop}: stopped after step {step}, which is checkpointed; `fbrl train --resume {run.path}` continues"
    )


def stopped_before_step(stop: RunStopped, run: RunDir, learner: LearnerWorkers, last: int, unsaved) -> RunStopped:
    """A stop raised after step `last` (or before step `last` + 1 had its batch): step `last` checkpointed (when it
    was not: `unsaved` is its state) and the stop said so."""
    if unsaved is not None:
        run.save_checkpoint(last, learner, unsaved)
    where = f"stopped after step {last}, which is checkpointed" if last else "stopped before step 1"
    return RunStopped(f"{stop.reason}; {where}", stop.resumable, stop.exit_code)


def metrics_line(row: dict) -> str:
    """One metrics.jsonl line. A value that is not finite (a NaN loss, an infinite gradient norm) is written as
    null: strict JSON readers (jq, pandas, browsers) refuse NaN and Infinity, and the row's `nonfinite` flag and
    `faults/...` counts already say what happened."""
    clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}
    return json.dumps(clean, sort_keys=True, allow_nan=False) + "\n"
