"""State transfer per RL step, engine -> learner ranks, at a 135M shape: bytes through the driver, bytes into
each rank, seconds. Prints one JSON record per storage format.

    PYTHONPATH=<tree> python bench/state_plane.py [--samples 64] [--tokens 256] [--hidden 576]
        [--ranks 2] [--steps 5] [--formats bf16 fp32]

Runs against whichever fbrl tree is first on PYTHONPATH (run it as a file, not with -m, which would put the
working directory first), so the same script measures an older tree (before: states inside the samples, through
the driver) and this one (after: actors/state_plane.py). What runs is the project's own
transfer code: a local Ray; one rollout actor of `actors.rollout_fleet.rollout_actor_class()`; a `LearnerGroup` of
`--ranks` rank actors; the driver calls `fleet.generate` then `group.update`, as `rl.loop.train` does. Two stand-ins
keep everything but the transfer out of the timing: the actor's engine returns `--samples` samples of `--tokens`
response tokens with pre-recorded random `--hidden`-wide states at once (what vLLM's worker hands the engine at
this shape), and each rank, instead of a DeepSpeed update, takes its rows (fetching them where the tree does) and
collates them with their states (what `PolicyUpdater.update` does before any compute).

Per step:
- `driver_bytes`: what the driver deserialises from the engine (Ray's serialised size of the samples it gets) +
  what it puts for the ranks (the serialised sample list); `driver_state_bytes`: the part of it that is states
  (or their references), i.e. beyond the same samples without states; `driver_state_tensors`: state tensors in
  what it holds.
- `rank_bytes`: per rank, the sample list it receives + the state bytes it fetches itself; `share_bytes`: the
  state bytes of the rows it trains on.
- `transfer_s`: wall time of generate + update (median over steps after one warm-up step), and the slowest rank's
  time from the update call reaching it to its rows collated.
- `driver_peak_rss_mb`: the driver's peak resident memory (whole process; one format per run to compare).
- `engine_handover_s`: vLLM worker -> engine at this shape: main writes the states to a safetensors file in
  /dev/shm, reads and deletes it (timed here by doing exactly that); in-process (`inline`) it is the tensor itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import sys
import tempfile
import time

if not os.environ.get("PYTHONPATH"):  # no tree named: this one (the actors inherit PYTHONPATH, so set it too)
    os.environ["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.environ["PYTHONPATH"])

import torch  # noqa: E402

from rl.samples.batch import Sample, collate  # noqa: E402

try:  # this tree: recorded states travel through the state plane
    from actors import state_plane
except ImportError:  # main before it
    state_plane = None

DTYPES = {"fp32": ("float32", torch.float32), "bf16": ("bfloat16", torch.bfloat16), "fp8": ("float8_rowscale", None)}


def serialized_bytes(obj) -> int:
    """Bytes Ray's own serializer makes of `obj` (what crosses a process boundary); refs count as ids only."""
    import ray

    ctx = ray._private.worker.global_worker.get_serialization_context()
    return int(ctx.serialize(obj).total_bytes)


class PrerecordedEngine:
    """A rollout engine that returns pre-recorded samples at once: n prompts x 1 sample, `tokens` response tokens,
    random `hidden`-wide states in the requested storage format (built on first use, in the actor)."""

    version = 0

    def __init__(self, tokens: int, hidden: int, seed: int = 0):
        self.tokens, self.hidden, self.seed, self.states = tokens, hidden, seed, {}

    def _states(self, n, dtype):
        if (n, dtype) not in self.states:
            g = torch.Generator().manual_seed(self.seed)
            raw = torch.randn(n, self.tokens, self.hidden, generator=g)
            if dtype == "float8_rowscale":
                from rl.samples.states import encode

                self.states[(n, dtype)] = [encode(raw[i], dtype) for i in range(n)]
            else:
                self.states[(n, dtype)] = [raw[i].to(DTYPES_BY_NAME[dtype]).clone() for i in range(n)]
        return self.states[(n, dtype)]

    def generate(self, prompts, params, min_version=None):
        states = self._states(len(prompts), params.states_dtype)
        return [
            Sample(
                list(p),
                list(range(3, 3 + self.tokens)),
                [-1.0] * self.tokens,
                "length",
                self.version,
                states=states[i],
                group_id=i,
                decode_mode=params.decode_mode,
            )
            for i, p in enumerate(prompts)
        ]

    def load_weights(self, path, version):
        self.version = version


DTYPES_BY_NAME = {name: dt for name, dt in DTYPES.values() if dt is not None}


class ProbeRank:
    """Stands in for `actors.learner_rank.LearnerRank`: takes its rows (fetching them when the tree's samples carry
    references) and collates them with their states; records what came in."""

    def __init__(self, cfg, rank, world_size, *_):
        self.rank, self.world_size, self.last = rank, world_size, {}

    def update(self, samples, advantages, rows=None):
        t0 = time.perf_counter()
        fetched = 0
        if rows is None:  # main: the whole batch arrived; its plan gives a rank every world_size-th row
            rows = list(range(self.rank, len(samples), self.world_size))
        elif state_plane is not None:
            fetched = state_plane.fetch(samples, rows).nbytes
        batch = collate([samples[i] for i in rows], with_states=True)
        seconds = time.perf_counter() - t0
        share = sum(batch.states[i, : samples[r].response_len].numel() for i, r in enumerate(rows))
        self.last = {"rows": len(rows), "fetched_bytes": fetched, "seconds": seconds, "share_elements": share}
        return {"_tokens": float(sum(samples[i].response_len for i in rows))}

    def last_stats(self):
        return self.last


def probe_rank_actor_class():
    import ray

    from actors.learner_group import RankActor

    class ProbeRankActor(RankActor):
        def setup(self, cfg, rank, world_size, master_addr, master_port, *_):  # (later trees pass more)
            self.rank = ProbeRank(cfg, rank, world_size)
            try:  # trees whose RankActor trims the heap after updates: never here (only the transfer is timed)
                from actors.memory import HeapTrimmer

                self.heap = HeapTrimmer(0)
            except ImportError:
                pass
            return True

    return ray.remote(ProbeRankActor)


def engine_handover_seconds(n, tokens, hidden, dtype, repeats=3) -> float:
    """Main's vLLM worker -> engine handover at this shape: write the batch's states to a safetensors file in
    /dev/shm (tmp name + rename, as rollout/vllm_worker_ext.py did), read it, delete it. Median seconds."""
    from safetensors.torch import load_file, save_file

    states = torch.randn(n * tokens, hidden).to(DTYPES_BY_NAME[dtype])
    scratch = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    path = os.path.join(scratch, f"fbrl_bench_states_{os.getpid()}.safetensors")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        save_file({"states": states}, path + ".tmp")
        os.replace(path + ".tmp", path)
        loaded = load_file(path)["states"]
        os.remove(path)
        times.append(time.perf_counter() - t0)
        assert loaded.shape == states.shape
    return statistics.median(times)


def run(args) -> list[dict]:
    import ray

    from actors.learner_group import LearnerGroup
    from actors.placement import start_local_ray
    from actors.rollout_fleet import RolloutFleet, rollout_actor_class
    from rl.config import load_config
    from rl.samples.request import SamplingParams

    cfg = load_config(
        None,
        [
            "rollout.engine=torch",
            "likelihood.estimator=replay",
            f"learner.num_workers={args.ranks}",
            f"learner.micro_batch_size={args.samples}",
        ],
    )
    start_local_ray(num_cpus=max(os.cpu_count() or 1, args.ranks + 1), include_dashboard=False, log_to_driver=False)
    out = []
    try:
        engine = PrerecordedEngine(args.tokens, args.hidden)
        actor_cls = rollout_actor_class()
        fleet = RolloutFleet([actor_cls.remote(cfg, 0, engine)])
        ranks = [probe_rank_actor_class().remote() for _ in range(args.ranks)]
        group = LearnerGroup(cfg, ranks)
        prompts = [[1, 5, 6, 7] for _ in range(args.samples)]
        adv = [1.0, -1.0] * (args.samples // 2) + [0.0] * (args.samples % 2)
        for fmt in args.formats:
            name, _ = DTYPES[fmt]
            if fmt == "fp8" and state_plane is None:
                continue  # main has no fp8 storage
            params = SamplingParams(n=1, max_tokens=args.tokens, record_states=True, states_dtype=name)
            step_s, rank_s = [], []
            for step in range(args.steps + 1):
                t0 = time.perf_counter()
                samples = fleet.generate(prompts, params, 0)
                group.update(samples, adv)
                wall = time.perf_counter() - t0
                stats = ray.get([a.call.remote("last_stats") for a in ranks])
                if step > 0:  # the first step warms up both actors
                    step_s.append(wall)
                    rank_s.append(max(s["seconds"] for s in stats))
            received = serialized_bytes(samples)  # what the driver got from the engine and put for the ranks
            metadata = serialized_bytes([dataclasses.replace(s, states=None) for s in samples])  # tokens etc.
            element = {"fp32": 4, "bf16": 2, "fp8": 1}[fmt]
            row_bytes = (args.hidden + (4 if fmt == "fp8" else 0)) * element
            record = {
                "tree": "after (actors/state_plane.py)" if state_plane else "before (main)",
                "format": fmt,
                "samples": args.samples,
                "tokens": args.tokens,
                "hidden": args.hidden,
                "ranks": args.ranks,
                "steps": args.steps,
                "state_bytes_per_step": args.samples * args.tokens * row_bytes,
                "driver_bytes": 2 * received,
                "driver_state_bytes": 2 * (received - metadata),  # beyond the samples' tokens and log-probs
                "driver_state_tensors": sum(isinstance(s.states, torch.Tensor) for s in samples),
                "rank_bytes": [received + s["fetched_bytes"] for s in stats],
                "share_bytes": [s["share_elements"] // args.hidden * row_bytes for s in stats],
                "transfer_s": statistics.median(step_s),
                "transfer_s_all": step_s,
                "slowest_rank_s": statistics.median(rank_s),
                "engine_handover_s": 0.0
                if state_plane
                else engine_handover_seconds(args.samples, args.tokens, args.hidden, name),
                # the driver process's peak resident memory so far (run one format per process to read it per
                # format); it includes Ray's client and torch, so compare trees side by side, not to zero
                "driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "rl_tree": os.path.dirname(os.path.dirname(sys.modules["rl.samples.batch"].__file__)),
            }
            out.append(record)
            print(json.dumps(record), flush=True)
            del samples
    finally:
        ray.shutdown()
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--formats", nargs="+", default=["bf16", "fp32", "fp8"], choices=sorted(DTYPES))
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    run(args)


if __name__ == "__main__":
    main()
