"""Recorded states between engine and learner: their storage formats, and the handle that stands for them.

A sample's recorded states (`Sample.states`, row j = the state that predicted response token j) are stored in
one of these formats, chosen by `rollout.record_states_dtype` and applied by the engine that records them:

| format | `SamplingParams.states_dtype` | tensor | bytes per row |
|---|---|---|---|
| fp32 | `float32` | float32 `[R, d]` | 4·d |
| bf16 | `bfloat16` | bfloat16 `[R, d]` | 2·d |
| fp8 | `float8_rowscale` | uint8 `[R, d + 4]`: d float8_e4m3fn values of row / scale, then its fp32 scale | d + 4 |

fp8 keeps a scale per row (the row's absolute maximum / 448, e4m3's largest finite value), so every row uses the
whole fp8 range whatever its norm. `decode` turns any of them into fp32 for the learner; the replay-vs-exact error
each costs is what `fbrl compare-likelihood` prints per format (docs/BENCHMARKS.md).

`StateRef` is what a sample carries instead of the tensor when the states live elsewhere (in Ray's object store:
`actors/state_plane.py` makes and resolves them). `rl/` only passes it along; the learner resolves the rows it
trains on before it collates them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# SamplingParams.states_dtype values, and the config's names for them (rollout.record_states_dtype)
STATE_DTYPES = ("float32", "bfloat16", "float8_rowscale")
CONFIG_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp8": "float8_rowscale"}
FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
SCALE_BYTES = 4


def params_states_dtype(record_states_dtype: str, engines_on_gpu: bool) -> str:
    """The engines' storage format for a config value: `auto` is bf16 when the engines run on GPUs (the models
    there compute in bf16, and states are half the bytes) and fp32 otherwise."""
    if record_states_dtype == "auto":
        record_states_dtype = "bf16" if engines_on_gpu else "fp32"
    if record_states_dtype not in CONFIG_NAMES:
        raise ValueError(
            f"rollout.record_states_dtype: expected auto or one of {sorted(CONFIG_NAMES)}, got {record_states_dtype!r}"
        )
    return CONFIG_NAMES[record_states_dtype]


def encode(states: torch.Tensor, dtype: str) -> torch.Tensor:
    """[R, d] states (any float dtype) in storage format `dtype` (one of STATE_DTYPES)."""
    if dtype == "float32":
        return states.to(torch.float32)
    if dtype == "bfloat16":
        return states.to(torch.bfloat16)
    if dtype == "float8_rowscale":
        x = states.to(torch.float32)
        scale = (x.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
        q = (x / scale).to(FP8).view(torch.uint8)
        return torch.cat([q, scale.contiguous().view(torch.uint8)], dim=-1)
    raise ValueError(f"states dtype: expected one of {STATE_DTYPES}, got {dtype!r}")


def decode(stored: torch.Tensor) -> torch.Tensor:
    """fp32 [R, d] from any storage format (the tensor's dtype says which)."""
    if stored.dtype == torch.uint8:
        d = stored.shape[-1] - SCALE_BYTES
        values = stored[..., :d].contiguous().view(FP8).to(torch.float32)
        return values * stored[..., d:].contiguous().view(torch.float32)
    if stored.dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        return stored.to(torch.float32)
    raise TypeError(f"recorded states of dtype {stored.dtype}: not a storage format ({STATE_DTYPES})")


def width(stored: torch.Tensor) -> int:
    """d, the model's hidden size, of stored states."""
    return stored.shape[-1] - SCALE_BYTES if stored.dtype == torch.uint8 else stored.shape[-1]


@dataclass(frozen=True)
class StateRef:
    """A sample's recorded states held elsewhere: `handle` is opaque here (a Ray ObjectRef, made and resolved by
    actors/state_plane.py); `rows`, `width` (d) and `nbytes` describe what it stands for, so a learner can shape a
    batch and weigh rows without fetching anything. `start`: the sample's first row in the object (one object may
    hold the states of several samples, one after the other)."""

    handle: object
    rows: int
    width: int
    nbytes: int
    start: int = 0
