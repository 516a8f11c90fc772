"""Is a process's RSS growth memory in use, or memory glibc's malloc keeps after it was freed?

    PYTHONPATH=. python bench/memory_retention.py --steps 40 --trim-every 10 --out runs/retention train.eval_every=0

Runs the default job (configs/tiny.yaml plus the overrides) with this process as the driver, and after every step
samples the memory of the driver and of the rollout actor (RSS, USS, and RSS by mapping: bench/soak.py). Every
`--trim-every` steps it calls glibc's `malloc_trim(0)` in both (in the actor through Ray's `__ray_call__`), which
hands every free page of every malloc arena back to the kernel, and samples again: what the trim gives back was
retained by the allocator, what stays is in use. Before each trim it also asks the actor's Ray core worker what it
holds (references, objects in its in-process memory store), and with --tracemalloc which lines of Python code
allocated what the actor's Python heap gained since the previous trim. Writes OUT/samples.jsonl and prints a summary.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from actors.memory import release_freed_heap  # noqa: E402
from soak import memory_mib, rss_by_mapping  # noqa: E402


def ray_holdings(actor=None) -> dict:
    """What this process's Ray core worker holds: entries in its reference table, and objects (and their bytes) in
    its in-process memory store, where Ray keeps small objects a process `ray.put`s instead of the shared object
    store. Runs inside the actor through `__ray_call__` (the actor instance is the argument)."""
    import ray
    core = ray._private.worker.global_worker.core_worker
    out = {"references": len(core.get_all_reference_counts())}
    for name in ("get_memory_store_size", "get_local_memory_store_bytes_used"):
        try:
            out[name.removeprefix("get_")] = getattr(core, name)()
        except Exception as e:  # noqa: BLE001 - a probe: report what this Ray version has
            out[name.removeprefix("get_")] = f"n/a ({type(e).__name__})"
    return out


def tracemalloc_growth(actor=None, top: int = 12) -> list[str]:
    """Python allocations that grew since the previous call (tracemalloc, started on the first call), by the line
    that allocated them. Runs inside the actor through `__ray_call__` (the actor instance keeps the snapshot)."""
    import tracemalloc
    if not tracemalloc.is_tracing():
        tracemalloc.start(8)
        actor.tracemalloc_snapshot = tracemalloc.take_snapshot()
        return ["tracemalloc started"]
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    stats = snap.compare_to(actor.tracemalloc_snapshot, "traceback")
    actor.tracemalloc_snapshot = snap
    total = sum(s.size_diff for s in stats) / 2**20
    out = [f"traced Python heap {sum(s.size for s in stats) / 2**20:.1f} MiB, {total:+.1f} MiB since the last call"]
    for s in stats[:top]:
        out.append(f"{s.size_diff / 2**20:+8.2f} MiB {s.count_diff:+7d} blocks  " +
                   " <- ".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in s.traceback[:4]))
    return out


def sample(pid: int) -> dict:
    return {**(memory_mib(pid) or {}), **(rss_by_mapping(pid) or {})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--trim-every", type=int, default=20)
    ap.add_argument("--out", default="runs/retention")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="also trace the actor's Python allocations and print what grew between trims")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    for k, v in dict(WANDB_MODE="offline", RAY_AUTH_MODE="disabled", VLLM_ENABLE_V1_MULTIPROCESSING="0",
                     TOKENIZERS_PARALLELISM="false").items():
        os.environ.setdefault(k, v)
    import ray

    from actors.placement import build_workers
    from rl.config import load_config
    from rl.data.tokenizer import load_tokenizer
    from rl.faults import FaultLog
    from rl.loop import train
    from rl.run import RunDir
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [f"train.steps={args.steps}", "logging.progress=false",
                                                       "logging.wandb_mode=disabled", f"train.run_dir={out / 'run'}",
                                                       *args.overrides])
    faults = FaultLog(print)
    rollout, learner, rewards = build_workers(cfg, True, faults)
    rows = []
    f = open(out / "samples.jsonl", "w")

    def record(step: int, when: str) -> None:
        for who, pid in (("driver", os.getpid()), ("rollout actor", rollout.pids()[0])):
            row = {"step": step, "when": when, "process": who, "pid": pid, **sample(pid)}
            rows.append(row)
            f.write(json.dumps(row) + "\n")
        f.flush()

    def after_step(metrics: dict) -> None:
        step = metrics["step"]
        record(step, "after step")
        if step % args.trim_every == 0:
            held = ray.get(rollout.actors[0].__ray_call__.remote(ray_holdings))
            print(f"step {step}: the rollout actor's Ray core worker holds {held}", flush=True)
            rows.append({"step": step, "when": "ray holdings", "process": "rollout actor", **held})
            if args.tracemalloc:
                print(f"step {step}: the rollout actor's Python allocations\n  " + "\n  ".join(
                    ray.get(rollout.actors[0].__ray_call__.remote(tracemalloc_growth))), flush=True)
            f.write(json.dumps(rows[-1]) + "\n")
            trimmed = (release_freed_heap(),
                       ray.get(rollout.actors[0].__ray_call__.remote(lambda actor: release_freed_heap())))
            record(step, f"after malloc_trim (released: driver {trimmed[0]}, actor {trimmed[1]})")

    try:
        train(cfg, load_tokenizer(cfg.model.path), rollout, learner, rewards, RunDir(str(out / "run")), log=print,
              progress=after_step, faults=faults)
    finally:
        ray.shutdown()
    keys = ("rss_mib", "uss_mib", "heap_mib", "anon_mib", "big_anon_mib", "plasma_mib", "file_mib")
    for who in ("driver", "rollout actor"):
        print(f"\n{who}: step, when, " + ", ".join(keys))
        for r in rows:
            if r["process"] == who and r["when"] == "ray holdings":
                print(f"{r['step']:4d} the actor's Ray core worker: " + str({k: v for k, v in r.items()
                                                                           if k not in ("step", "when", "process")}))
            elif r["process"] == who and (r["when"] != "after step" or r["step"] % 10 == 0 or r["step"] == 1):
                print(f"{r['step']:4d} {r['when']:<52} " + " ".join(f"{r.get(k, 0):8.1f}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
