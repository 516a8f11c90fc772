"""The vLLM plugin's host-side bookkeeping, plain torch: a request as the model runner's tables describe it
(`RequestInfo`), one forward's requests (`StepBatch`), host values copied to the device without a stall
(`to_device`), the recorded states and preemption flags the worker extension pops per sample
(`StateRecords`), and the states a replay prefill fuses (`ReplayTable`)."""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

import torch


@dataclass
class RequestInfo:
    key: str | None  # the engine's per-sample key (None: not one of ours)
    mode: str  # standard | soft | fused
    record: bool  # record this request's states (for the learner, and to resume it after a preemption)
    prompt_len: int


@dataclass
class StepBatch:
    """One forward's requests as the host knows them (the model runner's CPU-side tables), so that the forward
    reads nothing back from the device. Requests are in batch order: decodes first, then prefills."""

    infos: list[RequestInfo]
    bounds: list[int]  # [num_reqs + 1] token offsets of the requests
    computed: list[int]  # [num_reqs] positions computed before this step (a request's first token's position)
    slot_live: list[bool]  # [num_reqs] whether the request's state slot holds its h_prev (written by it before)

    def last_position(self, i: int) -> int:
        return self.computed[i] + self.bounds[i + 1] - self.bounds[i] - 1


def to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host values as a device tensor without stalling the host: on an accelerator the copy goes from pinned
    memory, asynchronously (a copy from pageable memory waits for the stream's queued work)."""
    t = torch.as_tensor(values, dtype=dtype)
    return t if device.type == "cpu" else t.pin_memory().to(device, non_blocking=True)


class StateRecords:
    """Recorded states and preemption flags, keyed by the engine's per-sample key.

    Row indices live on the host (computed from the runner's host tables), states on the model's device; both
    are gathered when the worker extension pops them, so recording costs no per-step host sync.
    """

    def __init__(self):
        self.keys: list[str] = []  # one per recorded row
        self.rows: list[torch.Tensor] = []  # per step, [n] long on the host (row index within the sample)
        self.states: list[torch.Tensor] = []  # per step, [n, d] on the model's device
        self.preempted: set[str] = set()  # recomputed without their states: never train on them
        self.resumed: set[str] = set()  # recomputed with their recorded states fused (exact)

    def add(self, keys: list[str], rows: torch.Tensor, states: torch.Tensor) -> None:
        self.keys.extend(keys)
        self.rows.append(rows)
        self.states.append(states.detach().clone())

    def first_rows(self, key: str, count: int) -> torch.Tensor | None:
        """Rows 0..count-1 recorded for `key` ([count, d] on the model's device; a re-recorded row its latest
        value), or None if any is missing. Scans every record: for the rare resumption of a preempted request."""
        if count <= 0 or not self.keys:
            return None
        rows = torch.cat(self.rows).tolist()
        where = {r: i for i, (k, r) in enumerate(zip(self.keys, rows)) if k == key}  # the latest wins
        if any(r not in where for r in range(count)):
            return None
        ends = list(itertools.accumulate(len(r) for r in self.rows))
        picked = []
        for r in range(count):
            step = bisect.bisect_right(ends, where[r])
            picked.append(self.states[step][where[r] - (ends[step - 1] if step else 0)])
        return torch.stack(picked)

    def pop(self, keys: list[str]) -> tuple[dict[str, torch.Tensor], set[str], set[str]]:
        """States `[R_recorded, d]` (rows in order; a re-recorded row keeps its latest value) for the given keys,
        which of them were preempted (states lost) and which resumed (states fused again). Everything about these
        keys is forgotten."""
        wanted = set(keys)
        out: dict[str, torch.Tensor] = {}
        if self.keys:
            rows = torch.cat(self.rows)
            on_device = torch.cat(self.states)
            states = on_device.cpu()
            by_key: dict[str, dict[int, int]] = {}
            keep = []
            for i, (k, r) in enumerate(zip(self.keys, rows.tolist())):
                if k in wanted:
                    by_key.setdefault(k, {})[r] = i
                else:
                    keep.append(i)
            for k, row_to_i in by_key.items():
                order = [row_to_i[r] for r in sorted(row_to_i)]
                if sorted(row_to_i) != list(range(len(order))):  # a gap: only possible after a recompute
                    self.preempted.add(k)
                out[k] = states[order]
            idx = torch.tensor(keep, dtype=torch.long)
            self.keys = [self.keys[i] for i in keep]
            self.rows = [rows[idx]] if keep else []
            # what stays, stays where new rows are appended (a host tensor among device ones breaks the next cat)
            self.states = [on_device[idx.to(on_device.device)]] if keep else []
        preempted, resumed = self.preempted & wanted, self.resumed & wanted
        self.preempted -= wanted
        self.resumed -= wanted
        return out, preempted, resumed - preempted

    def clear(self) -> None:
        self.__init__()


class ReplayTable:
    """The recorded states a replay prefill fuses, per sample key: positions [k] (host, ascending) and states
    [k, d] (model device and dtype) of a continuation's fed positions (rl/samples/continuation.py)."""

    def __init__(self):
        self.by_key: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def put(self, key: str, positions: torch.Tensor, states: torch.Tensor) -> None:
        self.by_key[key] = (positions, states)

    def within(self, key: str, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(positions, states) of `key`'s fed positions in [start, end), or None."""
        got = self.by_key.get(key)
        if got is None:
            return None
        pos, states = got
        lo, hi = torch.searchsorted(pos, torch.tensor([start, end])).tolist()
        return (pos[lo:hi], states[lo:hi]) if hi > lo else None

    def drop(self, keys) -> None:
        for k in keys:
            self.by_key.pop(k, None)

    def clear(self) -> None:
        self.by_key.clear()
