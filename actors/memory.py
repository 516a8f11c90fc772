"""Memory hygiene of the long-lived actor processes: freed heap goes back to the kernel every few batches.

glibc's malloc keeps memory a process freed and reuses it, returning only the top of its heap to the kernel. A
rollout engine or a learner rank allocates and frees hundreds of MiB of temporaries every step (activations,
logits, recorded states, gradients), so its RSS ratchets up to the largest step it has seen and stays there: in
the soak (docs/RELIABILITY.md) an engine's RSS rose in jumps by ~150 MiB over its first 40 steps while its heap in
use was flat. `malloc_trim(0)` hands every free page back, so RSS falls to the memory in use.

Not after every batch: the trim itself is quick (11 ms in the default job's engine actor, 20 ms in a learner rank),
but the next batch faults those pages in again: trimming after every batch made the default job's median step
+5 % slower over two side-by-side comparisons on this machine (+12 % in one, +0 % in the other). Every
`ray.trim_heap_every` batches (10) pays a tenth of that and still resets the ratchet. docs/RELIABILITY.md, Soak.
"""

from __future__ import annotations

import ctypes

_libc = None


def release_freed_heap() -> bool:
    """glibc's `malloc_trim(0)`: True when it gave memory back; False, and nothing done, without glibc."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None)  # the symbols this process already has: libc's among them
            _libc.malloc_trim  # noqa: B018  (only glibc has it: musl and macOS raise AttributeError)
        except (OSError, AttributeError):
            _libc = False
    return bool(_libc and _libc.malloc_trim(0))


class HeapTrimmer:
    """Counts one process's batches; `release_freed_heap` after every `every`-th (0: never)."""

    def __init__(self, every: int):
        self.every, self.batches = int(every), 0

    def after_batch(self) -> bool:
        self.batches += 1
        return bool(self.every) and self.batches % self.every == 0 and release_freed_heap()
