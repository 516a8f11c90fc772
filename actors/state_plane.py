"""The state plane: how recorded states travel from rollout engines to learner ranks, never through the driver.

Replay needs every response token's recorded state on the learner (`d` numbers a token: 4 GB a step at the 1B
reference shape in bf16). Samples go through the driver (rewards, advantages); their states do not:

1. `publish` (in the rollout actor, after its engine returned the samples): each sample's states go into Ray's
   object store as one object, put by the actor itself, and the sample carries an `rl.states.StateRef` in their
   place. The driver receives and forwards samples of a few hundred bytes each.
2. The learner group assigns rows to ranks from the update plan (`rl.learner.rows_read`, a function of row
   lengths only) before anything is fetched, and hands every rank the same list of samples plus its rows.
   A `StateRef` nested in that list is not resolved by Ray (only top-level task arguments are), so nothing moves.
3. `fetch` (in a rank): one `ray.get` of the references of its rows only, in place. On the engine's node the
   arrays are read from shared memory without a copy (read-only views; collate copies them into the batch);
   across nodes Ray moves exactly those objects.

Objects are stored as numpy arrays (numpy has no bf16: bf16 goes as int16 bits, fp8 as its uint8 packing) because
Ray hands numpy arrays out of its shared memory zero-copy, while a pickled torch tensor is copied. An object lives
while some sample refers to it (Ray counts references across processes): the driver drops a step's samples after
the update, and the objects go.

Ownership: Ray drops an object when its owner process dies, and by default the owner is the process that put it.
The rollout actor puts the states but does not own them: a `StateOwner` actor (one per job, created with the
fleet, on the driver's node) owns them (`ray.put(..., _owner=...)`), so a batch already generated and queued,
or between `generate` and the ranks' fetch, keeps its states when its engine's actor is killed; the bytes stay
in the engine node's shared memory. A fetch that still finds an object lost (the owner's or that node's death)
raises Ray's ObjectLostError, never wrong data, and the learner group treats it as a death: rebuilt, restored
from the last checkpoint (actors/supervision.py `lost_object`).

In one process (`actors/local.py`) samples keep their tensors and none of this runs.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import torch

from rl.batch import Sample
from rl.states import StateRef, width

# storage dtype <-> what numpy carries (numpy has no bf16 or fp8: same-size integer views of the same bytes)
_CARRIER = {torch.float32: torch.float32, torch.bfloat16: torch.int16, torch.uint8: torch.uint8}
_FROM_CARRIER = {"float32": torch.float32, "int16": torch.bfloat16, "uint8": torch.uint8}


@dataclass
class FetchStats:
    """What one rank pulled for one update: rows, bytes, wall seconds."""
    rows: int = 0
    nbytes: int = 0
    seconds: float = 0.0

    def metrics(self) -> dict[str, float]:
        return {"state_plane/rows": float(self.rows), "state_plane/bytes": float(self.nbytes),
                "state_plane/fetch_s": self.seconds}


def to_carrier(states: torch.Tensor):
    """The numpy array Ray stores for a stored-states tensor (same bytes)."""
    if states.dtype not in _CARRIER:
        raise TypeError(f"state plane: recorded states of dtype {states.dtype} (expected a storage format of "
                        f"rl/states.py)")
    return states.detach().cpu().contiguous().view(_CARRIER[states.dtype]).numpy()


def from_carrier(array) -> torch.Tensor:
    """The stored-states tensor over a carrier array, without copying (the array may be read-only shared memory;
    nothing writes to it: collate reads it into its own buffer)."""
    with warnings.catch_warnings():  # torch warns that the array is not writable; nothing writes to it
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array).view(_FROM_CARRIER[str(array.dtype)])


def publish(samples: list[Sample], owner=None) -> list[Sample]:
    """In the rollout actor: each sample's states into the object store, a `StateRef` in their place. `owner`:
    the `StateOwner` actor that owns the objects (None: this process owns them and they die with it)."""
    import ray
    for s in samples:
        if isinstance(s.states, torch.Tensor):
            array = to_carrier(s.states)
            handle = ray.put(array) if owner is None else ray.put(array, _owner=owner)
            s.states = StateRef(handle, rows=int(s.states.shape[0]), width=width(s.states), nbytes=int(array.nbytes))
    return samples


class StateOwner:
    """Owns the recorded states the rollout actors put (`publish`), so that they outlive the actor that put them.
    Does nothing else: an owner keeps the objects' reference counts and locations, the bytes stay where they were
    put."""

    def alive(self) -> bool:
        return True

    def owned_objects(self) -> int:
        """Entries in this process's reference table: one per live state object (a leak check)."""
        import ray
        return len(ray._private.worker.global_worker.core_worker.get_all_reference_counts())


def start_state_owner():
    """The job's `StateOwner` actor, on the driver's node (soft: elsewhere if that node cannot take it), taking no
    CPU; its process exits with its node's raylet."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from actors.supervision import actor_class
    here = ray.get_runtime_context().get_node_id()
    return actor_class(StateOwner).options(
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True)).remote()


def fetch(samples: list[Sample], rows) -> FetchStats:
    """In a learner rank: the states of `rows` (indices into `samples`), fetched in one `ray.get` and put in
    place of their `StateRef`s. Other rows are left as they are: this rank never reads them."""
    t0 = time.perf_counter()
    want = sorted({r for r in rows if isinstance(samples[r].states, StateRef)})
    arrays = []
    if want:
        import ray
        arrays = ray.get([samples[r].states.handle for r in want])
    for r, array in zip(want, arrays):
        samples[r].states = from_carrier(array)
    return FetchStats(len(want), sum(int(a.nbytes) for a in arrays), time.perf_counter() - t0)

