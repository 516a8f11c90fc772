"""How the GPU benchmark (tools/gpu/gpu_bench.py) measures: wall seconds of device work (`Clock`: the accelerator
synchronized around what it times), a time budget the sections share (`Budget`), and peak memory above what was
allocated before (`peak_memory`, in GiB by `gib`). Torch only.
"""

from __future__ import annotations

import time

import torch


class Clock:
    """Wall seconds of device work: synchronizes the accelerator around what it times."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fn):
        self.sync()
        t = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - t, out


class Budget:
    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


def peak_memory(device: torch.device, fn):
    """(result, peak bytes allocated above what was allocated before) of fn(); None off CUDA."""
    if device.type != "cuda":
        return fn(), None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    out = fn()
    torch.cuda.synchronize()
    return out, torch.cuda.max_memory_allocated(device) - base


def gib(n):
    return None if n is None else round(n / 2**30, 3)
