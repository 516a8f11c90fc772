"""Prefix caching in the vLLM engine: the same work with caching on and off, side by side, printed as JSON.

    python -m bench.prefix_cache [--model DIR] [--reps N] [--prefix N] [--max-model-len N]
    python -m bench.prefix_cache --config configs/smollm_rl.yaml [--eval-n N] [--reps N]

Two workloads whose prompts share a few-shot prefix of `--prefix` tokens (a system message and worked
examples, as in the word-problem jobs) plus a 10..30-token question each:
  rollout: G = 4 samples (T = 1, soft mode) of 8 prompts, 16 new tokens each;
  eval: greedy decoding of 64 problems, 16 new tokens each.
With `--config`, a job's own workloads instead: its engine (`rollout.*`, `model.*`), one step's rollout
(`train.prompts_per_step` training prompts, its sampling parameters and stop token) and a held-out greedy
evaluation of `--eval-n` test problems, as the job's loop requests them.
Each engine runs each workload `--reps` times, interleaved, and keeps its fastest wall time; a speedup is
off / on. Both engines' greedy tokens are compared (they must be equal). One intra-op thread per process.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from rl.samples.request import SamplingParams
from rollout.vllm_engine import VLLMEngine


def workload(vocab: int, prefix_len: int, n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    prefix = [1] + torch.randint(3, vocab, (prefix_len - 1,), generator=g).tolist()
    return [prefix + torch.randint(3, vocab, (int(k),), generator=g).tolist() for k in torch.randint(10, 31, (n,))]


def synthetic(args):
    """(engines, workloads) of random prompts sharing a `--prefix`-token prefix."""
    engines = {
        name: VLLMEngine(
            args.model, max_model_len=args.max_model_len, max_num_seqs=64, seed=0, enable_prefix_caching=on
        )
        for name, on in (("on", True), ("off", False))
    }
    vocab = engines["on"].vocab_size
    jobs = {
        "rollout": (workload(vocab, args.prefix, 8, 0), SamplingParams(n=4, temperature=1.0, max_tokens=16, seed=0)),
        "eval": (workload(vocab, args.prefix, 64, 1), SamplingParams(temperature=0.0, max_tokens=16)),
    }
    return engines, jobs


def of_job(args):
    """(engines, workloads) of the job `--config`: its engine with caching on and off, one step's rollout request
    and a held-out greedy evaluation of `--eval-n` problems."""
    from actors.engines import build_engine
    from rl.config import load_config
    from rl.data.loaders import encode_prompt, load_task_split
    from rl.data.tokenizer import load_tokenizer
    from rl.train.requests import sampling_params

    cfg = load_config(args.config, ["rollout.engine=vllm"])
    tokenizer = load_tokenizer(cfg.model.path)
    engines = {}
    for name, on in (("on", True), ("off", False)):
        cfg.rollout.vllm.enable_prefix_caching = on
        engines[name] = build_engine(cfg)
    prompts = {
        split: [encode_prompt(tokenizer, row) for row in load_task_split(cfg.data, split, n, tokenizer)]
        for split, n in (("train", cfg.train.prompts_per_step), ("test", args.eval_n))
    }
    eos = tokenizer.eos_token_id
    jobs = {
        "rollout": (prompts["train"], sampling_params(cfg, eos, seed=0)),
        "eval": (prompts["test"], sampling_params(cfg, eos, greedy=True)),
    }
    return engines, jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="checkpoints/tiny-arith")
    ap.add_argument("--config", default=None, help="a job's config: its engine and workloads (overrides --model)")
    ap.add_argument("--eval-n", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prefix", type=int, default=150)
    ap.add_argument("--max-model-len", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(1)
    engines, jobs = of_job(args) if args.config else synthetic(args)
    best, tokens = {}, {}
    for _ in range(args.reps):
        for job, (prompts, params) in jobs.items():
            for name, engine in engines.items():
                t = time.perf_counter()
                out = engine.generate(prompts, params)
                best[job, name] = min(best.get((job, name), float("inf")), time.perf_counter() - t)
                tokens[job, name] = [s.response_ids for s in out]
    report = {
        "model": args.config or args.model,
        "prefix_tokens": None if args.config else args.prefix,
        "prompt_tokens_mean": {job: round(sum(map(len, p)) / len(p), 1) for job, (p, _) in jobs.items()},
        "response_tokens": {job: sum(map(len, tokens[job, "on"])) for job in jobs},
        "load_1min": os.getloadavg()[0],
        "eval_greedy_tokens_equal": tokens["eval", "on"] == tokens["eval", "off"],
    }
    for job in jobs:
        report[f"{job}_s_off"] = round(best[job, "off"], 3)
        report[f"{job}_s_on"] = round(best[job, "on"], 3)
        report[f"{job}_speedup"] = round(best[job, "off"] / best[job, "on"], 2)
    print(json.dumps(report, indent=1))
    for engine in engines.values():
        engine.close()


if __name__ == "__main__":
    main()
