"""Starting the workers: Ray (local or a cluster), placement groups, and `build_workers` for the launcher.

`build_workers(cfg, use_ray)` returns the three objects the loop calls — `(rollout, learner, rewards)`, i.e.
`RolloutWorkers`, `LearnerWorkers`, `RewardWorkers` (rl/workers.py) — either in this process (`actors/local.py`)
or as Ray actors placed here.

Placement: one placement group (PACK) holds a bundle per rollout engine and per learner rank.
- separate (`ray.colocate: false`): engine i gets bundle i, learner rank j bundle E + j; each bundle has 1 CPU and
  the role's GPUs (`rollout.num_gpus_per_engine`, `learner.num_gpus_per_worker`).
- colocated (`ray.colocate: true`): max(E, W) bundles; engine i and rank i share bundle i, each actor taking half
  its CPU and GPU (the synchronous loop never generates and trains at once). vLLM's `gpu_memory_utilization`
  must then leave room for the learner.
The reward actor sits outside the group (1 CPU; its process pool is not counted by Ray).

Local Ray (`ray.address: null`): `ray.init` with auth off (`RAY_AUTH_MODE=disabled`, loopback only), the dashboard
off unless `ray.dashboard` (then bound to 127.0.0.1), and as many logical CPUs as the machine has or the job
needs, whichever is larger (logical CPUs are a scheduling count; a 2-core laptop still runs 1 engine + 2 ranks).
Every worker process gets `runtime_env` variables: WANDB_MODE, VLLM_ENABLE_V1_MULTIPROCESSING=0, tokenizers
single-threaded, DS_ACCELERATOR=cpu when no role has a GPU, VLLM_CPU_KVCACHE_SPACE, and unless `logging.verbose`
the quieting switches of actors/console.py (whose output then stays in Ray's log files: `log_to_driver` off).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

PLACEMENT_TIMEOUT_S = 120.0
PASS_THROUGH_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "PYTHONPATH")


def uses_gpu(cfg) -> bool:
    return cfg.rollout.num_gpus_per_engine > 0 or cfg.learner.num_gpus_per_worker > 0


def runtime_env(cfg) -> dict:
    env = {
        "WANDB_MODE": os.environ.get("WANDB_MODE", cfg.logging.wandb_mode),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",   # vLLM in the actor's own process: fast start, tensors in-process
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CPU_KVCACHE_SPACE": str(max(1, int(round(cfg.rollout.vllm.kv_cache_gib)))),
    }
    if not uses_gpu(cfg):
        env["DS_ACCELERATOR"] = "cpu"
    if not cfg.logging.verbose:
        from actors.console import QUIET_ENV
        env.update(QUIET_ENV)
    env.update({k: v for k, v in os.environ.items() if k in PASS_THROUGH_ENV or k.startswith("FBRL_INJECT_")})
    return {"env_vars": env}


def required_cpus(cfg) -> int:
    E, W = cfg.rollout.num_engines, cfg.learner.num_workers
    return (max(E, W) if cfg.ray.colocate else E + W) + 1  # + the reward actor


def init_ray(cfg) -> None:
    """Connect to `ray.address`, or start a local Ray sized for the job. No-op when Ray is already up."""
    import ray
    if ray.is_initialized():
        return
    if cfg.ray.address:
        ray.init(address=cfg.ray.address, runtime_env=runtime_env(cfg), log_to_driver=cfg.logging.verbose)
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local and loopback-only: no token to manage
    # Quiet unless logging.verbose: the workers' output stays in Ray's log files instead of interleaving with the
    # step lines (actors/console.py; the launcher's summary names the directory).
    kwargs = {"num_cpus": cfg.ray.num_cpus or max(os.cpu_count() or 1, required_cpus(cfg)),
              "include_dashboard": bool(cfg.ray.dashboard), "runtime_env": runtime_env(cfg),
              "log_to_driver": cfg.logging.verbose, "logging_level": "INFO" if cfg.logging.verbose else "WARNING"}
    if cfg.ray.dashboard:
        kwargs["dashboard_host"] = "127.0.0.1"
    ray.init(**kwargs)


@dataclass
class Placement:
    """Ray options (resources + scheduling strategy) for each rollout engine and each learner rank."""
    rollout: list[dict] = field(default_factory=list)
    learner: list[dict] = field(default_factory=list)
    group: object = None  # the PlacementGroup, kept so it can be removed


def plan_bundles(cfg) -> tuple[list[dict], list[int], list[int], float]:
    """(bundles, bundle index per engine, bundle index per rank, share of a bundle each actor takes)."""
    E, W = cfg.rollout.num_engines, cfg.learner.num_workers
    g_r, g_l = cfg.rollout.num_gpus_per_engine, cfg.learner.num_gpus_per_worker

    def bundle(gpus):
        return {"CPU": 1.0, **({"GPU": float(gpus)} if gpus > 0 else {})}

    if cfg.ray.colocate:
        n = max(E, W)
        return [bundle(max(g_r, g_l)) for _ in range(n)], list(range(E)), list(range(W)), 0.5
    return [bundle(g_r) for _ in range(E)] + [bundle(g_l) for _ in range(W)], \
        list(range(E)), list(range(E, E + W)), 1.0


def create_placement(cfg) -> Placement:
    """Reserve the bundles (waits until Ray can place them; a clear error if it cannot)."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundles, rollout_idx, learner_idx, share = plan_bundles(cfg)
    pg = placement_group(bundles, strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(pg)
        raise RuntimeError(f"Ray could not reserve {bundles} within {PLACEMENT_TIMEOUT_S:.0f} s; cluster resources "
                           f"are {ray.cluster_resources()} (lower rollout.num_engines / learner.num_workers or the "
                           f"GPUs per actor, or set ray.colocate: true)") from None

    def options(i, gpus):
        return {"num_cpus": share, "num_gpus": gpus * share if cfg.ray.colocate else gpus,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)}

    return Placement([options(i, cfg.rollout.num_gpus_per_engine) for i in rollout_idx],
                     [options(i, cfg.learner.num_gpus_per_worker) for i in learner_idx], pg)


def start_rollout_fleet(cfg, placement: Placement, supervisor=None):
    from actors.rollout import RolloutFleet, rollout_actor_class
    cls = rollout_actor_class()

    def make(i):  # engine i, on its bundle; also what replaces it (actors/supervision.py)
        return cls.options(**placement.rollout[i]).remote(cfg, i)

    return RolloutFleet([make(i) for i in range(len(placement.rollout))], make, supervisor)


def start_learner_group(cfg, placement: Placement, supervisor=None):
    from actors.learner_group import LearnerGroup, rank_actor_class
    cls = rank_actor_class()

    def make(r):
        return cls.options(**placement.learner[r]).remote()

    return LearnerGroup(cfg, [make(r) for r in range(len(placement.learner))], make, supervisor)


def start_reward_workers(cfg, base_dir: str | None = None, supervisor=None):
    from actors.reward_workers import RewardWorkersOnRay, reward_actor_class
    base_dir = base_dir or os.getcwd()

    def make():
        return reward_actor_class().options(num_cpus=1).remote(cfg.reward, base_dir, cfg.data.task)

    return RewardWorkersOnRay(make(), make, supervisor)


def build_workers(cfg, use_ray: bool, faults=None):
    """`(rollout, learner, rewards)` for `rl.loop.train`: Ray actors placed as above, or in-process workers.
    On Ray, dead actors are replaced within `cfg.faults`' bounds and counted in `faults` (a `rl.faults.FaultLog`
    shared with the loop)."""
    if not use_ray:
        from actors.local import build_local_workers
        return build_local_workers(cfg)
    import ray

    from actors.supervision import Supervisor
    supervisor = Supervisor(cfg.faults, faults)
    init_ray(cfg)
    placement = create_placement(cfg)
    rollout = start_rollout_fleet(cfg, placement, supervisor)   # engines start loading while the learners meet
    rewards = start_reward_workers(cfg, supervisor=supervisor)
    learner = start_learner_group(cfg, placement, supervisor)
    ray.get([a.version.remote() for a in rollout.actors])  # surface an engine that failed to start, now
    return rollout, learner, rewards


def shutdown_workers(*workers) -> None:
    """Close each worker object that has `close()` (engines, pools, actors); Ray itself stays up."""
    for w in workers:
        close = getattr(w, "close", None)
        if callable(close):
            close()
