"""What a user sees of `fbrl train` on the console: third-party output quieted, clean text in files, the progress
bar, and the end-of-run summary.

- Quiet by default (`logging.verbose: false`; `fbrl train --verbose` turns it off): vLLM, Ray, DeepSpeed, wandb and
  transformers log at WARNING and above, their progress bars are off, wandb prints nothing, Ray does not forward
  its workers' output to the driver (`log_to_driver`, actors/placement.py) — it stays in Ray's log directory,
  which the summary names — and known-harmless vLLM warnings of fbrl's token-in/token-out engine are dropped
  (`VLLM_NOISE`). The environment part (`QUIET_ENV`) also reaches Ray workers through their runtime_env.
- Files get no terminal codes: when stdout / stderr is not a terminal, ANSI escape sequences are stripped from
  whatever this process writes there, and the progress bar is off (it would write carriage returns).
- The summary (`summary_lines`) reads the run directory, so it says what is on disk: steps trained and skipped,
  wall time, held-out accuracy first → last per decode mode, reward failures and fault counters when there were
  any, and the paths of the trained policy, metrics, plots, wandb run and worker logs.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

from rl.report.metrics import EVAL_ACCURACY, FAULTS, REWARD, reward_failure_counts

# Environment read by the libraries at import or process start; set (unless already set) in the driver and in
# every Ray worker when not verbose.
QUIET_ENV = {
    "VLLM_LOGGING_LEVEL": "WARNING",
    "TRANSFORMERS_VERBOSITY": "warning",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' "Loading weights" / "Writing model shards" bars
    "WANDB_SILENT": "true",
    "RAY_DEDUP_LOGS": "1",
}
QUIET_LOGGERS = (
    "vllm",
    "ray",
    "DeepSpeed",
    "deepspeed",
    "wandb",
    "transformers",
    "torch.distributed",
    "filelock",
    "urllib3",
    "matplotlib",
    "PIL",
)
# fbrl's own per-call warnings that the loop already prints once per kind (rl/report/step_lines.py `report_failures`); in-process
# (--no-ray) they would repeat every step. On Ray they stay in the reward worker's log.
REPORTED_BY_THE_LOOP = ("rewards.base", "actors.reward_workers")
# vLLM warnings that every fbrl engine triggers and that ask nothing of the user (substring → why it is harmless).
VLLM_NOISE = {
    "Chat template warmup failed": "the engine takes token ids (skip_tokenizer_init): no chat template to warm up",
    "Using None for EOS token id": "fbrl passes stop_token_ids itself",
    "doesn't allow to use `torch.set_num_threads`": "CPU thread binding, set once by vLLM",
    "is not found in LD_PRELOAD": "a CPU performance hint (tcmalloc / iomp)",
    "The global random seed is set to": "fbrl seeds every request",
    "does not officially support disabling chunked prefill": "fbrl turns chunked prefill off on purpose (§8)",
}

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


class _PlainText:
    """A text stream that drops terminal escape sequences (for a stream that is not a terminal)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(strip_ansi(text))
        return len(text)

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(self._stream, name)


def plain_text_streams() -> None:
    """Strip ANSI codes from this process's stdout / stderr where they are not terminals."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, _PlainText) and not _isatty(stream):
            setattr(sys, name, _PlainText(stream))


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class _DropKnownNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not any(s in msg for s in VLLM_NOISE)


def quiet_third_party(verbose: bool) -> None:
    """Before the libraries are imported: their environment switches; after: logger levels (both idempotent)."""
    if verbose:
        return
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in REPORTED_BY_THE_LOOP:
        logging.getLogger(name).setLevel(logging.ERROR)
    drop_vllm_noise()


def drop_vllm_noise() -> None:
    """Filter `VLLM_NOISE` out of what reaches the console: the handlers of vLLM's logger (vLLM's loggers do not
    propagate when vLLM configures them) and of the root logger, and Python's last-resort handler (used when nobody
    configured any). Call it after `import vllm`, before an engine is built (actors/rollout_fleet.py)."""
    if "vllm" not in sys.modules:
        return
    for handler in [*logging.getLogger("vllm").handlers, *logging.getLogger().handlers, logging.lastResort]:
        if handler is not None and not any(isinstance(f, _DropKnownNoise) for f in handler.filters):
            handler.addFilter(_DropKnownNoise())


def progress_bar(total: int, enabled: bool, initial: int = 0):
    """A tqdm bar on stderr when it is a terminal and `logging.progress` is on; else None. Lines logged through
    `bar.write` print above it, so the bar stays on its own line."""
    if not enabled or not _isatty(sys.stderr):
        return None
    from tqdm import tqdm

    return tqdm(
        total=total, initial=initial, desc="fbrl train", unit="step", file=sys.stderr, dynamic_ncols=True, leave=False
    )


# ------------------------------------------------------------------------------------------------ summary


def _minutes(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def policy_path(run_dir) -> Path | None:
    """The trained policy as a loadable directory: RUN_DIR/policy when the run exports one, else the newest
    checkpoint's model (save_pretrained + tokenizer), else None."""
    if (run_dir.path / "policy" / "config.json").is_file():
        return run_dir.path / "policy"
    latest = run_dir.latest_checkpoint()
    if latest is not None:
        found = sorted(p.parent for p in (latest / "learner").glob("*/config.json"))
        if found:
            return found[0]
    return None


def _failures(rows: list[dict]) -> dict[str, dict[str, float]]:
    """{reward name: {"errors": n, "timeouts": n}} summed over the run, only where non-zero."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        for name, counts in reward_failure_counts(r, prefix=REWARD).items():
            total = out.setdefault(name, dict.fromkeys(counts, 0.0))
            for kind, n in counts.items():
                total[kind] += n
    return {name: counts for name, counts in out.items() if any(counts.values())}


def summary_lines(
    run_dir, cfg, wall_s: float, plots: list[Path], wandb_dir: str | None = None, worker_logs: str | None = None
) -> list[str]:
    rows = run_dir.read_metrics()
    steps = [r for r in rows if r.get("step", 0) > 0]
    skipped = sum(1 for r in steps if r.get("skipped"))
    nonfinite = sum(1 for r in steps if r.get("skipped_nonfinite"))
    why = f": {skipped - nonfinite} without reward signal, {nonfinite} with a non-finite loss" if nonfinite else ""
    lines = [f"done: {len(steps)} steps in {_minutes(wall_s)} ({len(steps) - skipped} trained, {skipped} skipped{why})"]
    modes = [
        k[len(EVAL_ACCURACY) + 1 :]
        for k in dict.fromkeys(k for r in rows for k in r)
        if k.startswith(f"{EVAL_ACCURACY}_")
    ]
    for mode in modes:
        evals = [r for r in rows if r.get(f"{EVAL_ACCURACY}_{mode}") is not None]
        if len(evals) >= 2:
            a, b = evals[0], evals[-1]
            x, y = a[f"{EVAL_ACCURACY}_{mode}"], b[f"{EVAL_ACCURACY}_{mode}"]
            lines.append(
                f"held-out greedy accuracy ({mode}, {cfg.train.eval_n} problems): {x:.3f} at step "
                f"{a['step']} -> {y:.3f} at step {b['step']} ({100 * (y - x):+.1f} points)"
            )
    train_acc = [r for r in steps if r.get("accuracy") is not None]
    if len(train_acc) >= 2 and not any(
        len([r for r in rows if r.get(f"{EVAL_ACCURACY}_{m}") is not None]) >= 2 for m in modes
    ):
        a, b = train_acc[0], train_acc[-1]
        lines.append(
            f"accuracy on training samples: {a['accuracy']:.3f} at step {a['step']} -> "
            f"{b['accuracy']:.3f} at step {b['step']}"
        )
    failures = _failures(steps)
    if failures:
        lines.append(
            "reward failures (samples scored 0): "
            + ", ".join(
                f"{name}: {int(v['errors'])} errors, {int(v['timeouts'])} timeouts" for name, v in failures.items()
            )
        )
    last = rows[-1] if rows else {}
    faults = {k[len(FAULTS) :]: v for k, v in last.items() if k.startswith(FAULTS) and v}
    if faults:
        lines.append("faults: " + ", ".join(f"{k} {v:g}" for k, v in faults.items()))
    policy = policy_path(run_dir)
    width = 8
    if policy is not None:
        lines.append(f"{'policy:':<{width}} {policy}")
    elif (run_dir.path / "weights" / "policy.safetensors").is_file():
        lines.append(
            f"{'policy:':<{width}} {run_dir.path / 'weights' / 'policy.safetensors'} (weights only: "
            f"train.checkpoint_every=0 wrote no checkpoint)"
        )
    lines.append(f"{'metrics:':<{width}} {run_dir.path / 'metrics.jsonl'}")
    if plots:
        lines.append(
            f"{'plots:':<{width}} {plots[0]}" + (f" (+{len(plots) - 1} panels beside it)" if len(plots) > 1 else "")
        )
    if wandb_dir:
        lines.append(
            f"{'wandb:':<{width}} {wandb_dir} (offline: `wandb sync` uploads it)"
            if cfg.logging.wandb_mode == "offline"
            else f"{'wandb:':<{width}} {wandb_dir}"
        )
    if worker_logs:
        lines.append(f"{'logs:':<{width}} {worker_logs} (Ray workers' output; --verbose prints it here)")
    return lines
