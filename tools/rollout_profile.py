"""The rollout of a job in one process, request by request: the thing to run under a profiler.

    python -m tools.rollout_profile [--config configs/tiny.yaml] [--threads 1] [--reps 12] [key=value ...]
    py-spy record -r 200 -f raw -o rollout.ss -- python -m tools.rollout_profile --reps 12 \\
        rollout.decode_mode=standard likelihood.estimator=standard

Builds the engine as the rollout actor does (`actors.rollout_fleet.make_engine`: vLLM or torch, per `rollout.engine`),
then generates `--reps` requests of the job as the loop makes them (`train.prompts_per_step` prompts drawn by the
loop's sampler, `rl.train.requests.sampling_params`: stop at EOS, the estimator's state recording), printing each
request's wall and CPU seconds and tokens, and the engine's start-up time. The first request carries whatever a
fresh engine process pays once (allocations, kernel selection, any JIT); the median of the others is the steady
state.

    python -m tools.rollout_profile --threads 2 --compact 0,0.25 rollout.decode_mode=standard

`--compact A,B,...` (the torch engine): each request is generated once per value of the engine's
`COMPACT_FRACTION` (the share of a batch that stopped rows reach before they leave it), in turn, and the medians
are printed side by side with whether every value gave the same tokens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"))
    ap.add_argument("--threads", type=int, default=1, help="torch / OpenMP threads (rollout.num_threads)")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--compact", default=None, help="torch engine: COMPACT_FRACTION values to alternate, e.g. 0,0.25")
    ap.add_argument("overrides", nargs="*", help="fbrl config overrides (key=value)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from actors.rollout_fleet import make_engine
    from bench.rollout_speed import job_prompts
    from rl.config import load_config
    from rl.data.loaders import PromptSampler, load_task_split
    from rl.data.prompts import PromptFitter, prompt_token_limit
    from rl.train.requests import sampling_params

    cfg = load_config(args.config, args.overrides)
    _, tok = job_prompts(cfg)
    fitter = PromptFitter(tok, prompt_token_limit(cfg), cfg.data.overlong_prompts)
    rows, _ = fitter.fit(load_task_split(cfg.data, "train", tokenizer=tok), "train data")
    sampler = PromptSampler(rows, seed=cfg.train.seed)
    t = time.perf_counter()
    engine = make_engine(cfg)
    print(
        f"rollout_profile: {cfg.rollout.engine} engine up in {time.perf_counter() - t:.1f} s, "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )
    if args.compact is not None:
        return compare_compaction(engine, fitter, sampler, cfg, tok, args)
    walls = []
    for k in range(args.reps):
        prompts = [fitter.encode(r) for r in sampler.next(cfg.train.prompts_per_step)]
        t, c = time.perf_counter(), time.process_time()
        samples = engine.generate(prompts, sampling_params(cfg, tok.eos_token_id, seed=k))
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        walls.append(wall)
        tokens = sum(s.response_len for s in samples)
        print(
            f"rollout_profile: request {k}: {wall:.3f} s wall, {cpu:.3f} s cpu, {tokens} tokens "
            f"({tokens / wall:.0f} tokens/s)",
            flush=True,
        )
    if len(walls) > 1:
        print(
            f"rollout_profile: first request {walls[0]:.2f} s, median of the rest {statistics.median(walls[1:]):.3f} s",
            flush=True,
        )
    return 0


def compare_compaction(engine, fitter, sampler, cfg, tok, args) -> int:
    """`--compact`: every request once per COMPACT_FRACTION value, in turn; medians side by side (the first
    request of each value, which pays the engine's warm-up, left out)."""
    import rollout.torch_engine as torch_engine
    from rl.train.requests import sampling_params

    values = [float(v) for v in args.compact.split(",")]
    walls = {v: [] for v in values}
    same = True
    for k in range(args.reps):
        prompts = [fitter.encode(r) for r in sampler.next(cfg.train.prompts_per_step)]
        outputs = []
        for v in values:
            torch_engine.COMPACT_FRACTION = v
            t = time.perf_counter()
            samples = engine.generate(prompts, sampling_params(cfg, tok.eos_token_id, seed=k))
            walls[v].append(time.perf_counter() - t)
            outputs.append([s.response_ids for s in samples])
        same = same and all(o == outputs[0] for o in outputs)
    medians = {v: statistics.median(w[1:] or w) for v, w in walls.items()}
    line = ", ".join(f"{v:g}: {m:.3f} s ({m / medians[values[0]]:.2f}x)" for v, m in medians.items())
    print(f"rollout_profile: COMPACT_FRACTION median s/request {line}; same tokens: {same}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
