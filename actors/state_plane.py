"""The state plane: how recorded states travel from rollout engines to learner ranks, never through the driver.

Replay needs every response token's recorded state on the learner (`d` numbers a token: 4 GB a step at the 1B
reference shape in bf16). Samples go through the driver (rewards, advantages); their states do not:

1. `pack` (in the rollout actor, after its engine returned the samples): the states of all its samples, one
   after the other, become ONE array, which the actor call returns as a second return value; each sample carries
   an `rl.samples.states.StateRef` (its first row and row count) in their place. Ray stores a return value of more
   than 100 KB in the object store of the actor's node, and its owner is the caller: the driver holds the reference, not
   the bytes, and the object outlives the actor that made it — a batch already generated and queued, or between
   `generate` and the ranks' fetch, keeps its states when its engine's actor is killed (`RolloutFleet.generate`
   `attach`es the reference to the samples). (A smaller one travels inline through the driver: a few KB.)
2. The learner group assigns rows to ranks from the update plan (`rl.train.update_plan.rows_read`, a function of row
   lengths only) before anything is fetched, and hands every rank the same list of samples plus its rows.
   A `StateRef` nested in that list is not resolved by Ray (only top-level task arguments are), so nothing moves.
3. `fetch` (in a rank): one `ray.get` of the objects its rows are in, and each row's slice in place. On the
   engine's node the arrays are read from shared memory without a copy (read-only views; collate copies them into
   the batch); across nodes Ray moves those objects (one per engine chunk: a rank pulls the whole chunk).

Objects are stored as numpy arrays (numpy has no bf16: bf16 goes as int16 bits, fp8 as its uint8 packing) because
Ray hands numpy arrays out of its shared memory zero-copy, while a pickled torch tensor is copied. An object lives
while some sample refers to it (Ray counts references across processes): the driver drops a step's samples after
the update, and the objects go. A fetch that still finds an object lost (its node died, or the driver that owns
it) raises Ray's ObjectLostError, never wrong data, and the learner group treats it as a death (rebuilt,
restored from the last checkpoint: actors/supervision.py `lost_object`).

`publish` is the older per-sample form (each sample's states one object, put and owned by the rollout actor, so
they die with it): `RolloutActor.generate` still answers direct calls with it.

In one process (`actors/local.py`) samples keep their tensors and none of this runs.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace

import torch

from rl.samples.batch import Sample
from rl.samples.states import StateRef, width

# storage dtype <-> what numpy carries (numpy has no bf16 or fp8: same-size integer views of the same bytes)
_CARRIER = {torch.float32: torch.float32, torch.bfloat16: torch.int16, torch.uint8: torch.uint8}
_FROM_CARRIER = {"float32": torch.float32, "int16": torch.bfloat16, "uint8": torch.uint8}


@dataclass
class FetchStats:
    """What one rank pulled for one update: rows, the bytes of those rows' states (across nodes Ray moves each
    whole object they are in), wall seconds."""

    rows: int = 0
    nbytes: int = 0
    seconds: float = 0.0

    def metrics(self) -> dict[str, float]:
        return {
            "state_plane/rows": float(self.rows),
            "state_plane/bytes": float(self.nbytes),
            "state_plane/fetch_s": self.seconds,
        }


def to_carrier(states: torch.Tensor):
    """The numpy array Ray stores for a stored-states tensor (same bytes)."""
    if states.dtype not in _CARRIER:
        raise TypeError(
            f"state plane: recorded states of dtype {states.dtype} (expected a storage format of rl/samples/states.py)"
        )
    return states.detach().cpu().contiguous().view(_CARRIER[states.dtype]).numpy()


def from_carrier(array) -> torch.Tensor:
    """The stored-states tensor over a carrier array, without copying (the array may be read-only shared memory;
    nothing writes to it: collate reads it into its own buffer)."""
    with warnings.catch_warnings():  # torch warns that the array is not writable; nothing writes to it
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array).view(_FROM_CARRIER[str(array.dtype)])


def publish(samples: list[Sample]) -> list[Sample]:
    """In the rollout actor: each sample's states into the object store as its own object (owned by this process:
    they die with it), a `StateRef` in their place."""
    import ray

    for s in samples:
        if isinstance(s.states, torch.Tensor):
            array = to_carrier(s.states)
            s.states = StateRef(
                ray.put(array), rows=int(s.states.shape[0]), width=width(s.states), nbytes=int(array.nbytes)
            )
    return samples


def pack(samples: list[Sample]):
    """In the rollout actor: (samples with a `StateRef` without handle in place of their states, one carrier array
    of all their states row after row, or None when none has states). The caller attaches the array's reference
    (`attach`)."""
    held = [s for s in samples if isinstance(s.states, torch.Tensor)]
    if not held:
        return samples, None
    if len({(s.states.dtype, s.states.shape[-1]) for s in held}) > 1:
        raise ValueError("state plane: one engine returned recorded states of different dtypes or widths")
    array = to_carrier(torch.cat([s.states for s in held]))
    row_bytes = array.nbytes // max(array.shape[0], 1)
    start = 0
    for s in held:
        rows = int(s.states.shape[0])
        s.states = StateRef(None, rows=rows, width=width(s.states), nbytes=rows * row_bytes, start=start)
        start += rows
    return samples, array


def attach(samples: list[Sample], handle) -> list[Sample]:
    """In the driver: the reference of the array `pack` made, into the samples' `StateRef`s."""
    for s in samples:
        if isinstance(s.states, StateRef) and s.states.handle is None:
            s.states = replace(s.states, handle=handle)
    return samples


def fetch(samples: list[Sample], rows) -> FetchStats:
    """In a learner rank: the states of `rows` (indices into `samples`), their objects fetched in one `ray.get` and
    each row's slice put in place of its `StateRef`. Other rows are left as they are: this rank never reads them."""
    t0 = time.perf_counter()
    want = sorted({r for r in rows if isinstance(samples[r].states, StateRef)})
    handles = list(dict.fromkeys(samples[r].states.handle for r in want))  # one per object, in order
    arrays = []
    if handles:
        import ray

        arrays = ray.get(handles)
    by_handle = dict(zip(handles, arrays))
    nbytes = 0
    for r in want:
        ref = samples[r].states
        samples[r].states = from_carrier(by_handle[ref.handle])[ref.start : ref.start + ref.rows]
        nbytes += ref.nbytes
    return FetchStats(len(want), nbytes, time.perf_counter() - t0)
