"""The sections of how a job runs rather than what it learns: logging (wandb, the console), Ray (where the
actors go) and faults (what a job survives inside itself, and when it stops instead)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from rl.config.bounds import ge, within


@dataclass
class LoggingConfig:
    # trackers fed every step beside RUN_DIR/metrics.jsonl and the plots (actors/trackers.py): wandb (see
    # wandb_mode), tensorboard (event files in RUN_DIR/tensorboard; needs the tensorboard package)
    report_to: list[Literal["wandb", "tensorboard"]] = field(default_factory=lambda: ["wandb"])
    wandb_project: str = "fbrl"
    wandb_entity: str | None = None
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    log_every: int = 1
    progress: bool = True  # a progress bar on stderr when it is a terminal
    verbose: bool = False  # vLLM / Ray workers / DeepSpeed / wandb / transformers output on the console


@dataclass
class RayConfig:
    address: str | None = None  # null: a private local Ray (inside `ray job submit`: the job's cluster)
    num_cpus: Annotated[int | None, ge(1)] = None
    dashboard: bool = False
    colocate: bool = False  # rollout and learner share resources
    # engines and learner ranks give malloc's freed heap back every N batches (actors/memory.py; 0: never)
    trim_heap_every: Annotated[int, ge(0, "(0: never)")] = 10
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


@dataclass
class FaultsConfig:
    """What a job survives inside itself, and when it stops instead (docs/RELIABILITY.md). Every recovery is
    counted under `faults/...` in the metrics and logged in one line."""

    # dead rollout actors replaced over the job (their requests re-issued)
    max_rollout_restarts: Annotated[int, ge(0)] = 20
    max_learner_rebuilds: Annotated[int, ge(0)] = 3  # learner group rebuilt from the last checkpoint after a rank died
    max_reward_restarts: Annotated[int, ge(0)] = 20  # dead reward actors restarted (the batch is scored again)
    # M: steps in a row with non-finite loss or gradients (skipped) -> stop
    max_nonfinite_steps: Annotated[int, ge(1)] = 3
    # a reward erroring or timing out on more than this share of rows for reward_error_steps steps in a row stops
    # the job, naming the reward
    reward_error_share: Annotated[float, within(0, 1, high_open=True)] = 0.5
    reward_error_steps: Annotated[int, ge(1)] = 3
    # A rollout, learner or reward call that has not returned after call_timeout_s + call_timeout_per_sample_s per
    # sample it handles is treated as its actor's death: killed, replaced and issued again (faults/<role>_timeouts,
    # counted against the role's max_*_restarts). The base covers a first call's warm-up; 0: no deadline.
    call_timeout_s: Annotated[float, ge(0, "(0: no deadline)")] = 1800.0
    call_timeout_per_sample_s: Annotated[float, ge(0)] = 2.0
    # Between steps (s = 0: the engines idle), every rollout engine is pinged; one that is dead or has not answered
    # after this many seconds is killed and replaced before the next request (counted against
    # max_rollout_restarts). A healthy idle engine answers in milliseconds; 60 s leaves room for a loaded node (a
    # GC pause, a busy raylet) while finding a wedged engine 30 times sooner than call_timeout_s. 0: no ping.
    engine_ping_timeout_s: Annotated[float, ge(0, "(0: off)")] = 60.0
    # while a step waits on actor calls, a line every this many seconds naming what it waits on (0: never)
    waiting_log_s: Annotated[float, ge(0, "(0: never)")] = 300.0
    # steps in a row with no reward signal (every group's rewards equal, so every advantage 0: nothing trains)
    # -> stop, rather than spend the job's budget on rollouts that cannot change the policy
    max_no_signal_steps: Annotated[int, ge(0, "(0: off)")] = 10
