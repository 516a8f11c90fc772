"""Config fields of off-policy training, mixed into their sections in schema.py: the off-policy
correction of `algo` (`algo.tis_*`) and asynchronous training with its mismatch diagnostics (`train.max_staleness`,
`train.mismatch_parts_frac`). Kept apart so schema.py stays one screenful per section; the keys are the sections'
own (a mixin's fields come first in its section when dumped)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from rl.config.bounds import ge, within


@dataclass
class OffPolicyCorrection:
    """`algo.tis_*`. Off-policy correction of the learner/engine ratio r = pi_learner / pi_engine (the engine's
    log-prob of the sampling version is the denominator; rl/algos/mismatch.py): truncate (TIS, w = min(r, tis_cap);
    on when tis_cap is set), mask (w = 1 inside tis_bounds, 0 outside), mis (masked IS, w = r inside tis_bounds,
    0 outside: IcePop at token level, seq-MIS at sequence level). Levels: token, sequence (r = prod r_t),
    geometric (exp(mean log r_t)).

    `tis_cap: auto` (the default): truncate at AUTO_TIS_CAP when samples can be stale (`train.max_staleness` >= 1),
    off when they cannot; `load_config` resolves it (`resolve_auto_correction`), so config.yaml holds the number or
    null in force. null: off whatever the staleness."""

    tis_cap: float | Literal["auto"] | None = "auto"
    tis_mode: Literal["truncate", "mask", "mis"] = "truncate"
    tis_level: Literal["token", "sequence", "geometric"] = "token"
    tis_bounds: tuple[float, float] = (0.5, 2.0)

    def validate_correction(self):
        if not 0 <= self.tis_bounds[0] < self.tis_bounds[1]:
            yield "tis_bounds", f"expected [low, high] with 0 <= low < high, got {list(self.tis_bounds)}"
        if self.tis_cap not in (None, "auto") and self.tis_cap <= 0:
            yield "tis_cap", f"must be > 0 or null, got {self.tis_cap}"


# The truncation cap `tis_cap: auto` means once samples can be stale: verl's rollout correction defaults to a token
# TIS threshold of 2.0, and so do other GRPO stacks (docs/ARCHITECTURE.md compares it with AReaL's decoupled PPO).
AUTO_TIS_CAP = 2.0


def resolve_auto_correction(cfg) -> None:
    """`algo.tis_cap: auto` made concrete from `train.max_staleness` (in place)."""
    if cfg.algo.tis_cap == "auto":
        cfg.algo.tis_cap = AUTO_TIS_CAP if cfg.train.max_staleness >= 1 else None


@dataclass
class AsyncTraining:
    """`train.max_staleness`, `train.mismatch_parts_frac`, `train.mismatch_parts_max_tokens`."""

    # Asynchronous training (rl/train/rollout_queue.py): the engines generate the next batches while the learner trains;
    # a sample made by policy version v is trained while the learner holds v..v+s and never later. 0: synchronous.
    max_staleness: Annotated[int, ge(0, "(0: synchronous)")] = 0
    # Share of each step's rows on which the mismatch is taken apart (engine / staleness / estimator, exact
    # log-probs: rl/estimators/mismatch_parts.py); keeps a CPU copy of the last max_staleness + 1 versions' weights.
    # 0: off.
    mismatch_parts_frac: Annotated[float, within(0, 1)] = 0.0625
    # ... and at most this many response tokens of them (the exact recurrences cost per token; 0: no budget)
    mismatch_parts_max_tokens: Annotated[int, ge(0, "(0: no budget)")] = 1024
