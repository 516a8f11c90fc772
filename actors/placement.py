"""Starting the workers: Ray (a private local instance or a cluster), placement groups, and `build_workers`.

`build_workers(cfg, use_ray)` returns the three objects the loop calls — `(rollout, learner, rewards)`, i.e.
`RolloutWorkers`, `LearnerWorkers`, `RewardWorkers` (rl/train/workers.py) — either in this process (`actors/local.py`)
or as Ray actors placed here, with the weight-sync transport (actors/weight_sync.py) resolved for that placement.

Placement: one placement group holds a bundle per rollout engine and per learner rank, with the strategy
`ray.placement` (pack, spread, strict_pack, strict_spread).
- separate (`ray.colocate: false`): engine i gets bundle i, learner rank j bundle E + j; each bundle has 1 CPU, the
  role's GPUs (`rollout.num_gpus_per_engine`, `learner.num_gpus_per_worker`) and the role's custom node resources
  (`ray.rollout_resources`, `ray.learner_resources`): a node started with `ray start --resources '{"gen": 8}'` and
  `ray.rollout_resources: {gen: 1}` puts engines there and only there.
- colocated (`ray.colocate: true`): max(E, W) bundles; engine i and rank i share bundle i, each actor taking half
  its CPU and GPU (the synchronous loop never generates and trains at once). vLLM's `gpu_memory_utilization`
  must then leave room for the learner.
The reward actor sits outside the group (1 CPU and `ray.reward_resources`; its process pool is not counted by Ray).
The driver prints where every actor runs (`placement: <role> on node <id> (<ip>)`).

Ray itself (`init_ray`):
- `ray.address` set: connect to that cluster. Null inside a job started by `ray job submit`: the job's cluster.
- otherwise a NEW private local instance (`address="local"`: never attaches to a cluster someone else started on
  this machine), as many logical CPUs as the machine has or the job needs, whichever is larger (a scheduling
  count; a 2-core laptop still runs an engine, 2 learner ranks and the reward actor). It is loopback-only: Ray's node IP is 127.0.0.1, so
  GCS, raylet, object manager, workers, agents and the dashboard (off unless `ray.dashboard`) all listen on
  127.0.0.1; and every Ray RPC needs a token made for this run (`RAY_AUTH_MODE=token`, `RAY_AUTH_TOKEN`, set in
  this process and inherited by Ray's processes; never logged). The learners' gloo sockets stay on `lo`
  (GLOO_SOCKET_IFNAME). docs/CLUSTER.md lists what listens where; tests/test_cluster.py checks it. Without the
  dashboard, workers report no task events (the dashboard's task views are their only reader; the GCS kept them).
Every worker process gets `runtime_env` variables: WANDB_MODE, VLLM_ENABLE_V1_MULTIPROCESSING=0, tokenizers
single-threaded, DS_ACCELERATOR=cpu when no role has a GPU, VLLM_CPU_KVCACHE_SPACE, and unless `logging.verbose`
the quieting switches of actors/console.py (whose output then stays in Ray's log files: `log_to_driver` off).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from actors.resources import cluster_address, required_cpus, uses_gpu

PLACEMENT_TIMEOUT_S = 120.0
PASS_THROUGH_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "PYTHONPATH")
LOOPBACK = "127.0.0.1"


def runtime_env(cfg, local: bool = False) -> dict:
    env = {
        "WANDB_MODE": os.environ.get("WANDB_MODE", cfg.logging.wandb_mode),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # vLLM in the actor's own process: fast start, tensors in-process
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CPU_KVCACHE_SPACE": str(max(1, int(round(cfg.rollout.vllm.kv_cache_gib)))),
    }
    if not uses_gpu(cfg):
        env["DS_ACCELERATOR"] = "cpu"
    if not cfg.logging.verbose:
        from actors.console import QUIET_ENV

        env.update(QUIET_ENV)
    if local and loopback_interface():
        # gloo (the CPU learners' collectives) listens on the address its device resolves to; keep it on loopback
        env["GLOO_SOCKET_IFNAME"] = loopback_interface()
    env.update({k: v for k, v in os.environ.items() if k in PASS_THROUGH_ENV or k.startswith("FBRL_INJECT_")})
    return {"env_vars": env}


def loopback_interface() -> str | None:
    """The loopback interface's name (`lo` on Linux, `lo0` on macOS), None if there is none by those names."""
    names = {name for _, name in socket.if_nameindex()}
    return next((n for n in ("lo", "lo0") if n in names), None)


def init_ray(cfg) -> None:
    """Connect to the cluster (`cluster_address`), or start a private, loopback-only local Ray sized for the job.
    No-op when Ray is already up in this process."""
    import ray

    if ray.is_initialized():
        return
    address = cluster_address(cfg)
    if address:
        ray.init(address=address, runtime_env=runtime_env(cfg), log_to_driver=cfg.logging.verbose)
        return
    # Quiet unless logging.verbose: the workers' output stays in Ray's log files instead of interleaving with the
    # step lines (actors/console.py; the launcher's summary names the directory).
    kwargs = {
        "num_cpus": cfg.ray.num_cpus or max(os.cpu_count() or 1, required_cpus(cfg)),
        "include_dashboard": bool(cfg.ray.dashboard),
        "runtime_env": runtime_env(cfg, local=True),
        "log_to_driver": cfg.logging.verbose,
        "logging_level": "INFO" if cfg.logging.verbose else "WARNING",
    }
    # The workers are the job: Ray starts them at nice 15 (so a shared node's own daemons come first), which let
    # any work of the driver's (imports, data, a plot) preempt training on a small machine. The live plots' own
    # process runs at nice 19 (rl/report/live_plots.py), below the workers.
    kwargs["_system_config"] = {"worker_niceness": 0}
    if cfg.ray.dashboard:
        kwargs["dashboard_host"] = LOOPBACK
    else:
        # Every task's events go to the GCS for the dashboard's task views (kept up to 100,000 tasks, ~3.4 KB each):
        # the soak's GCS grew +7 % per 100 steps (~10 tasks per step). Without a dashboard nothing reads them.
        kwargs["_system_config"]["task_events_report_interval_ms"] = 0
    start_local_ray(**kwargs)


class RayStart:
    """`init_ray(cfg)` in a thread of its own, so that Ray comes up while the driver checks the job's inputs (Ray's
    daemons start on the other core while this one imports and checks). `wait()` hands over the started Ray (or
    raises what its start raised); `stop()` shuts it down, and is what a refused input calls: its one line, then
    no Ray left. Nothing is started when Ray is already up in this process.

    The thread lives until `stop()`: Ray starts its daemons with PR_SET_PDEATHSIG, which on Linux fires when the
    *thread* that started a process ends, not the process, so a thread that returned would take GCS and raylet
    with it. It is a daemon thread: if the driver dies, Ray's daemons die with it, as they do without it."""

    def __init__(self, cfg):
        import ray  # here, not in the thread: its import never interleaves with the main thread's imports

        self.seconds, self.error = 0.0, None
        self._up, self._stopped = threading.Event(), threading.Event()
        if ray.is_initialized():
            self._up.set()
            return
        self._t0 = time.perf_counter()
        threading.Thread(target=self._start, args=(cfg,), name="fbrl-ray-start", daemon=True).start()

    def _start(self, cfg) -> None:
        quiet = _DropMessage("SIGTERM handler is not set")  # ours is installed by the session, in the main thread
        logging.getLogger("ray._private.worker").addFilter(quiet)
        try:
            init_ray(cfg)
        except BaseException as e:  # raised in the main thread by wait()
            self.error = e
        finally:
            logging.getLogger("ray._private.worker").removeFilter(quiet)
            self.seconds = time.perf_counter() - self._t0
            self._up.set()
        self._stopped.wait()

    def wait(self) -> float:
        """Block until Ray is up; the seconds its start took (0 when it was up already). Raises its start's error."""
        self._up.wait()
        if self.error is not None:
            raise self.error
        return self.seconds

    def stop(self) -> None:
        """Shut Ray down (once it has finished starting), then let the thread end."""
        import ray

        self._up.wait()
        try:
            if ray.is_initialized():
                ray.shutdown()
        finally:
            self._stopped.set()


class _DropMessage(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record) -> bool:
        return not str(record.msg).startswith(self.start)


def start_local_ray(**kwargs) -> None:
    """`ray.init(address="local", **kwargs)` listening on 127.0.0.1 only, with token authentication.

    Ray binds its gRPC servers to the wildcard address unless the node IP is the loopback address, and on Linux it
    replaces 127.0.0.1 by the machine's routable IP (`services.resolve_ip_for_localhost`) — except where
    `ray_constants.ENABLE_RAY_CLUSTER` is false (macOS/Windows), where a single-node Ray uses 127.0.0.1. That switch
    is flipped for the duration of `ray.init` only (the node keeps its IP afterwards; a later `ray.init(address=...)`
    in this process resolves IPs as usual). The token: Ray reads RAY_AUTH_MODE / RAY_AUTH_TOKEN once per process,
    so its config and token cache are refreshed after they are set (what `ray.init` itself does when it turns token
    auth on, ray/_private/authentication/authentication_token_setup.py)."""
    import ray
    from ray._private import ray_constants
    from ray._raylet import AuthenticationTokenLoader, Config

    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
    cluster = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(address="local", **kwargs)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = cluster


@dataclass
class Placement:
    """Ray options (resources + scheduling strategy) for each rollout engine and each learner rank, and the node
    each bundle was reserved on."""

    rollout: list[dict] = field(default_factory=list)
    learner: list[dict] = field(default_factory=list)
    group: object = None  # the PlacementGroup, kept so it can be removed
    rollout_nodes: list[str] = field(default_factory=list)
    learner_nodes: list[str] = field(default_factory=list)


def plan_bundles(cfg) -> tuple[list[dict], list[int], list[int], float]:
    """(bundles, bundle index per engine, bundle index per rank, share of a bundle each actor takes)."""
    E, W = cfg.rollout.num_engines, cfg.learner.num_workers
    g_r, g_l = cfg.rollout.num_gpus_per_engine, cfg.learner.num_gpus_per_worker
    res_r, res_l = dict(cfg.ray.rollout_resources), dict(cfg.ray.learner_resources)

    def bundle(gpus, resources):
        return {"CPU": 1.0, **({"GPU": float(gpus)} if gpus > 0 else {}), **resources}

    if cfg.ray.colocate:
        n = max(E, W)
        shared = {k: max(res_r.get(k, 0.0), res_l.get(k, 0.0)) for k in {**res_r, **res_l}}
        return [bundle(max(g_r, g_l), shared) for _ in range(n)], list(range(E)), list(range(W)), 0.5
    return (
        [bundle(g_r, res_r) for _ in range(E)] + [bundle(g_l, res_l) for _ in range(W)],
        list(range(E)),
        list(range(E, E + W)),
        1.0,
    )


def create_placement(cfg) -> Placement:
    """Reserve the bundles (waits until Ray can place them; a clear error if it cannot)."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundles, rollout_idx, learner_idx, share = plan_bundles(cfg)
    pg = placement_group(bundles, strategy=cfg.ray.placement.upper())
    try:
        ray.get(pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(pg)
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        raise RuntimeError(
            f"Ray could not reserve the bundles {bundles} (ray.placement: {cfg.ray.placement}) within "
            f"{PLACEMENT_TIMEOUT_S:.0f} s; the live nodes offer {nodes} (lower rollout.num_engines / "
            f"learner.num_workers or the GPUs per actor, check ray.rollout_resources / "
            f"ray.learner_resources against the nodes' custom resources, or set ray.colocate: true)"
        ) from None
    node_of = placement_group_table(pg)["bundles_to_node_id"]

    def options(i, gpus):
        return {
            "num_cpus": share,
            "num_gpus": gpus * share if cfg.ray.colocate else gpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
        }

    return Placement(
        [options(i, cfg.rollout.num_gpus_per_engine) for i in rollout_idx],
        [options(i, cfg.learner.num_gpus_per_worker) for i in learner_idx],
        pg,
        [node_of[i] for i in rollout_idx],
        [node_of[i] for i in learner_idx],
    )


def start_rollout_fleet(cfg, placement: Placement, weight_sync: str = "file", supervisor=None):
    from actors.rollout_fleet import RolloutFleet, rollout_actor_class, rollout_threads

    cls = rollout_actor_class()
    one_machine = cluster_address(cfg) is None  # a private local Ray: every actor is on this machine

    def make(i):  # engine i, on its bundle; also what replaces it (actors/supervision.py)
        threads = rollout_threads(cfg, os.cpu_count() or 1, placement.rollout[i]["num_cpus"], one_machine)
        return cls.options(**placement.rollout[i]).remote(cfg, i, None, weight_sync, threads)

    return RolloutFleet([make(i) for i in range(len(placement.rollout))], make, supervisor)


def start_learner_group(cfg, placement: Placement, supervisor=None):
    from actors.learner_group import LearnerGroup, rank_actor_class

    cls = rank_actor_class()

    def make(r):
        return cls.options(**placement.learner[r]).remote()

    return LearnerGroup(cfg, [make(r) for r in range(len(placement.learner))], make, supervisor)


def start_reward_workers(cfg, base_dir: str | None = None, supervisor=None, python_fns: dict | None = None):
    from actors.reward_workers import RewardWorkersOnRay, reward_actor_class

    base_dir = base_dir or os.getcwd()
    opts = {"num_cpus": 1, **({"resources": dict(cfg.ray.reward_resources)} if cfg.ray.reward_resources else {})}

    def make():
        # python_fns: functions handed to actors.api.train, pickled by value into the actor (cloudpickle)
        return reward_actor_class().options(**opts).remote(cfg.reward, base_dir, cfg.data.task, python_fns, cfg.env)

    return RewardWorkersOnRay(make(), make, supervisor)


def where(actor) -> tuple[str, str]:
    """(node id, node IP) of the process an actor runs in."""
    import ray

    def here(_self):
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    return tuple(ray.get(actor.__ray_call__.remote(here)))


def log_placement(rollout, learner, rewards, log=print) -> dict[str, list[tuple[str, str]]]:
    """Print and return where every actor runs: {"rollout": [(node id, ip)], "learner": [...], "reward": [...]}."""
    out = {
        "rollout": [where(a) for a in rollout.actors],
        "learner": [where(a) for a in learner.actors],
        "reward": [where(rewards.actor)],
    }
    names = {"rollout": "rollout engine", "learner": "learner rank", "reward": "reward actor"}
    for role, places in out.items():
        for i, (node, ip) in enumerate(places):
            log(f"placement: {names[role]} {i} on node {node} ({ip})")
    return out


def _ready_at(actor):
    """A reference to the wall time at which `actor` runs its next call: submitted right after the actor is
    created (or set up), the time its constructor (or setup) finished."""

    def now(_self):
        import time

        return time.time()

    return actor.__ray_call__.remote(now)


def startup_line(seconds: dict[str, float], threads: list[int]) -> str:
    """`ready after: ...` — when each role's actors were up, counted from the start of `build_workers`."""
    names = {"rollout": "rollout engines", "learner": "learner ranks", "reward": "reward actor"}
    parts = [f"{name} {seconds[k]:.1f} s" for k, name in names.items() if k in seconds]
    line = "ready after: " + ", ".join(parts)
    return line + (f"; engine threads {','.join(map(str, threads))}" if threads else "")


def build_workers(
    cfg, use_ray: bool, faults=None, log=print, startup: dict | None = None, python_fns: dict | None = None
):
    """`(rollout, learner, rewards)` for `rl.loop.train`: Ray actors placed as above, or in-process workers; the
    rollout workers carry the weight-sync transport (`rollout.weight_sync`, resolved for this placement).
    On Ray, dead actors are replaced within `cfg.faults`' bounds and counted in `faults` (a `rl.train.faults.FaultLog`
    shared with the loop). `startup`, when given, receives the seconds after which each role's actors were up
    (`reward`, `rollout`, `learner`: they start at once and come up concurrently) and the engines' `threads`.
    `python_fns`: reward functions handed to `actors.api.train`, by name (`python:NAME` in reward.fns)."""
    from actors.weight_sync import attach_transport, resolve_transport

    if not use_ray:
        from actors.local import build_local_workers

        rollout, learner, rewards = build_local_workers(cfg, python_fns=python_fns)
        attach_transport(cfg, rollout, learner, *resolve_transport(cfg, None), log=log)
        return rollout, learner, rewards
    import ray

    from actors.supervision import Supervisor

    supervisor = Supervisor(cfg.faults, faults)
    init_ray(cfg)
    placement = create_placement(cfg)
    transport, why = resolve_transport(cfg, placement)
    t0 = time.time()
    rollout = start_rollout_fleet(cfg, placement, transport, supervisor)  # engines load while the learners meet
    rewards = start_reward_workers(cfg, supervisor=supervisor, python_fns=python_fns)
    ready = {"rollout": [_ready_at(a) for a in rollout.actors], "reward": [_ready_at(rewards.actor)]}
    learner = start_learner_group(cfg, placement, supervisor)
    t_learner = time.time() - t0
    ray.get([a.version.remote() for a in rollout.actors])  # surface an engine that failed to start, now
    if startup is not None:
        try:  # a report only: an actor that died starting up is the supervisor's to replace, not a start-up error
            startup.update({role: max(ray.get(refs)) - t0 for role, refs in ready.items()}, learner=t_learner)
            startup["threads"] = ray.get([a.num_threads.remote() for a in rollout.actors])
        except ray.exceptions.RayError:
            startup.clear()
    log_placement(rollout, learner, rewards, log)
    check_shared_storage(cfg.train.run_dir, learner.actors, placement.learner_nodes)
    attach_transport(cfg, rollout, learner, transport, why, log=log)
    return rollout, learner, rewards


def check_shared_storage(run_dir: str, rank_actors: list, rank_nodes: list[str], timeout_s: float = 60.0) -> None:
    """The start-up probe of a multi-node job: every learner rank on another node than the driver reads a file the
    driver just wrote under `train.run_dir`. A rank that cannot (storage the nodes do not share) stops the job
    now, exit 2 naming `train.run_dir`, instead of at its first checkpoint."""
    import ray

    from rl.train.checkpoints import not_shared

    here = ray.get_runtime_context().get_node_id()
    remote = [k for k, node in enumerate(rank_nodes) if node != here]
    if not remote:
        return
    run_path, token = Path(run_dir).absolute(), secrets.token_hex(8)
    probe = run_path / f".storage-probe-{token}"
    probe.write_text(token)

    def read(_self, path: str):
        try:
            return Path(path).read_text()
        except OSError:
            return None

    try:
        seen = ray.get([rank_actors[k].__ray_call__.remote(read, str(probe)) for k in remote], timeout=timeout_s)
    finally:
        probe.unlink(missing_ok=True)
    blind = [k for k, text in zip(remote, seen) if text != token]
    if blind:
        ranks = ", ".join(f"rank {k} on node {rank_nodes[k][:12]}" for k in blind)
        raise not_shared(
            f"learner ranks on other nodes cannot read what this driver writes under {run_path} ({ranks})",
            run_path,
            "every learner rank",
        )
