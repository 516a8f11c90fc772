"""What each worker may use, the lowest floor of actors/: whether a job wants GPUs, the CPUs a local Ray needs, which
cluster it joins, and the torch threads of each actor (`role_threads`). Imports nothing of fbrl."""

from __future__ import annotations

import os

JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor in a `ray job submit` entrypoint


def uses_gpu(cfg) -> bool:
    return cfg.rollout.num_gpus_per_engine > 0 or cfg.learner.num_gpus_per_worker > 0


def required_cpus(cfg) -> int:
    E, W = cfg.rollout.num_engines, cfg.learner.num_workers
    return (max(E, W) if cfg.ray.colocate else E + W) + 1  # + the reward actor


def cluster_address(cfg) -> str | None:
    """The cluster to connect to: `ray.address`, or "auto" inside a `ray job submit` job; None: a local Ray."""
    if cfg.ray.address:
        return cfg.ray.address
    return "auto" if os.environ.get(JOB_ENV) else None


def role_threads(
    num_threads: int | None, role_count: int, max_staleness: int, cores: int, reserved_cpus: float, one_machine: bool
) -> int:
    """torch / OpenMP threads of each actor of a role (its engines or its learner ranks): the role's
    `num_threads`, or where it is null the cores the actor may use. A synchronous job on one machine
    (`train.max_staleness` 0) never generates while it trains, so while a role works every core is its:
    `cores // role_count` each. Otherwise (an asynchronous job, or a cluster) an actor takes the CPUs Ray reserved
    for it. Ray itself starts every actor with OMP_NUM_THREADS = its CPUs (1 here), which left a core idle."""
    if num_threads is not None:
        return num_threads
    if one_machine and max_staleness == 0:
        return max(1, cores // role_count)
    return max(1, int(reserved_cpus))
