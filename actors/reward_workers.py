"""Reward workers: the configured reward set behind the loop's `RewardWorkers` interface.

`RewardHost` builds the `rewards` package's `RewardSet` from `reward.fns` (built-ins `math` / `format`, user
`file.py:fn` / `pkg.mod:fn`, weights) and scores a batch: `score(...) -> (rewards, metrics)`. The math reward
scores in its own process pool with a hard per-item timeout (`reward.num_workers` processes).

On Ray it runs as `RewardActor`: a PLAIN actor — no `max_concurrency`, no async methods — so its methods run on
the actor process's main thread. math-verify's timeouts use `signal.alarm`, which raises in threads, threaded
actors and asyncio actors ("doesn't support threaded environment", shared/DESIGN.md §9). The pool makes the math
reward safe anywhere; a plain actor also keeps user rewards that call math-verify directly working.
Relative reward file paths are resolved against the driver's working directory (`base_dir`), not the actor's.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def reward_entries(rcfg) -> list[dict]:
    """`reward.fns` as `rewards.loader.build_reward_set` entries; the math reward's pool gets
    `reward.num_workers` processes unless its options say otherwise."""
    entries = rcfg.entries()
    for e in entries:
        if e.get("fn") == "math":
            e["options"] = {"num_workers": rcfg.num_workers, **(e.get("options") or {})}
    return entries


class RewardHost:
    """The reward set in this process. `score` is `RewardWorkers.score`."""

    def __init__(self, rcfg, base_dir: str | None = None):
        from rewards.loader import build_reward_set
        self.reward_set = build_reward_set(reward_entries(rcfg), base_dir=base_dir or os.getcwd(),
                                           default_timeout_s=rcfg.timeout_s)

    def score(self, prompts: list[str], completions: list[str], answers: list, finish_reasons: list[str]
              ) -> tuple[list[float], dict[str, float]]:
        result = self.reward_set(prompts, completions, answers, finish_reasons=list(finish_reasons))
        for line in result.errors:  # already counted in result.metrics; surfaced in this process's log too
            log.warning(line)
        return [float(r) for r in result.rewards], dict(result.metrics)

    def close(self) -> None:
        self.reward_set.close()


class RewardWorkersOnRay:
    """`RewardWorkers` over one `RewardActor` handle."""

    def __init__(self, actor):
        self.actor = actor

    def score(self, prompts, completions, answers, finish_reasons) -> tuple[list[float], dict[str, float]]:
        import ray
        return ray.get(self.actor.score.remote(list(prompts), list(completions), list(answers),
                                               list(finish_reasons)))

    def close(self) -> None:
        import ray
        ray.get(self.actor.close.remote())
        ray.kill(self.actor)


def reward_actor_class():
    """`RewardHost` as a plain Ray actor class (see the module docstring: never threaded, never async)."""
    import ray
    return ray.remote(RewardHost)
