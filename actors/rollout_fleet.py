"""Rollout actors (one per engine) and `RolloutFleet`, the loop's `RolloutWorkers` on Ray.

An engine is built from the config by `make_engine`, from `actors.engines`' registry: vLLM
(`rollout.vllm_engine.VLLMEngine`, the default) or the pure-torch reference engine (`rollout.torch_engine.TorchEngine`,
`rollout.engine: torch`). `EngineHost` holds one
engine in the process it lives in; `RolloutActor` is the same class as a Ray actor (vLLM in-process inside it:
`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the "uni" executor, so the engine starts in seconds and tensors stay in one
process). `RolloutFleet` splits a request's prompts into contiguous chunks, one per engine, and concatenates the
samples back in prompt order. Recorded states do not come back with them: each chunk's states are one object, the
call's second return value, left in the object store of the engine's node and owned by the driver (so they outlive
the actor), and the samples carry references (actors/state_plane.py), which the learner ranks resolve, each for its
rows.

Seeds: a chunk starting at prompt `c` runs with `seed + c * n`. vLLM seeds sample j of a request with `seed + j`,
so every sample gets the seed it would get from one engine serving the whole request (the fleet's output does not
depend on the number of engines); the torch engine's streams are keyed by (seed, prompt, sample) and the offset
keeps the chunks' streams distinct.
"""

from __future__ import annotations

import dataclasses
import time

from actors.engines import build_engine
from actors.resources import role_threads
from actors.supervision import (
    CallTimeout,
    actor_class,
    describe,
    gather,
    is_death,
    kill,
    lost_object,
    wait_started,
)
from rl.samples.batch import Sample
from rl.train.faults import hang_injected
from rl.train.workers import tensor_checksums


def make_engine(cfg, index: int = 0, weight_sync: str = "file"):
    """The engine the config asks for (`actors.engines`' registry), loaded from `model.path`, at policy version 0,
    ready for the resolved weight-sync transport (vLLM's native ones are set up at construction)."""
    return build_engine(cfg, index, weight_sync)


def engine_checksums(engine) -> dict[str, float]:
    """Per-tensor checksums of an engine's live weights: the engine's own method when it has one (vLLM reads
    them through its worker extension), else the torch engine's module."""
    if hasattr(engine, "weight_checksums"):
        return engine.weight_checksums()
    model = getattr(engine, "model", None)
    if model is None:
        raise TypeError(f"{type(engine).__name__} exposes neither weight_checksums() nor a torch model")
    return tensor_checksums(model.named_parameters())


def rollout_threads(cfg, cores: int, reserved_cpus: float, one_machine: bool) -> int:
    """torch / OpenMP threads of each engine (`rollout.num_threads`; the rule: `actors.resources.role_threads`)."""
    return role_threads(
        cfg.rollout.num_threads, cfg.rollout.num_engines, cfg.train.max_staleness, cores, reserved_cpus, one_machine
    )


class EngineHost:
    """One engine in this process; as a Ray actor it is `RolloutActor`. Besides generating it receives weights:
    `load_weights` (a file path, or `actors.weight_sync.RayBuckets`), and vLLM's native transfer, for which it is a
    `VLLMWeightSyncClient` endpoint (the four methods below `load_weights`, forwarded to the engine).
    `num_threads`: this process's torch / OpenMP threads, set before the engine is built (None: left as they are)."""

    def __init__(self, cfg, index: int = 0, engine=None, weight_sync: str = "file", num_threads: int | None = None):
        self.index = index
        if num_threads:
            import torch

            torch.set_num_threads(num_threads)
        self.engine = engine if engine is not None else make_engine(cfg, index, weight_sync)

    def generate(
        self, prompts: list[list[int]], params, min_version: int | None = None, continuations=None
    ) -> list[Sample]:
        if continuations is None:
            return self.engine.generate(prompts, params, min_version)
        return self.engine.generate(prompts, params, min_version, continuations=continuations)

    def load_weights(self, weights, version: int) -> int:
        from actors.weight_sync import RayBuckets

        if isinstance(weights, RayBuckets):
            weights = dict(weights.tensors())
        self.engine.load_weights(weights, version)
        return int(self.engine.version)

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.engine.init_weight_transfer_engine(init_info)

    def start_weight_update(self) -> None:
        self.engine.start_weight_update()

    def update_weights(self, update_info) -> None:
        self.engine.update_weights(update_info)

    def finish_weight_update(self, weight_version=None) -> None:
        self.engine.finish_weight_update(weight_version)

    def set_weight_version(self, version: int) -> int:
        """Tag the weights a native transfer installed as `version` (the engine refuses to generate until then)."""
        self.engine.set_weight_version(version)
        return int(self.engine.version)

    def version(self) -> int:
        return int(self.engine.version)

    def num_threads(self) -> int:
        import torch

        return torch.get_num_threads()

    def weight_checksums(self) -> dict[str, float]:
        return engine_checksums(self.engine)

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if callable(close):
            close()


def split_prompts(n_prompts: int, n_engines: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) chunks, sizes differing by at most one; empty chunks are left out."""
    base, extra = divmod(n_prompts, n_engines)
    out, start = [], 0
    for e in range(n_engines):
        end = start + base + (e < extra)
        if end > start:
            out.append((start, end))
        start = end
    return out


def chunk_params(params, start: int):
    """The request's params for a chunk starting at prompt `start` (see the module docstring on seeds)."""
    if start == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=params.seed + start * params.n)


def merge_chunks(chunks: list[tuple[int, list[Sample]]]) -> list[Sample]:
    """Samples of all chunks in prompt order, `group_id` made global (engines number their own prompts from 0)."""
    out = []
    for start, samples in chunks:
        for s in samples:
            s.group_id += start
            out.append(s)
    return out


class RolloutFleet:
    """`RolloutWorkers` over Ray actor handles of `RolloutActor` (one engine each). `transport` is the weight-sync
    transport (actors/weight_sync.py) `build_workers` chose for the placement.

    With `make_actor(i)` (a new actor for engine i, on its placement bundle) and a `supervisor`, an engine whose
    actor died is replaced (actors/supervision.py): the new one loads the last weights synced through
    `load_weights` (a file path or Ray buckets, same version) and the chunk of the request the dead one held is
    issued again, with the same seeds. vLLM's native transports (nccl, ipc, native_ray) sync without
    `load_weights`, so there is no last sync to replay, and their transfer group cannot take a new engine: once
    it is set up (the first sync), a death stops the job (`RunStopped`) instead of being replaced."""

    def __init__(self, actors: list, make_actor=None, supervisor=None, transport=None):
        from actors.weight_sync import FileSync

        if not actors:
            raise ValueError("RolloutFleet needs at least one rollout actor")
        self.actors = actors
        self.make_actor, self.supervisor = make_actor, supervisor
        self.transport = transport or FileSync()
        self.last_sync: tuple | None = None
        self._pids: list[int | None] = [None] * len(actors)

    def sync_weights(self, learner, version: int, weights_path: str) -> list[int]:
        return self.transport.push(learner, self, version, weights_path)

    def generate(self, prompts: list[list[int]], params, min_version: int, continuations=None) -> list[Sample]:
        """`continuations` (a multi-turn rollout's turns, rl/train/multiturn.py): the samples come back with their
        states fetched to this process, which builds the next turn's continuations from them."""
        from actors.state_plane import attach, fetch

        chunks = split_prompts(len(prompts), len(self.actors))
        states = {}  # chunk -> the reference to its states (the call's second return value, owned here)

        def submit(k):
            s, e = chunks[k]
            extra = () if continuations is None else (continuations[s:e],)
            samples, states[k] = (
                self.actors[k]
                .generate_packed.options(num_returns=2)
                .remote(prompts[s:e], chunk_params(params, s), min_version, *extra)
            )
            return samples

        def on_death(k, error):  # the chunk runs again on the replacement, with the same seeds
            self._replace(k, "generate", error)
            return submit(k)

        per_chunk = max(e - s for s, e in chunks) * params.n
        outs = gather(submit, len(chunks), on_death, watch=self._watch("generate", per_chunk))
        samples = merge_chunks([(s, attach(out, states[k])) for k, ((s, _), out) in enumerate(zip(chunks, outs))])
        if continuations is not None:
            fetch(samples, range(len(samples)))
        return samples

    def load_weights(self, weights, version: int) -> list[int]:
        """Every engine loads the weights as `version`: a file path is read on each engine's node (one node, or a
        filesystem all nodes share); `RayBuckets` are fetched from the object store by each engine. Kept as the
        last sync, which a replacement engine loads (the buckets stay alive while referenced here)."""
        self.last_sync = (weights, version)

        def on_death(k, error):  # the replacement loads `last_sync` itself
            self._replace(k, "load_weights", error)
            return self.actors[k].version.remote()

        load = lambda k: self.actors[k].load_weights.remote(weights, version)  # noqa: E731
        return gather(load, len(self.actors), on_death, watch=self._watch("load_weights"))

    def check_health(self) -> list[int]:
        """Ping every engine between calls (while the fleet is idle) and replace, before the next request, each one
        that is dead or has not answered within `faults.engine_ping_timeout_s` (the same path as a death during a
        call: killed first, counted against `faults.max_rollout_restarts`, the last sync reloaded; vLLM's native
        transfer stops the job instead). Returns the engines replaced. Off without a supervisor or at timeout 0."""
        import ray
        from ray.exceptions import GetTimeoutError

        timeout = self.supervisor.cfg.engine_ping_timeout_s if self.supervisor is not None else 0
        if not timeout:
            return []
        pings = [a.version.remote() for a in self.actors]
        deadline = time.monotonic() + timeout
        found = []  # (engine, why): every ping is read before any replacement, which takes seconds
        for k, ping in enumerate(pings):
            try:
                ray.get(ping, timeout=max(0.0, deadline - time.monotonic()))
            except GetTimeoutError:
                found.append(
                    (k, CallTimeout(f"no answer to a ping within {timeout:.0f} s (faults.engine_ping_timeout_s)"))
                )
            except Exception as e:
                if not is_death(e):
                    raise
                found.append((k, e))
        for k, error in found:
            self._replace(k, "the health check between steps", error)
        return [k for k, _ in found]

    def _watch(self, during: str, samples: int = 0):
        """The deadline and waiting lines of a call to every engine (none without a supervisor)."""
        return self.supervisor and self.supervisor.watch(during, lambda k: f"rollout actor {k}", samples)

    def set_weight_version(self, version: int) -> list[int]:
        import ray

        return ray.get([a.set_weight_version.remote(version) for a in self.actors])

    def _replace(self, k: int, during: str, error: BaseException) -> None:
        """A new actor for engine k at the current weights and version; raises when it may not be replaced."""
        what = f"rollout actor {k}" + (f" (pid {self._pids[k]})" if self._pids[k] else "")
        if self.make_actor is None or self.supervisor is None or lost_object(error):
            raise error  # (a lost object the call fetched, e.g. weights whose owner died: the engine is alive)
        kill(self.actors[k])  # first: a hung engine must not outlive a stop (a spent bound, a native transfer)
        if not getattr(self.transport, "replaceable", True):  # vLLM's native transfer, once set up
            raise self.transport.lost_engine(f"{what} died during {during} ({describe(error)})")
        self.supervisor.replacing("rollout", what, during, error)
        self.actors[k], self._pids[k] = self.make_actor(k), None
        new = self.actors[k]
        first = new.load_weights.remote(*self.last_sync) if self.last_sync is not None else new.version.remote()
        # (its engine is built in the constructor: the first call returns once it is up)
        wait_started([first], f"the new rollout actor {k}", self._watch(f"replacing it after {during}"), [new])

    def pids(self) -> list[int]:
        """Each engine's actor process id (what a SIGKILL in the fault tests aims at)."""
        import ray

        self._pids = ray.get([a.pid.remote() for a in self.actors])
        return list(self._pids)

    def weight_checksums(self) -> dict[str, float]:
        import ray

        return ray.get(self.actors[0].weight_checksums.remote())

    def all_weight_checksums(self) -> list[dict[str, float]]:
        """Per-tensor checksums of every engine's live weights, in engine order."""
        import ray

        return ray.get([a.weight_checksums.remote() for a in self.actors])

    def versions(self) -> list[int]:
        import ray

        return ray.get([a.version.remote() for a in self.actors])

    def close(self) -> None:
        import ray

        ray.get([a.close.remote() for a in self.actors])
        for a in self.actors:
            ray.kill(a)
        self.actors = []


class RolloutActor(EngineHost):
    """`EngineHost` as a Ray actor: the samples it returns carry references to their states, which stay in the
    object store of this actor's node (actors/state_plane.py), so states never pass through the driver."""

    def __init__(self, cfg, *args, **kwargs):
        from actors.memory import HeapTrimmer

        super().__init__(cfg, *args, **kwargs)
        self.heap = HeapTrimmer(cfg.ray.trim_heap_every)
        self.calls = 0

    def generate(self, prompts: list[list[int]], params, min_version: int | None = None) -> list[Sample]:
        """Samples whose states are objects this actor put and owns (they die with it): for direct calls."""
        from actors.state_plane import publish

        samples = publish(super().generate(prompts, params, min_version))
        self.heap.after_batch()  # now and then, malloc's freed heap back to the kernel (actors/memory.py)
        return samples

    def generate_packed(self, prompts: list[list[int]], params, min_version: int | None = None, continuations=None):
        """(samples, their states as one array or None): what `RolloutFleet` calls, with `num_returns=2`, so the
        states are a return value of their own, owned by the caller and kept when this actor dies
        (actors/state_plane.py)."""
        from actors.state_plane import pack

        self.calls += 1
        if hang_injected("GENERATE", self.calls):  # fault injection: a stuck engine (docs/RELIABILITY.md)
            time.sleep(24 * 3600)
        out = pack(super().generate(prompts, params, min_version, continuations))
        self.heap.after_batch()
        return out

    def referenced_objects(self) -> int:
        """Entries in this process's Ray reference table: a leak check (tests/test_actors.py). The fleet's calls
        (`generate_packed`) leave none behind (their states are owned by the caller); `generate`'s objects are
        owned here, one entry each while any sample, in any process, still refers to it."""
        import ray

        return len(ray._private.worker.global_worker.core_worker.get_all_reference_counts())


def rollout_actor_class():
    """`RolloutActor` as a Ray actor class (created lazily so importing this module does not need Ray); its process
    exits with its node's raylet (actors/supervision.py)."""
    return actor_class(RolloutActor)
