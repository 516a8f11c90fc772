"""rewards.env_pool — tool environments run in worker processes with hard deadlines (docs/TOOLS.md).

An environment is user code the policy drives: it may raise, hang, or answer with junk. `EnvironmentPool` runs
every `reset` + `step` in rewards/pool.py's process pool (outside the engine's process and the driver's), so a
step past `timeout_s` is killed and a crash takes only its worker. An episode whose environment fails ends there
(no observation, reward 0), and the failure is counted by kind (`env/errors`, `env/timeouts`, `env/crashes`,
`env/junk`), as a failing reward is. Between steps an environment travels as its pickle: it holds no open
resources, only plain state.
"""

from __future__ import annotations

import math
import numbers
import os
import pickle
from dataclasses import dataclass

from rewards.environments import StepResult, load_environment
from rewards.pool import CRASH, ERROR, OK, TIMEOUT, RewardPool

FAILURE_KINDS = {ERROR: "errors", TIMEOUT: "timeouts", CRASH: "crashes", "junk": "junk"}


@dataclass
class EnvOutcome:
    """One episode's step: the environment after it (pickled; None once the episode is over), what it said, and
    why it failed (None: it did not)."""

    env: bytes | None
    observation: str | None
    reward: float
    done: bool
    failure: str | None = None
    kind: str = OK  # ok | error | timeout | crash | junk


_FACTORIES: dict = {}


def _factory(spec: str, options: dict, base_dir: str):
    key = (spec, repr(sorted(options.items())), base_dir)
    if key not in _FACTORIES:
        cwd = os.getcwd()
        os.chdir(base_dir)  # relative `path/file.py:obj` specs resolve as in the driver
        try:
            _FACTORIES[key] = load_environment(spec, options)
        finally:
            os.chdir(cwd)
    return _FACTORIES[key]


def _step(spec: str, options: dict, base_dir: str, env: bytes | None, row: dict, text: str):
    """In a worker: a fresh environment reset on `row` (first turn) or the pickled one, stepped on `text`."""
    factory = _factory(spec, options, base_dir)  # also imports a user file before its objects unpickle
    if env is None:
        obj = factory()
        obj.reset(row)
    else:
        obj = pickle.loads(env)
    result = obj.step(text)
    return pickle.dumps(obj), result


def check_result(result) -> StepResult:
    """A `StepResult`-shaped answer, or ValueError saying what is wrong with it."""
    if isinstance(result, dict):
        result = StepResult(result.get("observation"), result.get("reward", 0.0), result.get("done", False))
    elif isinstance(result, tuple) and len(result) == 3:
        result = StepResult(*result)
    if not isinstance(result, StepResult):
        raise ValueError(f"step returned a {type(result).__name__}, expected StepResult(observation, reward, done)")
    if result.observation is not None and not isinstance(result.observation, str):
        raise ValueError(f"observation is a {type(result.observation).__name__}, expected str or None")
    reward = result.reward
    if hasattr(reward, "item") and getattr(reward, "ndim", 1) == 0:  # a 0-d tensor / array is its number
        reward = reward.item()
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        raise ValueError(f"reward {reward!r} is not a finite number")
    return StepResult(result.observation, float(reward), bool(result.done))


class EnvironmentPool:
    """`env.name` run in `num_workers` processes, `timeout_s` per step (rewards/pool.py's hard deadline)."""

    def __init__(self, spec: str, options: dict | None = None, num_workers: int = 2, timeout_s: float = 10.0):
        self.spec, self.options, self.base_dir = spec, dict(options or {}), os.getcwd()
        # loaded here first: a bad spec is an error at start-up, and the driver reads the stop strings
        self.stop_strings = tuple(getattr(load_environment(spec, self.options)(), "stop_strings", ()) or ())
        self.timeout_s = timeout_s
        self._pool = RewardPool(num_workers, timeout_s, preload=("rewards.env_pool",))

    def step(self, envs: list[bytes | None], rows: list[dict], texts: list[str]) -> list[EnvOutcome]:
        """Step every episode on its turn's text; `envs[i]` None starts episode i from `rows[i]`."""
        items = [(self.spec, self.options, self.base_dir, e, r, t) for e, r, t in zip(envs, rows, texts)]
        out = []
        for res in self._pool.map(_step, items):
            if res.status != OK:
                why = res.error.strip().splitlines()[-1] if res.error else res.status
                out.append(
                    EnvOutcome(None, None, 0.0, True, f"environment {self.spec} {res.status}: {why}", res.status)
                )
                continue
            env, result = res.value
            try:
                step = check_result(result)
            except ValueError as e:
                out.append(EnvOutcome(None, None, 0.0, True, f"environment {self.spec} returned junk: {e}", "junk"))
                continue
            out.append(EnvOutcome(None if step.done else env, step.observation, step.reward, step.done))
        return out

    def close(self) -> None:
        self._pool.close()
