"""Does the vLLM engine itself keep memory across generate calls? The default job's rollout shape, no Ray.

    python -m tools.engine_memory --steps 90 --every 10 [--no-record] [--reload] [--vary]
    python -m tools.engine_memory --steps 80 --every 10 --vary --alternate-trim

Builds one in-process `VLLMEngine` on checkpoints/tiny-arith (the tiny job's engine settings: 256 sequences,
fp32) and calls `generate` with 32 prompts x 8 samples per step (states recorded unless --no-record; --reload
loads the checkpoint's weights after every step, as a weight sync does; --vary draws new prompts of random lengths
every step, so batch shapes change as in a real job). Set ONEDNN_PRIMITIVE_CACHE_CAPACITY to compare oneDNN cache
sizes (the engine sets 64 unless it is set; oneDNN's own default is 1024). Every `--every` steps it runs
`gc.collect()` and glibc's `malloc_trim(0)` and prints RSS and the malloc heap in use (mallinfo2), so what it
prints is memory in use, not memory the allocator keeps; and the mean seconds per `generate` call.
docs/RELIABILITY.md ("What grew in the rollout actor") has the figures, with those of the same measurement
inside the Ray rollout actor of a real job.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from actors.memory import release_freed_heap  # noqa: E402
from tools.soak import memory_mib  # noqa: E402


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


def memory_in_use() -> tuple[float, float]:
    """(RSS, malloc heap in use) in MiB after a collection and a trim."""
    gc.collect()
    release_freed_heap()
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    return memory_mib(os.getpid())["rss_mib"], libc.mallinfo2().uordblks / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=90)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--reload", action="store_true")
    ap.add_argument(
        "--alternate-trim",
        action="store_true",
        help="every other interval, malloc_trim after each call (actors/memory.py with "
        "ray.trim_heap_every=1), so its cost is measured side by side with not trimming",
    )
    ap.add_argument(
        "--vary",
        action="store_true",
        help="new prompts of random lengths (4-40 tokens) every step, "
        "as a real job's, instead of the same 32 of 20 tokens",
    )
    args = ap.parse_args()
    from rl.samples.request import SamplingParams
    from rollout.vllm_engine import VLLMEngine

    ckpt = str(ROOT / "checkpoints" / "tiny-arith")
    engine = VLLMEngine(ckpt, max_model_len=128, max_num_seqs=256, dtype="float32", seed=0, kv_cache_gib=1)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 30) for _ in range(20)] for _ in range(32)]
    print("step  rss_mib  heap_in_use_mib  generate_s  trim_ms (means over the interval)", flush=True)
    seconds, trim_s = [], []
    for step in range(1, args.steps + 1):
        if args.vary:
            prompts = [[rng.randrange(3, 30) for _ in range(rng.randrange(4, 41))] for _ in range(32)]
        t0 = time.perf_counter()
        engine.generate(
            prompts, SamplingParams(n=8, temperature=1.0, max_tokens=32, seed=step, record_states=not args.no_record)
        )
        seconds.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        if args.alternate_trim and (step - 1) // args.every % 2 == 1:
            release_freed_heap()
        trim_s.append(time.perf_counter() - t0)
        if args.reload:
            engine.load_weights(str(Path(ckpt) / "model.safetensors"), step)
        if step % args.every == 0:
            rss, heap = memory_in_use()
            print(
                f"{step:>4}  {rss:7.1f}  {heap:7.1f}  {sum(seconds[-args.every :]) / args.every:9.3f}  "
                f"{sum(trim_s[-args.every :]) / args.every * 1000:7.1f}",
                flush=True,
            )
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
