"""Weight sync: learner rank 0's weights onto every rollout engine, tagged with a policy version.

One interface, `push(learner, rollout, version, weights_path) -> [engine versions]` (the rollout workers'
`sync_weights`, which `rl/loop.py` calls after every update; `weights_path` is where the file transport writes),
and one transport per `rollout.weight_sync`:

| transport  | how the tensors travel                                              | needs                                  |
|------------|---------------------------------------------------------------------|----------------------------------------|
| file       | rank 0 writes `weights_path` (RUN_DIR/weights/policy.safetensors,  | every engine sees rank 0's filesystem  |
|            | atomic); every engine reads it                                      | (one node, or RUN_DIR on shared disk)  |
| ray        | rank 0 puts them in Ray's object store, `weight_sync_bucket_mb` per  | nothing shared; any cluster, CPU / GPU |
|            | object; every engine fetches the buckets (Ray's object manager      |                                        |
|            | moves them between nodes)                                           |                                        |
| nccl       | vLLM's NCCLTrainerWeightTransferEngine: rank 0 broadcasts over a    | GPU engines and learners; vllm engine  |
|            | NCCL group of rank 0 + one rank per engine                          |                                        |
| ipc        | vLLM's IPCTrainerWeightTransferEngine: CUDA IPC handles of the      | engines on the learners' GPUs          |
|            | learners' GPU tensors                                               | (ray.colocate: true)                   |
| native_ray | vLLM's native lifecycle as for nccl / ipc (init, start, update      | vllm engine; runs on CPU               |
|            | chunks, finish, version tag) with the tensors carried inside the    |                                        |
|            | update calls through Ray: the CPU check of the nccl / ipc path      |                                        |
| auto       | GPU engines and learners: ipc when colocated, else nccl; CPU: file   |                                        |
|            | when every engine is on rank 0's node, else ray                     |                                        |

The same for every transport:
- ZeRO-3: every rank takes part, parameters are gathered one at a time (a collective), rank 0 sends.
- Versions: an engine installs the weights as `version` (file, ray) or is tagged `version` after the transfer
  finished (native: between vLLM's start and the tag a VLLMEngine refuses to generate, its weights being half
  new); every engine refuses requests whose `min_version` is newer than its weights. `push` returns the versions
  and the loop checks them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from actors.engines import engine_kind
from actors.supervision import describe, lost_object
from rl.registry import lookup
from rl.train.faults import RunStopped

if TYPE_CHECKING:  # torch is imported where tensors are handled: `fbrl train`'s input checks use this module
    import torch


@dataclass(frozen=True)
class Transport:
    """A weight-sync transport by name (`rollout.weight_sync`): how it is made from the config and what it needs."""

    make: Callable  # (cfg) -> the transport (its `push`)
    gpu_only: bool = False  # moves GPU tensors: GPU engines and learners
    colocated_only: bool = False  # the engines sit on the learners' GPUs (ray.colocate)
    native: bool = False  # drives vLLM's native weight transfer (actors/weight_transfer.py)
    # the `rollout.engine` names it can reach; None: every engine (a state dict, `RolloutEngine.load_weights`)
    engines: tuple[str, ...] | None = None

    def serves(self, engine: str) -> bool:
        return self.engines is None or engine in self.engines


def engine_transports(engine: str) -> list[str]:
    """The transports engine `engine` can receive, in `TRANSPORTS` order."""
    return [name for name, t in TRANSPORTS.items() if t.serves(engine)]


def _bucket_bytes(cfg) -> int:
    return cfg.rollout.weight_sync_bucket_mb * 2**20


# Filled in below the classes: {name: Transport}. The config's `rollout.weight_sync` choices are these names and
# `auto` (tests/test_config_choices.py); an entry names the engines it serves unless it serves them all.
TRANSPORTS: dict[str, Transport] = {}


# ---- choosing the transport ---------------------------------------------------------------------------------
def transport_problem(cfg, in_process: bool) -> str | None:
    """Why `rollout.weight_sync` cannot work with the rest of the config (None: it can), naming both keys. Config
    only, so `fbrl train` refuses it before any worker starts (actors/cli/preflight.py); `in_process`: --no-ray."""
    r, want = cfg.rollout, cfg.rollout.weight_sync
    gpu = r.num_gpus_per_engine > 0 and cfg.learner.num_gpus_per_worker > 0
    if want != "auto":
        lookup(TRANSPORTS, "rollout.weight_sync", want)  # an unknown name: ValueError listing the valid ones
    if in_process and want not in ("auto", "file"):
        return (
            f"rollout.weight_sync={want!r} needs Ray actors; in-process workers (--no-ray) sync "
            f"through a file (rollout.weight_sync: file or auto)"
        )
    if want == "auto":
        return None
    engine_kind(r.engine)  # an unknown engine: ValueError listing the valid ones
    transport = TRANSPORTS[want]
    if not transport.serves(r.engine):
        why = "drives vLLM's native weight transfer" if transport.native else "is not one it can receive"
        return (
            f"rollout.weight_sync={want!r} {why}, but rollout.engine is {r.engine!r}: use rollout.weight_sync "
            f"{', '.join(engine_transports(r.engine))} or auto"
        )
    if transport.gpu_only and not gpu:
        return (
            f"rollout.weight_sync={want!r} moves GPU tensors: it needs rollout.num_gpus_per_engine > 0 "
            f"and learner.num_gpus_per_worker > 0 (on CPU use ray, or native_ray for vLLM's lifecycle)"
        )
    if transport.colocated_only and not cfg.ray.colocate:
        return (
            "rollout.weight_sync='ipc' shares GPU memory by CUDA IPC: the engines must sit on the "
            "learners' GPUs (ray.colocate: true); across GPUs or nodes use nccl"
        )
    return None


def resolve_transport(cfg, placement) -> tuple[str, str]:
    """(transport, why) for `rollout.weight_sync` given where the actors were placed (`actors.placement.Placement`;
    None: in-process workers). Raises ValueError naming the keys when the asked transport cannot work there."""
    r, want = cfg.rollout, cfg.rollout.weight_sync
    problem = transport_problem(cfg, in_process=placement is None)
    if problem:
        raise ValueError(problem)
    if placement is None:
        return "file", "in-process workers" if want == "auto" else "rollout.weight_sync"
    if want == "auto":
        gpu = r.num_gpus_per_engine > 0 and cfg.learner.num_gpus_per_worker > 0
        if gpu and {"ipc", "nccl"} <= set(engine_transports(r.engine)):
            if cfg.ray.colocate:
                return "ipc", "auto: the engines share the learners' GPUs (ray.colocate)"
            return "nccl", "auto: GPU engines and learners"
        if all(n == placement.learner_nodes[0] for n in placement.rollout_nodes):
            return "file", "auto: every engine is on learner rank 0's node"
        return "ray", "auto: engines on other nodes than learner rank 0"
    return want, "rollout.weight_sync"


def attach_transport(cfg, rollout, learner, transport: str, why: str, log=print) -> None:
    """Give the rollout workers their transport (their `sync_weights` uses it) and say which one it is."""
    rollout.transport = make_transport(cfg, transport)
    rollout.transport.log = log
    log(f"weight sync: {transport} ({why})")


def make_transport(cfg, transport: str):
    """The transport `transport` names (a resolved one: not `auto`)."""
    return lookup(TRANSPORTS, "rollout.weight_sync", transport).make(cfg)


# ---- file ---------------------------------------------------------------------------------------------------
class FileSync:
    name = "file"

    def push(self, learner, rollout, version: int, weights_path: str) -> list[int]:
        path = learner.export_weights(weights_path)
        try:
            return rollout.load_weights(path, version)
        except FileNotFoundError as e:
            raise RuntimeError(
                f"rollout.weight_sync=file: an engine cannot read {path}, which learner rank 0 wrote "
                f"on its node; put train.run_dir on storage every node sees, or use "
                f"rollout.weight_sync: ray (no shared storage needed)"
            ) from e


# ---- ray: buckets in the object store ----------------------------------------------------------------------
@dataclass
class RayBuckets:
    """References to the weights in Ray's object store: each bucket is {name: (dtype, shape, uint8 array)}.

    numpy arrays go into the object store without pickling their data (zero-copy out-of-band buffers) and are
    read back as views of shared memory on the engine's node; torch tensors would be pickled (copied)."""

    refs: list = field(default_factory=list)

    def tensors(self):
        """(name, tensor) of every bucket in turn (fetched one bucket at a time)."""
        import ray

        for ref in self.refs:
            yield from unpack_bucket(ray.get(ref)).items()


def pack_bucket(named: list[tuple[str, torch.Tensor]]) -> dict:
    import torch

    return {
        name: (
            str(t.dtype).removeprefix("torch."),
            tuple(t.shape),
            t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy(),
        )
        for name, t in named
    }


def unpack_bucket(bucket: dict) -> dict[str, torch.Tensor]:
    import torch

    with warnings.catch_warnings():  # the arrays are read-only views of the object store; nothing writes to them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return {
            name: torch.from_numpy(raw).view(getattr(torch, dtype)).reshape(shape)
            for name, (dtype, shape, raw) in bucket.items()
        }


def put_buckets(named_tensors, bucket_bytes: int) -> list:
    """`ray.put` the (name, tensor) stream in buckets of about `bucket_bytes`; entries whose tensor is None (the
    other ranks' share of a collective gather) are consumed and skipped. Returns the object references."""
    import ray

    refs, bucket, size = [], [], 0
    for name, t in named_tensors:
        if t is None:
            continue
        bucket.append((name, t))
        size += t.numel() * t.element_size()
        if size >= bucket_bytes:
            refs.append(ray.put(pack_bucket(bucket)))
            bucket, size = [], 0
    if bucket:
        refs.append(ray.put(pack_bucket(bucket)))
    return refs


class RaySync:
    name = "ray"

    def __init__(self, bucket_bytes: int):
        self.bucket_bytes = bucket_bytes

    def push(self, learner, rollout, version: int, weights_path: str) -> list[int]:
        # the buckets are owned by rank 0's process; the driver only passes their references on
        try:
            return rollout.load_weights(RayBuckets(learner.export_buckets(self.bucket_bytes)), version)
        except Exception as e:
            if not lost_object(e):
                raise
            # rank 0 died after putting them: asking the group again finds the death (the group is rebuilt and
            # raises LearnerRebuilt: the loop restores the last checkpoint), or exports them anew
            return rollout.load_weights(RayBuckets(learner.export_buckets(self.bucket_bytes)), version)


# ---- vLLM's native weight transfer (nccl, ipc) and its CPU check (native_ray) ---------------------------------
class NativeSync:
    """Rank 0 drives vLLM's trainer-side weight-transfer engine; the engines are its `VLLMWeightSyncClient`
    (`EngineFleetClient`). The transfer group is set up at the first push (every rank joins: ZeRO-3 gathers).

    From then on the group is fixed: rank 0's client holds the engines' handles of that moment, and an NCCL group
    has one rank per engine. A replacement engine cannot join it (`replaceable` turns false: the fleet stops the
    job instead of replacing, `fbrl train --resume` starts a new group). A dead engine must not read as a dead
    learner: rank 0's call on it raises ActorDiedError inside rank 0's method, which Ray hands the driver as
    RayTaskError(ActorDiedError), an actor death of rank 0 itself, and the learner group would be rebuilt. So a
    push checks first that every engine is alive, and rank 0's client reports an engine that dies during the
    transfer as `EngineLost`; both stop the job."""

    def __init__(self, backend: str, bucket_bytes: int, log=print):
        self.name, self.bucket_bytes, self.started, self.log = backend, bucket_bytes, False, log
        self.generation = 0  # the learner group's generation the transfer was set up with (rebuilds count up)
        self.fallback = None  # RaySync, once a rebuilt learner group could not set up vLLM's transfer again

    @property
    def replaceable(self) -> bool:
        """Whether a dead engine may be replaced: before the transfer group exists, or once the weights go through
        Ray's object store instead (`fallback`: replacements reload the last sync)."""
        return not self.started or self.fallback is not None

    def _after_rebuild(self, learner) -> None:
        """The learner group was rebuilt since the transfer was set up: its new ranks hold no transfer engine and
        the engines' side still points at the dead rank 0. native_ray sets the transfer up again with the new ranks
        (its engine side is plain Python state, renewed by `init`); nccl and ipc fall back to the ray transport for
        the rest of the job, saying so (an NCCL group cannot take a new rank 0 in place of a dead one)."""
        generation = getattr(learner, "generation", 0)
        if not self.started or generation == self.generation:
            return
        self.generation = generation
        if self.name == "native_ray":
            self.started = False
            self.log(
                f"weight sync: the learner group was rebuilt; rollout.weight_sync={self.name}: setting up the "
                f"transfer again with the new ranks"
            )
            return
        self.fallback = RaySync(self.bucket_bytes)
        self.log(
            f"weight sync: the learner group was rebuilt and rollout.weight_sync={self.name}'s transfer group "
            f"cannot take its new rank 0: weights go through Ray's object store (rollout.weight_sync: ray) "
            f"for the rest of this job; `fbrl train --resume RUN_DIR` sets up {self.name} again"
        )

    def lost_engine(self, what: str) -> RunStopped:
        return RunStopped(
            f"{what}; rollout.weight_sync={self.name}: a new engine cannot join vLLM's weight-transfer "
            f"group once it is set up, so the job stops here; `fbrl train --resume RUN_DIR` continues "
            f"from the last checkpoint (or use rollout.weight_sync: ray, whose replacement engines "
            f"reload the last sync)"
        )

    def push(self, learner, rollout, version: int, weights_path: str) -> list[int]:
        self._after_rebuild(learner)
        if self.fallback is not None:
            return self.fallback.push(learner, rollout, version, weights_path)
        if self.started:
            from ray.exceptions import RayActorError

            try:
                rollout.versions()
            except RayActorError as e:
                raise self.lost_engine(
                    f"a rollout engine died before the weight sync to version {version} ({describe(e)})"
                ) from None
        try:
            if not self.started:
                client = EngineFleetClient(rollout.actors, per_engine_rank=self.name == "nccl")
                learner.start_native_sync(
                    self.name, client, {"world_size": 1 + len(rollout.actors), "bucket_bytes": self.bucket_bytes}
                )
                self.started, self.generation = True, getattr(learner, "generation", 0)
            learner.native_send()
        except EngineLost as e:  # died after the check above, during the transfer (Ray wraps it: RayTaskError.cause)
            raise self.lost_engine(f"{getattr(e, 'cause', e)} (weight sync to version {version})") from None
        return rollout.set_weight_version(version)


class EngineLost(RuntimeError):
    """A rollout engine died during a native transfer (raised in learner rank 0 by `EngineFleetClient`). Not a
    RayActorError on purpose: raised from rank 0's method, that would read as rank 0's own death."""


class EngineFleetClient:
    """vLLM's `VLLMWeightSyncClient` protocol over our rollout actors (`actors.rollout_fleet.EngineHost`): every call
    goes to every engine and waits for all. Picklable (actor handles), so learner rank 0 holds it.

    NCCL: vLLM computes a worker's rank in the transfer group as rank_offset + its data-parallel index, which is
    0 in every one of our engines (each is its own LLM); so engine i is given rank_offset 1 + i (one worker per
    engine: tensor_parallel_size is 1), and the group is rank 0 + E engine ranks."""

    def __init__(self, handles: list, per_engine_rank: bool = False):
        self.handles, self.per_engine_rank = list(handles), per_engine_rank

    def _all(self, method: str, *args) -> list:
        return self._get(method, [getattr(h, method).remote(*args) for h in self.handles])

    @staticmethod
    def _get(method: str, refs: list) -> list:
        import ray
        from ray.exceptions import RayActorError

        try:
            return ray.get(refs)
        except RayActorError as e:
            raise EngineLost(
                f"a rollout engine died during the native weight transfer ({method}: {describe(e)})"
            ) from None

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        infos = [
            dict(init_info, rank_offset=1 + i) if self.per_engine_rank else init_info for i in range(len(self.handles))
        ]
        self._get(
            "init_weight_transfer_engine",
            [h.init_weight_transfer_engine.remote(info) for h, info in zip(self.handles, infos)],
        )

    def start_weight_update(self) -> None:
        self._all("start_weight_update")

    def update_weights(self, update_info) -> None:
        import ray

        self._all("update_weights", ray.put(update_info))  # one copy in the object store for all engines

    def finish_weight_update(self, weight_version=None) -> None:
        self._all("finish_weight_update", weight_version)


TRANSPORTS.update(
    file=Transport(lambda cfg: FileSync()),
    ray=Transport(lambda cfg: RaySync(_bucket_bytes(cfg))),
    nccl=Transport(lambda cfg: NativeSync("nccl", _bucket_bytes(cfg)), gpu_only=True, native=True, engines=("vllm",)),
    ipc=Transport(
        lambda cfg: NativeSync("ipc", _bucket_bytes(cfg)),
        gpu_only=True,
        colocated_only=True,
        native=True,
        engines=("vllm",),
    ),
    native_ray=Transport(lambda cfg: NativeSync("native_ray", _bucket_bytes(cfg)), native=True, engines=("vllm",)),
)
NATIVE = tuple(name for name, t in TRANSPORTS.items() if t.native)
