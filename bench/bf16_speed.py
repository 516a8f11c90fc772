"""Whether this CPU runs bf16 faster than fp32: forward + backward of a SmolLM2-135M-shaped MLP (hidden 576, 1536
wide, 512 tokens), fp32 against bf16 autocast, side by side in one process (5 rounds of 20, alternating; medians).

    python -m bench.bf16_speed [--threads N]

Prints torch's vector ISA, the /proc/cpuinfo flag of native bf16 arithmetic if any (actors/resources.py), both
times and fp32 / bf16 (above 1: bf16 is faster here).
"""

from __future__ import annotations

import argparse
import time

import torch

from actors.resources import native_bf16_flag


def mlp_step(x, w1, w2, w3, bf16: bool) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        y = (torch.nn.functional.silu(x @ w1.T) * (x @ w2.T)) @ w3.T
    y.float().square().mean().backward()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: every core)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 576, generator=g).requires_grad_()
    weights = [(torch.randn(*shape, generator=g) * 0.02).requires_grad_() for shape in ((1536, 576),) * 2]
    weights.append((torch.randn(576, 1536, generator=g) * 0.02).requires_grad_())
    times = {"fp32": [], "bf16": []}
    for bf16 in (False, True):  # warm-up
        for _ in range(3):
            mlp_step(x, *weights, bf16)
    for _ in range(5):
        for name in times:
            t0 = time.perf_counter()
            for _ in range(20):
                mlp_step(x, *weights, name == "bf16")
            times[name].append(time.perf_counter() - t0)
    fp32, bf16 = (sorted(times[k])[2] for k in ("fp32", "bf16"))
    print(
        f"torch {torch.__version__}, CPU {torch.backends.cpu.get_cpu_capability()}, native bf16 flag: "
        f"{native_bf16_flag() or 'none'}, {torch.get_num_threads()} threads: fp32 {fp32:.3f} s, bf16 {bf16:.3f} s "
        f"per 20 steps; fp32 / bf16 = {fp32 / bf16:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
