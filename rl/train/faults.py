"""Faults a job survives, counted; the rules that stop a job rather than let it run on silently.

Owns:
- `FaultLog`: one counter per kind of fault or recovery, reported as `faults/<kind>` in every step's metrics,
  and one log line per event. The worker objects (actors/supervision.py) and the loop record into the same log.
- `RunGuard`: the stop rules, checked after every step — loss or gradients non-finite (the step is skipped) in
  `faults.max_nonfinite_steps` steps in a row; no reward signal (every advantage 0) in `faults.max_no_signal_steps`
  steps in a row; one reward erroring or timing out on more than
  `faults.reward_error_share` of the rows in `faults.reward_error_steps` steps in a row.
- The exceptions that cross from workers to the loop and from the loop to the launcher: `LearnerRebuilt` (a
  learner rank died and the group was rebuilt at its initial weights: the loop restores the last checkpoint and
  runs the lost steps again) and `RunStopped` (a clear stop: the reason, whether `--resume` continues, and the
  process exit code).
The end-of-run summary that reports them is actors/console.py `summary_lines`.
"""

from __future__ import annotations

import math
import os
from collections import Counter

from rl.report.metrics import reward_failures

# Process exit codes of `fbrl train` (documented in docs/RELIABILITY.md).
EXIT_BAD_INPUT = 2  # a config, data, reward or checkpoint problem found before anything started
EXIT_STOPPED = 3  # a stop rule fired, a restart bound was reached, or the run trained nothing
EXIT_SIGNAL_BASE = 128  # SIGTERM / SIGINT: 128 + the signal number, after checkpointing the last step


class RunStopped(RuntimeError):
    """The job stops here on purpose. `str(e)` says why and how to continue."""

    def __init__(self, reason: str, resumable: bool = True, exit_code: int = EXIT_STOPPED):
        super().__init__(reason)
        self.reason, self.resumable, self.exit_code = reason, resumable, exit_code


class LearnerRebuilt(RuntimeError):
    """Raised by a `LearnerWorkers` method when a rank died and the group was rebuilt: it holds the initial
    weights, not the trained ones, until the caller restores a checkpoint."""


class FaultLog:
    """Counts of faults and recoveries (`faults/<kind>`), one log line each."""

    def __init__(self, log=print):
        self.log = log
        self.counts: Counter[str] = Counter()

    def record(self, kind: str, message: str, n: int = 1) -> None:
        self.counts[kind] += n
        self.log(f"fault: {message}")

    def add(self, kind: str, n: int = 1) -> None:
        """Count without a log line (the caller logs one line for a whole batch of them)."""
        self.counts[kind] += n

    def metrics(self) -> dict[str, float]:
        return {f"faults/{k}": float(v) for k, v in sorted(self.counts.items())}


class RunGuard:
    """The stop rules of `faults` (rl.config.FaultsConfig), fed one finished step at a time."""

    def __init__(self, fcfg, faults: FaultLog):
        self.cfg, self.faults = fcfg, faults
        self.nonfinite_run: list[int] = []  # the current run of steps with non-finite loss / gradients
        self.partly_run: list[int] = []  # those of them skipped only in part
        self.no_signal_run: list[int] = []  # the current run of steps the learner skipped for want of signal
        self.reward_runs: dict[str, list[int]] = {}  # per reward, the current run of steps over the error share

    def check(
        self, step: int, nonfinite: bool | None, reward_metrics: dict[str, float], rows: int, partly: bool = False
    ) -> None:
        """Count this step's faults; raise `RunStopped` when a rule's bound is reached. `nonfinite` is None for a
        step the learner did not run (no reward signal): it neither extends nor ends a run of non-finite steps.
        `partly`: some of the update's optimizer steps were not finite and skipped, the others applied — it
        extends a run of non-finite steps too, so a job whose every update is partly non-finite stops."""
        if nonfinite:
            self.nonfinite_run.append(step)
            self.faults.record(
                "nonfinite_steps",
                f"step {step}: loss or gradients not finite; optimizer step "
                f"skipped ({len(self.nonfinite_run)} in a row)",
            )
        elif partly:
            self.nonfinite_run.append(step)
            self.partly_run.append(step)
        elif nonfinite is not None:
            self.nonfinite_run, self.partly_run = [], []
        if len(self.nonfinite_run) >= self.cfg.max_nonfinite_steps:
            first, last = self.nonfinite_run[0], self.nonfinite_run[-1]
            weights = (
                f"every one was skipped, so the weights are those before step {first}"
                if not self.partly_run
                else f"steps {', '.join(map(str, self.partly_run))} were skipped only in part (their other "
                f"optimizer steps applied), the others whole"
            )
            raise RunStopped(
                f"loss or gradients were not finite in {len(self.nonfinite_run)} steps in a row (steps "
                f"{first}-{last}; faults.max_nonfinite_steps={self.cfg.max_nonfinite_steps}); {weights}. "
                f"Lower learner.lr, check the rewards' scale, or look for a bad batch"
            )
        self.no_signal_run = self.no_signal_run + [step] if nonfinite is None else []
        bound = self.cfg.max_no_signal_steps
        if bound and len(self.no_signal_run) >= bound:
            raise RunStopped(
                f"no reward signal in {len(self.no_signal_run)} steps in a row (steps {self.no_signal_run[0]}-"
                f"{step}; faults.max_no_signal_steps={bound}): in every prompt group the rewards were equal, so "
                f"every advantage was 0 and nothing trained. Look at a few scored completions (`fbrl eval`), "
                f"raise rollout.n_samples_per_prompt or rollout.temperature, or choose prompts the policy "
                f"sometimes solves"
            )
        failures = reward_failures(reward_metrics)
        for name in sorted(set(failures) | set(self.reward_runs)):  # a reward absent from this step failed nowhere
            share = failures.get(name, 0.0) / rows if rows else 0.0
            run = self.reward_runs.setdefault(name, [])
            if share > self.cfg.reward_error_share:
                run.append(step)
            else:
                run.clear()
            if len(run) >= self.cfg.reward_error_steps:
                raise RunStopped(
                    f"reward {name!r} failed (raised, timed out or returned a non-finite or absurd score) on "
                    f"{share:.0%} of the rows at step {step}, and on more than {self.cfg.reward_error_share:.0%} "
                    f"of the rows in each of the {len(run)} steps {run[0]}-{run[-1]} "
                    f"(faults.reward_error_share, faults.reward_error_steps); its errors are in the log above. "
                    f"Fix it and continue with `fbrl train --resume RUN_DIR`"
                )


def is_nonfinite(learner_metrics: dict) -> bool:
    """The learner skipped an optimizer step because its loss or gradient norm was not finite."""
    if learner_metrics.get("nonfinite_steps", 0) > 0:
        return True
    norm = learner_metrics.get("grad_norm")
    return norm is not None and not math.isfinite(norm)


def partly_applied(learner_metrics: dict) -> bool:
    """A non-finite update whose earlier optimizer steps were applied (`algo.mini_batches` or `algo.ppo_epochs`
    > 1): the weights moved, so the step counts as a new policy version (synced and tagged) although one of its
    optimizer steps was skipped."""
    steps, skipped = learner_metrics.get("optimizer_steps", 0), learner_metrics.get("nonfinite_steps", 0)
    return is_nonfinite(learner_metrics) and steps > skipped


def nonfinite_update(learner_metrics: dict, step: int, faults: FaultLog) -> bool:
    """The update was not finite and changed nothing. Some of its optimizer steps applied (mini_batches /
    ppo_epochs > 1): the weights moved, so it is a new version like any update (synced, tagged), counted."""
    if partly_applied(learner_metrics):
        faults.record(
            "partly_nonfinite_steps",
            f"step {step}: loss or gradients not finite in "
            f"{learner_metrics['nonfinite_steps']:.0f} of {learner_metrics['optimizer_steps']:.0f} "
            f"optimizer steps; those skipped, the others applied: the weights are a new version",
        )
        return False
    return is_nonfinite(learner_metrics)


def injected(name: str) -> set[int]:
    """Fault injection for tests and the soak benchmark: `FBRL_INJECT_<name>=2,5` names the calls (1-based) of a
    worker method that fail on purpose (the workers say which). Empty unless the variable is set."""
    text = os.environ.get(f"FBRL_INJECT_{name}", "")
    return {int(x) for x in text.replace(" ", "").split(",") if x}


def hang_injected(name: str, call: int) -> bool:
    """Fault injection: `FBRL_INJECT_HANG_<name>=N:PATH` makes the N-th call (1-based) of a worker method hang
    while its process stays alive, once per job: the first process to get there creates PATH and hangs; a
    replacement, which counts its calls anew, finds PATH and does not. False unless the variable is set."""
    n, _, marker = os.environ.get(f"FBRL_INJECT_HANG_{name}", "").partition(":")
    if not n or call != int(n):
        return False
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
