"""vLLM's native GPU weight transfer (nccl, ipc) through the same interface the CPU tests drive with native_ray.

    python -m tools.gpu.weight_sync_gpu [--transports ipc,nccl] [--model checkpoints/tiny-arith-mixed] [--reps 3]

For a machine with the full stack (vllm, ray, deepspeed) and CUDA GPUs; it is what tests/test_cluster.py checks
on CPU, with the GPU data plane: per transport the launcher's `build_workers` starts one vLLM engine and one
DeepSpeed learner rank (ZeRO-3: the sync gathers), sets the engine to perturbed weights (a file, version v), pushes
the learner's weights (the checkpoint's) with the transport as v + 1, and checks the engine's version and that its
live weights equal the checkpoint's (per-tensor checksums within rel 1e-6: the values arrive unchanged in fp32, the
checksum sums run on the GPU in another order); then times `--reps` pushes. `ipc` runs engine and learner on one GPU
(ray.colocate), `nccl` needs two GPUs (NCCL refuses two ranks on one device). Prints one JSON line per transport; exits
1 on a mismatch. Not run yet (it needs a GPU): docs/CLUSTER.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def check(transport: str, model: str, reps: int) -> dict:
    import ray
    import torch
    from safetensors.torch import save_file

    from actors.placement import build_workers
    from rl.config import load_config
    from rl.model.files import load_fbt
    from rl.train.workers import tensor_checksums

    colocate = transport == "ipc"
    cfg = load_config(
        str(ROOT / "configs" / "tiny.yaml"),
        [
            f"model.path={model}",
            "learner.num_workers=1",
            "learner.zero_stage=3",
            f"rollout.weight_sync={transport}",
            "rollout.num_gpus_per_engine=1" if not colocate else "rollout.num_gpus_per_engine=0.5",
            "learner.num_gpus_per_worker=1" if not colocate else "learner.num_gpus_per_worker=0.5",
            f"ray.colocate={str(colocate).lower()}",
            "rollout.vllm.gpu_memory_utilization=0.3",
        ],
    )
    rollout, learner, rewards = build_workers(cfg, use_ray=True)
    try:
        ref = {n: p.detach() for n, p in load_fbt(model).named_parameters()}
        want = tensor_checksums(ref.items())
        with tempfile.TemporaryDirectory() as tmp:
            noise = os.path.join(tmp, "noise.safetensors")
            save_file({k: (v + 1e-3 * torch.randn_like(v)).contiguous() for k, v in ref.items()}, noise)
            v = max(rollout.versions()) + 1
            rollout.load_weights(noise, v)
            t0 = time.perf_counter()
            path = os.path.join(tmp, "w.safetensors")
            versions = rollout.sync_weights(learner, v + 1, path)
            first_s = time.perf_counter() - t0
            got = rollout.all_weight_checksums()
            ok = versions == [v + 1] and all(
                abs(g[k] - want[k]) <= 1e-6 * max(1.0, abs(want[k])) for g in got for k in want
            )
            times = []
            for i in range(reps):
                t0 = time.perf_counter()
                rollout.sync_weights(learner, v + 2 + i, path)
                times.append(time.perf_counter() - t0)
        return {"transport": transport, "ok": ok, "versions": versions, "first_push_s": first_s, "push_s": times}
    finally:
        for w in (rollout, learner, rewards):
            w.close()
        ray.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--transports", default="ipc,nccl")
    ap.add_argument("--model", default=str(ROOT / "checkpoints" / "tiny-arith-mixed"))
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("weight_sync_gpu: no CUDA device; the CPU check of this path is tests/test_cluster.py (native_ray)")
        return 2
    failed = False
    for t in args.transports.split(","):
        if t == "nccl" and torch.cuda.device_count() < 2:
            print(json.dumps({"transport": t, "skipped": "nccl needs two GPUs (one for the engine, one for rank 0)"}))
            continue
        r = check(t, args.model, args.reps)
        print(json.dumps(r), flush=True)
        failed |= not r["ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
