"""The sections of how a job runs rather than what it learns: logging (wandb, the console), Ray (where the
actors go) and faults (what a job survives inside itself, and when it stops instead)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class LoggingConfig:
    wandb_project: str = "fbrl"
    wandb_entity: str | None = None
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    log_every: int = 1
    progress: bool = True  # a progress bar on stderr when it is a terminal
    verbose: bool = False  # vLLM / Ray workers / DeepSpeed / wandb / transformers output on the console


@dataclass
class RayConfig:
    address: str | None = None  # null: a private local Ray (inside `ray job submit`: the job's cluster)
    num_cpus: int | None = None
    dashboard: bool = False
    colocate: bool = False  # rollout and learner share resources
    trim_heap_every: int = 10  # engines and learner ranks give malloc's freed heap back every N batches
    # (actors/memory.py; 0: never)
    # Where actors go (docs/CLUSTER.md): the placement group's strategy over the engine and learner bundles, and
    # custom node resources each role needs (`ray start --resources '{"rollout_node": 8}'` on the nodes that may
    # host it; an amount <= what such a node advertises, e.g. {rollout_node: 1}).
    placement: Literal["pack", "spread", "strict_pack", "strict_spread"] = "pack"
    rollout_resources: dict[str, float] = field(default_factory=dict)
    learner_resources: dict[str, float] = field(default_factory=dict)
    reward_resources: dict[str, float] = field(default_factory=dict)

    def validate(self):
        for role in ("rollout", "learner", "reward"):
            for name, amount in getattr(self, f"{role}_resources").items():
                if amount <= 0 or name in ("CPU", "GPU", "memory"):
                    yield (
                        f"{role}_resources",
                        (
                            f"expected custom resource names with amounts > 0 (CPUs and GPUs "
                            f"come from the role's own keys), got {name}: {amount}"
                        ),
                    )
        if self.num_cpus is not None and self.num_cpus < 1:
            yield "num_cpus", f"must be >= 1 or null, got {self.num_cpus}"
        if self.trim_heap_every < 0:
            yield "trim_heap_every", f"must be >= 0 (0: never), got {self.trim_heap_every}"


@dataclass
class FaultsConfig:
    """What a job survives inside itself, and when it stops instead (docs/RELIABILITY.md). Every recovery is
    counted under `faults/...` in the metrics and logged in one line."""

    max_rollout_restarts: int = 20  # dead rollout actors replaced over the job (their requests re-issued)
    max_learner_rebuilds: int = 3  # learner group rebuilt from the last checkpoint after a rank died
    max_reward_restarts: int = 20  # dead reward actors restarted (the batch is scored again)
    max_nonfinite_steps: int = 3  # M: steps in a row with non-finite loss or gradients (skipped) -> stop
    reward_error_share: float = 0.5  # a reward erroring or timing out on more than this share of rows ...
    reward_error_steps: int = 3  # ... this many steps in a row stops the job, naming the reward

    def validate(self):
        for name in ("max_rollout_restarts", "max_learner_rebuilds", "max_reward_restarts"):
            if getattr(self, name) < 0:
                yield name, f"must be >= 0, got {getattr(self, name)}"
        for name in ("max_nonfinite_steps", "reward_error_steps"):
            if getattr(self, name) < 1:
                yield name, f"must be >= 1, got {getattr(self, name)}"
        if not 0 <= self.reward_error_share < 1:
            yield "reward_error_share", f"expected a share in [0, 1), got {self.reward_error_share}"
