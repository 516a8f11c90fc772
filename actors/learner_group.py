"""`LearnerGroup`: N DeepSpeed learner ranks as Ray actors, behind the loop's `LearnerWorkers` interface.

Start-up is two-phase because the rendezvous address is rank 0's node, which is known only once its actor runs:
every `RankActor` is created empty (placed by the caller's Ray options: placement-group bundle, CPUs, GPUs),
rank 0 reports its node IP and a free port, then all ranks build their `actors.learner_rank.LearnerRank` together
(deepspeed.initialize is collective).

`update` puts the WHOLE sample list into the object store once and hands the same reference to every rank; each
rank takes its rows from the plan `rl.train.update_plan` computes on the whole batch, so all ranks make the same
number of backward/step calls, and gradients are summed over ranks (see actors/learner_rank.py). The samples carry references
to their recorded states, not the states (actors/state_plane.py): the group assigns each rank the rows it reads
(`rl.train.update_plan.rows_read`, from row lengths) before anything is fetched, and each rank fetches those rows'
states only. Weight access (export, checksums, checkpoints) is called on every rank because under ZeRO-3 it is
collective; rank 0 writes the files.

A rank that dies (its process is gone) takes the group with it: the other ranks are bound to it by collectives.
With `make_rank(r)` and a `supervisor`, every rank is killed and a new group is set up from the checkpoint the
job started from (actors/supervision.py); the call raises `rl.train.faults.LearnerRebuilt` and the loop restores the
run's last checkpoint into the new group.
"""

from __future__ import annotations

from actors.supervision import actor_class, gather, kill, wait_started
from rl.train.faults import LearnerRebuilt
from rl.train.update_plan import SUMMED_METRICS, rows_read

# Metrics that are the same on every rank (global after the collective step) and are taken from rank 0; every
# other metric is a token-weighted mean over this rank's micro-batches and is merged over ranks the same way.
GLOBAL_METRICS = ("grad_norm", "optimizer_steps", "nonfinite_steps", "replay_approximate")
# What each rank's state fetch moved (actors/state_plane.py): rows and bytes add up over ranks; the step waits for
# the slowest fetch; `state_plane/bytes_max_rank` is the most any one rank received.
PLANE_SUMMED = ("state_plane/rows", "state_plane/bytes")
PLANE_MAX = ("state_plane/fetch_s",)


def merge_rank_metrics(per_rank: list[dict]) -> dict[str, float]:
    """One metrics dict for the group: global metrics from rank 0, the rest token-weighted over ranks (each rank
    reports `_tokens`, the response tokens it trained on), plus `tokens`, their sum."""
    weights = [float(m.get("_tokens", 0.0)) for m in per_rank]
    out = {k: v for k, v in per_rank[0].items() if k in GLOBAL_METRICS}
    keys = {k for m in per_rank for k in m if k not in GLOBAL_METRICS and k != "_tokens"}
    for k in sorted(keys):
        values = [m[k] for m in per_rank if k in m]
        if k in SUMMED_METRICS or k in PLANE_SUMMED:  # each rank's loss is its share of the global loss
            out[k] = sum(values)
            continue
        if k in PLANE_MAX:
            out[k] = max(values)
            continue
        pairs = [(m[k], w) for m, w in zip(per_rank, weights) if k in m and w > 0]
        if pairs:
            total = sum(w for _, w in pairs)
            out[k] = sum(v * w for v, w in pairs) / total
    out["tokens"] = sum(weights)
    if any("state_plane/bytes" in m for m in per_rank):
        out["state_plane/bytes_max_rank"] = max(m.get("state_plane/bytes", 0.0) for m in per_rank)
    return out


class RankActor:
    """Holds one `LearnerRank` once `setup` has run; `call` forwards a method call to it."""

    def __init__(self):
        self.rank = None

    def address(self) -> tuple[str, int]:
        """(node IP, a free port on this node): the rendezvous of the group when this is rank 0."""
        import ray

        from actors.deepspeed_setup import free_port

        return ray.util.get_node_ip_address(), free_port()

    def setup(
        self, cfg, rank: int, world_size: int, master_addr: str, master_port: int, one_machine: bool = False
    ) -> bool:
        """Build the rank, with `actors.deepspeed_setup.learner_threads` torch threads (this node's cores, the CPUs Ray
        reserved for this actor, and whether the whole job runs on one machine)."""
        import os

        import ray

        from actors.deepspeed_setup import learner_threads
        from actors.learner_rank import LearnerRank
        from actors.memory import HeapTrimmer

        reserved = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
        threads = learner_threads(cfg, os.cpu_count() or 1, reserved, one_machine)
        self.rank = LearnerRank(cfg, rank, world_size, master_addr, master_port, num_threads=threads)
        self.heap = HeapTrimmer(cfg.ray.trim_heap_every)
        return True

    def call(self, method: str, *args):
        if self.rank is None:
            raise RuntimeError("learner rank used before setup()")
        out = getattr(self.rank, method)(*args)
        if method == "update":  # now and then, malloc's freed heap back to the kernel (actors/memory.py)
            self.heap.after_batch()
        return out


class LearnerGroup:
    """`LearnerWorkers` over `RankActor` handles (rank i = actors[i])."""

    # After one rank's call fails, how long the others may take to fail too: a rank whose peer died fails in its
    # next collective, and that rank's death (not the peer's error) is what must be handled.
    PEER_ERROR_GRACE_S = 30.0

    def __init__(self, cfg, actors: list, make_rank=None, supervisor=None):
        if not actors:
            raise ValueError("LearnerGroup needs at least one learner actor")
        self.cfg, self.actors = cfg, actors
        self.make_rank, self.supervisor = make_rank, supervisor
        self.generation = 0  # counts rebuilds: a weight transport set up with the old ranks sets up again
        self._setup()

    def _setup(self, rebuilt: bool = False) -> None:
        import ray

        from actors.resources import cluster_address

        def get(refs: list) -> list:  # a rebuilt group's ranks must start within the call deadline
            if not rebuilt:
                return ray.get(refs)
            return wait_started(
                refs, "the rebuilt learner group", self._watch("setup after a rank was lost"), self.actors
            )

        ((addr, port),) = get([self.actors[0].address.remote()])
        one_machine = cluster_address(self.cfg) is None  # a private local Ray: every actor is on this machine
        get([a.setup.remote(self.cfg, r, len(self.actors), addr, port, one_machine) for r, a in enumerate(self.actors)])

    def _all(self, method: str, *args) -> list:
        return gather(
            lambda r: self.actors[r].call.remote(method, *args),
            len(self.actors),
            lambda r, error: self._rebuild(r, method, error),
            self.PEER_ERROR_GRACE_S,
            self._watch(method),
        )

    def _watch(self, method: str, samples: int = 0):
        """The deadline and waiting lines of a call to every rank (none without a supervisor)."""
        return self.supervisor and self.supervisor.watch(method, lambda r: f"learner rank {r}", samples)

    def _rebuild(self, dead: int, method: str, error: BaseException):
        """Every rank killed, a new group set up at the initial weights; then `LearnerRebuilt` (never returns)."""
        if self.make_rank is None or self.supervisor is None:
            raise error
        for a in self.actors:  # first: a hung rank must not outlive a stop raised by a spent restart bound
            kill(a)
        self.supervisor.replacing("learner", f"learner rank {dead}", method, error)
        self.actors = [self.make_rank(r) for r in range(len(self.actors))]
        self.generation += 1
        self._setup(rebuilt=True)
        raise LearnerRebuilt(f"learner rank {dead} died during {method}; the group was rebuilt")

    def pids(self) -> list[int]:
        """Each rank's actor process id (what a SIGKILL in the fault tests aims at)."""
        import ray

        return ray.get([a.pid.remote() for a in self.actors])

    def update(self, samples, advantages) -> dict[str, float]:
        import ray

        samples = list(samples)
        world = len(self.actors)
        rows = [rows_read(samples, self.cfg, world, r) for r in range(world)]  # before anything is fetched
        # One copy of the (state-free) samples in the object store; Ray resolves these top-level references to
        # values in each rank, but not the state references nested in the samples: each rank fetches its rows.
        samples_ref, adv_ref = ray.put(samples), ray.put([float(a) for a in advantages])
        return merge_rank_metrics(
            gather(
                lambda r: self.actors[r].call.remote("update", samples_ref, adv_ref, rows[r]),
                world,
                lambda r, error: self._rebuild(r, "update", error),
                self.PEER_ERROR_GRACE_S,
                self._watch("update", len(samples)),
            )
        )

    def mismatch_parts(self, samples, version: int) -> dict[str, float]:
        return self._all("mismatch_parts", list(samples), version)[0]  # rank 0 reports

    def export_weights(self, path: str) -> str:
        return self._all("export_weights", path)[0]

    def weight_checksums(self) -> dict[str, float]:
        return self._all("weight_checksums")[0]

    def export_adapter(self, directory: str) -> str | None:
        return self._all("export_adapter", directory)[0]

    def export_buckets(self, bucket_bytes: int) -> list:
        """Object references to rank 0's weights in Ray's object store (actors/weight_sync.py, `ray`)."""
        return self._all("export_buckets", bucket_bytes)[0]

    def start_native_sync(self, backend: str, client, init: dict) -> None:
        """vLLM's native weight transfer set up on every rank; rank 0 drives the engines (`client`). NCCL meets at
        a free port on rank 0's node."""
        import ray

        master = ray.get(self.actors[0].address.remote())
        self._all("start_native_sync", backend, client, init, master)

    def native_send(self) -> None:
        self._all("native_send")

    def save_checkpoint(self, directory: str) -> list[dict]:
        return self._all("save_checkpoint", directory)

    def load_checkpoint(self, directory: str) -> None:
        self._all("load_checkpoint", directory)

    def close(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []


def rank_actor_class():
    """`RankActor` as a Ray actor class (created lazily so importing this module does not need Ray); its process
    exits with its node's raylet (actors/supervision.py)."""
    return actor_class(RankActor)
