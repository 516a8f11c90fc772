"""The checkpoint-keeping keys of `train`: `keep_best` (the N best checkpoints by a metric are never pruned) and
`save_before` (a wall-clock deadline: the job checkpoints and stops cleanly before it).

`train.save_before` takes a duration from the job's start (`3h30m`, `90m`, `1d2h`, `45s`; NeMo-RL's
`DD:HH:MM:SS` and Slurm's `HH:MM:SS` / `MM:SS`; a bare number is seconds) or an ISO-8601 time with its zone
(`2026-12-05T20:00:00Z`, `2026-12-05T21:00:00+01:00`). `parse_save_before` reads it; a value it cannot read is a
config error naming the key.
"""

from __future__ import annotations

import datetime
import difflib
import re
from dataclasses import dataclass
from typing import Annotated, Literal

from rl.config.bounds import ge

# rl/report/metrics.py's names (the config sits below the report; tests/test_keep_best.py keeps them equal)
EVAL_ACCURACY, EVAL_LENIENT = "eval_accuracy", "eval_lenient_accuracy"
# Plain keys of every training step's row (rl/report/metrics.py `sample_row`, `update_row`) a rank can be taken by.
STEP_METRICS = (
    "reward_mean",
    "accuracy",
    "response_len_mean",
    "truncation_rate",
    "samples",
    "groups_dropped",
    "logprob_mismatch_abs_mean",
    "policy_version",
)
# Families whose members depend on the rewards, the learner and the run: checked when the job runs (a warning
# once when the metric has appeared in no row by the first checkpoint).
METRIC_FAMILIES = ("reward/", "learner/", "mismatch_parts/", "faults/", "time_", "staleness")


@dataclass
class KeepBestConfig:
    """`train.keep_best`: the `n` checkpoints with the best `metric` (a key of metrics.jsonl rows, read in the
    checkpointed step's own row) are never deleted by `train.keep_checkpoints`."""

    metric: str = "eval_accuracy"
    n: Annotated[int, ge(1)] = 1
    mode: Literal["max", "min"] = "max"  # max: higher is better


def keep_best_problem(metric: str, eval_every: int, eval_modes: list[str]) -> str | None:
    """Why `train.keep_best.metric` can never appear in a metrics row, when that is known from the config (the
    message for `train.keep_best.metric`); None when it can appear or only the job can tell."""
    evals = (EVAL_ACCURACY, EVAL_LENIENT)
    for name in evals:
        if metric == name or metric.startswith(f"{name}_"):
            mode = metric[len(name) + 1 :]
            if eval_every == 0:
                return f"{metric!r} is logged by held-out evals, and train.eval_every is 0 (off)"
            if mode and mode not in eval_modes:
                return f"{metric!r}: {mode!r} is not one of train.eval_decode_modes {eval_modes}"
            return None
    if metric in STEP_METRICS or metric.startswith(METRIC_FAMILIES):
        return None
    close = difflib.get_close_matches(metric, STEP_METRICS + evals, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"{metric!r} is not a key of metrics.jsonl rows{hint}: expected one of {', '.join(STEP_METRICS + evals)}, "
        f"{EVAL_ACCURACY}_<decode mode>, or a key under {', '.join(f'{f}...' for f in METRIC_FAMILIES)}"
    )


_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)([dhms]))+")
_CLOCK = re.compile(r"\d+(?::\d+){1,3}")
SAVE_BEFORE_FORMS = (
    "a duration from the job's start (3h30m, 90m, 45s; DD:HH:MM:SS or HH:MM:SS; a number of seconds) or an "
    "ISO-8601 time with its zone (2026-12-05T20:00:00Z)"
)


@dataclass(frozen=True)
class SaveBefore:
    """A parsed `train.save_before`: `seconds` after the job's start, or an absolute time `at`."""

    seconds: float | None = None
    at: datetime.datetime | None = None

    def deadline(self, started_at: float) -> float:
        """The deadline as a Unix time, for a job that started at `started_at` (Unix time)."""
        return self.at.timestamp() if self.at is not None else started_at + self.seconds


def parse_save_before(value: str | int) -> SaveBefore:
    """`train.save_before` as a `SaveBefore`; ValueError with what is wrong (the caller names the key)."""
    if isinstance(value, int):
        seconds = float(value)
    elif _CLOCK.fullmatch(value.strip()):  # [[DD:]HH:]MM:SS, read from the right
        parts = [int(p) for p in reversed(value.strip().split(":"))]
        seconds = float(sum(p * f for p, f in zip(parts, (1, 60, 3600, 86400))))
    elif _DURATION.fullmatch(value.strip().lower()):
        pairs = re.findall(r"(\d+(?:\.\d+)?)([dhms])", value.strip().lower())
        seconds = sum(float(n) * _UNITS[u] for n, u in pairs)
    else:
        return SaveBefore(at=_absolute_time(value))
    if seconds <= 0:
        raise ValueError(f"expected a duration > 0, got {value!r}")
    return SaveBefore(seconds=seconds)


def _absolute_time(value: str) -> datetime.datetime:
    try:
        at = datetime.datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(f"expected {SAVE_BEFORE_FORMS}, got {value!r}") from None
    if at.tzinfo is None:
        raise ValueError(
            f"{value!r} has no time zone (the driver's clock and the scheduler's may differ): add one, e.g. "
            f"{at.isoformat()}Z for UTC or {at.isoformat()}+01:00"
        )
    return at


def save_before_problem(value: str | int | None) -> str | None:
    """The message for a `train.save_before` that cannot be read; None for a good one (or null)."""
    if value is None:
        return None
    try:
        parse_save_before(value)
    except ValueError as e:
        return str(e)
    return None
