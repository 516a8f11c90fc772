"""The metric names of metrics.jsonl, defined once, and the step row built from them.

One row per step. Plain names for the step's own figures (`sample_row`, `update_row`), and four namespaced families:
`reward/<metric>` (the rewards' metrics, `rewards/<name>/...` among them), `learner/<metric>`,
`mismatch_parts/<metric>`, `faults/<kind>`. Held-out evaluations add `eval_accuracy_<mode>` (the task's
correctness check) and `eval_lenient_accuracy_<mode>` (the last number in the response), plus the first mode's
pair without a suffix.
"""

from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager

REWARD, LEARNER, MISMATCH_PARTS, FAULTS = "reward/", "learner/", "mismatch_parts/", "faults/"
EVAL_ACCURACY, EVAL_LENIENT = "eval_accuracy", "eval_lenient_accuracy"
# a reward's failure counts inside `RewardWorkers.score` metrics: rewards/<name>/errors, rewards/<name>/timeouts
REWARD_FAILURE_KINDS = ("errors", "timeouts")


def eval_metrics(strict: dict, lenient: dict, first_mode: str) -> dict:
    """The metrics row fields of one held-out evaluation (`rl.train.heldout.heldout_accuracy`)."""
    return {
        **{f"{EVAL_ACCURACY}_{m}": a for m, a in strict.items()},
        **{f"{EVAL_LENIENT}_{m}": a for m, a in lenient.items()},
        EVAL_ACCURACY: strict.get(first_mode),
        EVAL_LENIENT: lenient.get(first_mode),
    }


def by_mode(row: dict, name: str) -> dict:
    """{mode: value} of `<name>_<mode>` fields (EVAL_ACCURACY / EVAL_LENIENT) that hold a value."""
    return {k[len(name) + 1 :]: v for k, v in row.items() if k.startswith(f"{name}_") and v is not None}


def reward_failure_counts(metrics: dict, prefix: str = "") -> dict[str, dict[str, float]]:
    """{reward name: {"errors": n, "timeouts": n}} from `<prefix>rewards/<name>/<errors|timeouts>` fields: the
    rewards' own metrics (prefix "") or a metrics row (prefix REWARD). Non-numeric values are ignored."""
    out: dict[str, dict[str, float]] = {}
    head = f"{prefix}rewards/"
    for key, value in metrics.items():
        if not key.startswith(head) or not isinstance(value, (int, float)):
            continue
        name, _, kind = key[len(head) :].rpartition("/")
        if name and kind in REWARD_FAILURE_KINDS:
            counts = out.setdefault(name, dict.fromkeys(REWARD_FAILURE_KINDS, 0.0))
            counts[kind] += float(value)
    return out


def reward_failures(metrics: dict, prefix: str = "") -> dict[str, float]:
    """{reward name: rows it failed on (errors + timeouts)} (`reward_failure_counts`, summed)."""
    return {name: sum(c.values()) for name, c in reward_failure_counts(metrics, prefix).items()}


def digest(prompts) -> str:
    """A short fingerprint of a step's prompts (resume tests compare them)."""
    return hashlib.sha256("\x00".join(prompts).encode()).hexdigest()[:16]


class PhaseClock:
    """Seconds per phase of one step, in the order the phases ran: `with clock("learner"): ...`, starting from the
    phases timed elsewhere (`PhaseClock(rollout=..., reward=...)`). `times` is update_row's `times`."""

    def __init__(self, **seconds: float):
        self.times = dict(seconds)

    @contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[phase] = self.times.get(phase, 0.0) + time.perf_counter() - t0


def sample_row(step: int, batch, reward, lengths, stale_dropped: int, ages: dict, reward_metrics: dict) -> dict:
    """The sampling half of a step's row of metrics.jsonl: what was sampled and scored (`batch`; `reward` and
    `lengths` as tensors), the stale samples dropped and the ages of those kept, the reward terms."""
    samples = batch.samples
    n = len(samples)
    return {
        "step": step,
        # the oldest version the engines stamped on this step's samples (tests check it against the counter)
        "rollout_policy_version": min((s.policy_version for s in samples), default=None),
        "prompts_digest": digest(r["prompt"] for r in batch.rows),
        "reward_mean": float(reward.mean()) if n else 0.0,
        "accuracy": None if batch.correct is None else sum(batch.correct) / max(len(batch.correct), 1),
        "response_len_mean": float(lengths.mean()) if n else 0.0,
        "truncation_rate": sum(s.truncated for s in samples) / max(n, 1),
        "samples": n,
        "samples_preempted": batch.preempted,
        "samples_stale_dropped": stale_dropped,
        **ages,
        **{f"{REWARD}{k}": v for k, v in reward_metrics.items()},
    }


def update_row(
    version: int, skipped: bool, nonfinite: bool, dropped: int, learner_metrics: dict, parts: dict, times: dict
) -> dict:
    """The update half of a step's row: the policy version after it, whether it was skipped (and why), the groups
    dynamic sampling dropped, the learner's metrics, the mismatch parts, and `times` ({phase: seconds}: rollout,
    reward, wait, mismatch_parts, learner, sync)."""
    return {
        "policy_version": version,
        "skipped": int(skipped),
        "skipped_nonfinite": int(nonfinite),
        "groups_dropped": dropped,
        "logprob_mismatch_abs_mean": learner_metrics.get("mismatch/abs_logp_diff"),
        **{f"time_{phase}_s": t for phase, t in times.items()},
        **{f"{LEARNER}{k}": v for k, v in learner_metrics.items()},
        **{f"{MISMATCH_PARTS}{k}": v for k, v in parts.items()},
    }
