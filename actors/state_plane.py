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
the update, and the objects go. Their owner is the rollout actor that put them, so an engine actor that dies
takes its batch's states with it (a fetch then raises Ray's ObjectLostError, never wrong data).

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


def publish(samples: list[Sample]) -> list[Sample]:
    """In the rollout actor: each sample's states into the object store, a `StateRef` in their place."""
    import ray
    for s in samples:
        if isinstance(s.states, torch.Tensor):
            array = to_carrier(s.states)
            s.states = StateRef(ray.put(array), rows=int(s.states.shape[0]), width=width(s.states),
                                nbytes=int(array.nbytes))
    return samples


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

