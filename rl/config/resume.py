"""Two configs compared field by field (`diff_configs`), and the rule of `fbrl train --resume`: a field that
makes the resumed run a different experiment must not change (`check_resume`)."""

from __future__ import annotations

from typing import Any

from rl.config.schema import Config, ConfigError
from rl.config.serialize import is_under

# Fields whose change makes a resumed run a different experiment (checked by `check_resume`).
RESUME_LOCKED = (
    "model.path",
    "model.init",
    "model.fusion_mode",
    "data",
    "likelihood.estimator",
    "likelihood.passes",
    "rollout.decode_mode",
    "rollout.n_samples_per_prompt",
    "train.seed",
    "train.prompts_per_step",
    "train.max_staleness",
    # (learner.num_workers and learner.zero_stage: checked against what the checkpoint holds, before anything
    # starts, by rl/train/resume_layout.py)
    # the checkpoint's weights and optimizer state are the adapters' (and their shapes the rank's)
    "learner.lora",
)


def diff_configs(a: Config, b: Config, keys: tuple[str, ...] | list[str] | None = None) -> dict[str, tuple[Any, Any]]:
    """{dotted key: (value in a, value in b)} for every differing leaf (only under `keys` if given)."""
    fa, fb = a.flat(), b.flat()
    out = {}
    for k in list(fa) + [k for k in fb if k not in fa]:
        if fa.get(k) != fb.get(k) and (keys is None or any(is_under(k, p) for p in keys)):
            out[k] = (fa.get(k), fb.get(k))
    return out


# Fields that set which weights make which batch when batches are made ahead (`train.max_staleness` >= 1: a batch
# never crosses a checkpoint, rl/train/rollout_queue.py `gate_step`): locked on resume of an asynchronous run only.
RESUME_LOCKED_ASYNC = ("train.checkpoint_every",)


def check_resume(saved: Config, current: Config, locked: tuple[str, ...] = RESUME_LOCKED) -> None:
    """Refuse to resume when a locked field changed; the error names every changed field."""
    if locked is RESUME_LOCKED and max(saved.train.max_staleness, current.train.max_staleness) >= 1:
        locked = RESUME_LOCKED + RESUME_LOCKED_ASYNC
    changed = diff_configs(saved, current, locked)
    if changed:
        lines = "; ".join(f"{k}: {old!r} -> {new!r}" for k, old, new in ((k, *v) for k, v in changed.items()))
        raise ConfigError(f"cannot resume: these fields differ from the saved run's config: {lines}")
