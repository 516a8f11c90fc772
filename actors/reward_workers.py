"""Reward workers: the configured reward set behind the loop's `RewardWorkers` interface.

`RewardHost` builds the `rewards` package's `RewardSet` from `reward.fns` (built-ins `math` / `format`, user
`file.py:fn` / `pkg.mod:fn`, weights) and scores a batch: `score(...) -> rl.train.workers.Scores` — the training reward
per sample (weighted sum), each sample's correctness by the task's check (`reward.accuracy`, never "total reward
> 0"), and the metrics of every reward term on its own. Dataset columns reach the rewards as keyword lists. The
math reward scores in its own process pool with a hard per-item timeout (`reward.num_workers` processes).

The correctness check (`reward.accuracy`, docs/REWARDS.md): "auto" uses the `math` entry of `fns` when there is
one, else runs the math check beside the rewards at weight 0 (it counts in `accuracy`, never in the reward);
"none" turns accuracy off; the name of a `fns` entry uses that entry; any other value is a reward spec run at
weight 0. A sample is correct when the check scores at least 1. On the arithmetic task the built-in `math`
reward is strict unless its options say otherwise: a literal integer answer, no expression (`\\boxed{17*23}`).

On Ray it runs as `RewardActor`: a PLAIN actor — no `max_concurrency`, no async methods — so its methods run on
the actor process's main thread. math-verify's timeouts use `signal.alarm`, which raises in threads, threaded
actors and asyncio actors ("doesn't support threaded environment", docs/DESIGN.md §9). The pool makes the math
reward safe anywhere; a plain actor also keeps user rewards that call math-verify directly working.
Relative reward file paths are resolved against the driver's working directory (`base_dir`), not the actor's.
"""

from __future__ import annotations

import logging
import os
import time

from actors.supervision import actor_class, gather, kill
from rl.data.tasks import TASKS
from rl.train.faults import hang_injected
from rl.train.workers import Scores

log = logging.getLogger(__name__)

ACCURACY_ENTRY = "accuracy"  # name of a correctness check run beside the rewards at weight 0
CORRECT_AT = 1.0 - 1e-9  # a check scores 1 for a right answer; float sums may land a hair below


def reward_entries(rcfg, task: str | None = None) -> list[dict]:
    """`reward.fns` as `rewards.loader.build_reward_set` entries. The math reward's pool gets `reward.num_workers`
    processes, and on the arithmetic task it is strict, unless its options say otherwise."""
    return [_math_options(e, rcfg, task) for e in rcfg.entries()]


def _math_options(entry: dict, rcfg, task: str | None) -> dict:
    if entry.get("fn") == "math":
        entry["options"] = {
            "num_workers": rcfg.num_workers,
            "batch_timeout_s": rcfg.batch_timeout_s,
            **({"strict": True} if task in TASKS and TASKS[task].strict_math else {}),
            **(entry.get("options") or {}),
        }
    return entry


def build_scorer(rcfg, base_dir: str, task: str | None = None, python_fns: dict | None = None):
    """`(reward_set, accuracy_name)`: the rewards of `reward.fns`, plus the correctness check at weight 0 when it
    is not one of them; `accuracy_name` is the entry whose scores say which samples are correct (None: off)."""
    from rewards.base import RewardSet
    from rewards.loader import RewardLoadError, build_reward_set
    from rewards.math import MathReward

    entries = reward_entries(rcfg, task)
    reward_set = build_reward_set(entries, base_dir, rcfg.timeout_s, python_fns=python_fns)
    accuracy = rcfg.accuracy.strip()
    names = [e.name for e in reward_set.entries]
    # an entry is named by its metrics name ("format_reward") or by what `fn` says in the config ("format")
    by_spec = {
        **{e["fn"]: r.name for e, r in zip(reversed(entries), reversed(reward_set.entries))},
        **{n: n for n in names},
    }
    if accuracy == "none":
        return reward_set, None
    if accuracy in by_spec:
        return reward_set, by_spec[accuracy]
    if accuracy == "auto":
        math = [e.name for e in reward_set.entries if isinstance(e.fn, MathReward)]
        if math:
            return reward_set, math[0]
    check = _math_options(
        {"fn": "math" if accuracy == "auto" else accuracy, "weight": 0.0, "name": ACCURACY_ENTRY}, rcfg, task
    )
    try:
        extra = build_reward_set([check], base_dir, rcfg.timeout_s, python_fns=python_fns)
    except RewardLoadError as e:
        raise RewardLoadError(
            f"reward.accuracy: {accuracy!r} is not a reward of reward.fns ({', '.join(names)}), "
            f"'auto' or 'none', and cannot be loaded as a reward: {e}"
        ) from e
    combined = RewardSet(reward_set.entries + extra.entries)
    return combined, combined.entries[-1].name  # "accuracy", or "accuracy_2" beside a user reward so named


class RewardHost:
    """The reward set in this process, and the tool environments of `env` (their worker processes, when set).
    `score` is `RewardWorkers.score`; `step_envs` and `env_stop_strings` serve multi-turn rollouts."""

    def __init__(
        self,
        rcfg,
        base_dir: str | None = None,
        task: str | None = None,
        python_fns: dict | None = None,
        env=None,
    ):
        self.reward_set, self.accuracy_name = build_scorer(rcfg, base_dir or os.getcwd(), task, python_fns)
        self.calls = 0
        self.envs = None
        if env is not None:
            from rewards.env_pool import EnvironmentPool

            self.envs = EnvironmentPool(env.name, env.options, env.num_workers, env.step_timeout_s)

    def env_stop_strings(self) -> tuple[str, ...]:
        return self.envs.stop_strings

    def step_envs(self, envs: list, rows: list[dict], texts: list[str]) -> list:
        """One environment step per episode (rewards/env_pool.py: deadlines, failures counted by kind)."""
        return self.envs.step(envs, rows, texts)

    def score(
        self,
        prompts: list[str],
        completions: list[str],
        answers: list,
        finish_reasons: list[str],
        columns: dict[str, list] | None = None,
    ) -> Scores:
        self.calls += 1
        if hang_injected("SCORE", self.calls):  # fault injection: a reward actor stuck in C (docs/RELIABILITY.md)
            time.sleep(24 * 3600)
        result = self.reward_set(prompts, completions, answers, finish_reasons=list(finish_reasons), **(columns or {}))
        for line in result.errors:  # already counted in result.metrics; surfaced in this process's log too
            log.warning(line)
        correct = None
        if self.accuracy_name is not None:
            correct = [s >= CORRECT_AT for s in result.per_reward[self.accuracy_name]]
        return Scores(
            [float(r) for r in result.rewards], correct, dict(result.metrics), list(result.errors), result.unscored
        )

    def close(self) -> None:
        self.reward_set.close()
        if self.envs is not None:
            self.envs.close()


class RewardWorkersOnRay:
    """`RewardWorkers` over one `RewardActor` handle. With `make_actor()` and a `supervisor`, a reward actor that
    died (its process and its pool gone) is restarted and the batch scored again (actors/supervision.py)."""

    def __init__(self, actor, make_actor=None, supervisor=None):
        self.actor, self.make_actor, self.supervisor = actor, make_actor, supervisor

    def score(self, prompts, completions, answers, finish_reasons, columns=None) -> Scores:
        args = (list(prompts), list(completions), list(answers), list(finish_reasons), columns)

        def on_death(_, error):
            return self.replace(error).score.remote(*args)

        watch = self.supervisor and self.supervisor.watch("score", lambda _: "reward actor", len(completions))
        return gather(lambda _: self.actor.score.remote(*args), 1, on_death, watch=watch)[0]

    def replace(self, error: BaseException, during: str = "score"):
        """A new reward actor for one that died or hung (`error`); raises when it may not be replaced (no supervisor,
        or `faults.max_reward_restarts` used up: `RunStopped`). The old actor is killed first either way, so a hung
        one never outlives the stop."""
        if self.make_actor is None or self.supervisor is None:
            raise error
        kill(self.actor)
        self.supervisor.replacing("reward", "reward actor", during, error)
        self.actor = self.make_actor()
        return self.actor

    def env_stop_strings(self) -> tuple[str, ...]:
        import ray

        return ray.get(self.actor.env_stop_strings.remote())

    def step_envs(self, envs: list, rows: list[dict], texts: list[str]) -> list:
        """An environment step per episode in the reward actor. A replaced actor steps the same environments:
        between steps they are pickles the driver holds."""

        def on_death(_, error):
            return self.replace(error, "step_envs").step_envs.remote(envs, rows, texts)

        watch = self.supervisor and self.supervisor.watch("step_envs", lambda _: "reward actor", len(texts))
        return gather(lambda _: self.actor.step_envs.remote(envs, rows, texts), 1, on_death, watch=watch)[0]

    def pid(self) -> int:
        import ray

        return ray.get(self.actor.pid.remote())

    def close(self) -> None:
        """The rewards' close() in the actor, then the actor ended. A dead actor has nothing left to close; a hung
        one is bounded by the caller (actors/cli/session.py `close_rewards`), which then calls `kill`."""
        import ray
        from ray.exceptions import RayActorError

        try:
            ray.get(self.actor.close.remote())
        except RayActorError:
            pass
        finally:
            kill(self.actor)

    def kill(self) -> None:
        kill(self.actor)


def reward_actor_class():
    """`RewardHost` as a plain Ray actor class (see the module docstring: never threaded, never async); its
    process exits with its node's raylet (actors/supervision.py)."""
    return actor_class(RewardHost)
