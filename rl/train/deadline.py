"""`train.save_before`: stop cleanly before a wall-clock deadline (a scheduler's time limit).

After each step the loop asks `Deadline.stop` whether one more step and its checkpoint would likely end past the
deadline: the estimate is the longest of the last few steps (each timed from its start to the end of its
checkpoint, when it had one) plus the last checkpoint's time (before any, one more step's worth). When they would,
the step just finished is checkpointed and the job ends with exit code 0 and a line saying why; `fbrl train
--resume RUN_DIR` continues it.
"""

from __future__ import annotations

import collections
import datetime
import time
from collections.abc import Callable

from rl.config.checkpointing import parse_save_before
from rl.train.faults import RunStopped

RECENT_STEPS = 5  # steps whose times make the estimate


class Deadline:
    def __init__(self, value: str | int, at: float, clock: Callable[[], float] | None = None):
        self.value, self.at, self.clock = value, at, clock or (lambda: time.time())
        self.steps: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)
        self.save_s: float | None = None  # the last checkpoint's seconds

    @classmethod
    def of(cls, value: str | int | None, started_at: float, clock: Callable[[], float] | None = None):
        """The deadline of `train.save_before` for a job that started at `started_at` (Unix time); None without."""
        return None if value is None else cls(value, parse_save_before(value).deadline(started_at), clock)

    def step_done(self, seconds: float, save_seconds: float | None) -> None:
        """One step took `seconds` (its checkpoint included); its checkpoint alone `save_seconds` (None: none)."""
        self.steps.append(seconds)
        if save_seconds is not None:
            self.save_s = save_seconds

    def estimate(self) -> float:
        """Seconds one more step and its checkpoint would likely take."""
        step = max(self.steps, default=0.0)
        return step + (self.save_s if self.save_s is not None else step)

    def stop(self, step: int, run_path) -> RunStopped | None:
        """The stop (exit 0, resumable) when one more step would likely end past the deadline, else None."""
        now, need = self.clock(), self.estimate()
        if not self.steps or now + need <= self.at:
            return None
        when = datetime.datetime.fromtimestamp(self.at, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        save = f"{self.save_s:.0f} s" if self.save_s is not None else "not timed yet, counted as a step"
        return RunStopped(
            f"train.save_before={self.value} ({when}, {max(self.at - now, 0):.0f} s left): step {step + 1} would "
            f"likely end past it (recent steps up to {max(self.steps):.0f} s, a checkpoint {save}); "
            f"`fbrl train --resume {run_path}` continues",
            resumable=True,
            exit_code=0,
        )


def deadline_problem(value: str | int | None, now: float) -> str | None:
    """The message for a `train.save_before` time that has already passed at the job's start (a duration never
    has); None otherwise."""
    if value is None:
        return None
    at = parse_save_before(value).at
    if at is None or at.timestamp() > now:
        return None
    stamp = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        f"{value} has already passed (now {stamp}): give a later time, a duration from the job's start (3h30m), or null; a resumed run "
        f"keeps its own config's value unless you override it (train.save_before=...)"
    )
