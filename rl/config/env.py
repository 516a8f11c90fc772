"""`env`: the tool environment a policy talks to over several turns (docs/TOOLS.md). Null (the default): single
completions. rl/train/multiturn.py runs the turns, rewards/env_pool.py the environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from rl.config.bounds import ge, gt


@dataclass
class EnvConfig:
    # a built-in environment (calculator), or 'path/file.py:obj' / 'package.module:obj': an Environment class, a
    # SkyRL-style class (init/step) or a list of TRL tool functions
    name: str = "calculator"
    options: dict[str, Any] = field(default_factory=dict)  # keyword arguments of the environment's class
    max_turns: Annotated[int, ge(1)] = 8  # turns of the policy per episode (the first included)
    # tokens the policy may write in one turn (null: what is left of rollout.max_tokens, which bounds the whole
    # response, observations included)
    max_turn_tokens: Annotated[int | None, ge(1)] = None
    step_timeout_s: Annotated[float, gt(0)] = 10.0  # an environment step past this is killed (counted, episode ends)
    num_workers: Annotated[int, ge(1)] = 2  # the environments' worker processes
    reward_weight: float = 1.0  # the episode's summed environment rewards, added to the reward functions' total
