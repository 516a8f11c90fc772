"""Decode with grouped-query attention: transformers' `sdpa` (K/V expanded per query head) beside `sdpa_shared_kv`
(rl/model/attention.py), side by side in one process, printed as JSON.

    python -m bench.shared_kv_attention [--batch 16] [--prompt-lens 180,240] [--new-tokens 8] [--reps 3]
                                        [--threads 1] [--layers 30]

A SmolLM2-135M-shaped FBT with random weights (30 layers, hidden 576, 9 query heads sharing 3 K/V heads of 64,
vocab 49152), left-padded prompts of lengths drawn from `--prompt-lens`, greedy soft-mode decoding in the torch
engine. Per implementation: the decode steps' time (the engine's `[B, 1]` forward calls, timed inside the run)
and the prefill's, the fastest of `--reps` interleaved repetitions, by process CPU time (other tenants' load
moves it less than wall time; wall time is printed beside it). `decode_speedup` = expanded / shared time per step;
`same_tokens` and `max_abs_logprob_diff` compare the two runs' samples.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from bench.decode_models import random_fbt, random_prompts
from rl.model.attention import SHARED_KV_SDPA
from rl.samples.request import SamplingParams
from rollout.torch_engine import TorchEngine

IMPLEMENTATIONS = ("sdpa", SHARED_KV_SDPA)


def smollm2_shaped(layers: int):
    return random_fbt(
        hidden_size=576,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        vocab_size=49152,
        max_position_embeddings=2048,
    )


def timed_stack(model, spent: dict):
    """Wrap `model.run_stack` to add each call's (cpu, wall) seconds to spent["decode"] ([B, 1] inputs) or
    spent["prefill"]."""
    run_stack = model.run_stack

    def call(x, *args, **kwargs):
        c, w = time.process_time(), time.perf_counter()
        try:
            return run_stack(x, *args, **kwargs)
        finally:
            kind = "decode" if x.shape[1] == 1 else "prefill"
            spent[kind] = [a + b for a, b in zip(spent[kind], (time.process_time() - c, time.perf_counter() - w))]

    model.run_stack = call


def run(args) -> dict:
    model = smollm2_shaped(args.layers)
    lo, hi = map(int, args.prompt_lens.split(","))
    prompts = random_prompts(model.config.vocab_size, args.batch, lo, hi)
    engine = TorchEngine(model, eos_token_ids=(), shared_kv_attention=False)
    params = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, decode_mode="soft")
    spent = {"decode": [0.0, 0.0], "prefill": [0.0, 0.0]}
    timed_stack(model, spent)
    steps = args.new_tokens - 1  # the last token is sampled from the last step's state: no forward after it
    best, samples = {}, {}
    for rep in range(args.reps):
        for impl in IMPLEMENTATIONS[rep % 2 :] + IMPLEMENTATIONS[: rep % 2]:
            model.set_attn_implementation(impl)
            spent.update(decode=[0.0, 0.0], prefill=[0.0, 0.0])
            samples[impl] = engine.generate(prompts, params)
            per_step = [1e3 * s / steps for s in spent["decode"]]
            prev = best.get(impl)
            if prev is None or per_step[0] < prev["decode_ms_per_step_cpu"]:
                best[impl] = {
                    "decode_ms_per_step_cpu": round(per_step[0], 1),
                    "decode_ms_per_step_wall": round(per_step[1], 1),
                    "prefill_s_cpu": round(spent["prefill"][0], 2),
                }
    old, new = samples["sdpa"], samples[SHARED_KV_SDPA]
    lp_diff = max(abs(a - b) for x, y in zip(old, new) for a, b in zip(x.logprobs, y.logprobs))
    ratio = lambda key: round(best["sdpa"][key] / best[SHARED_KV_SDPA][key], 3)
    lengths = [len(p) for p in prompts]
    return {
        "command": "python -m bench.shared_kv_attention " + " ".join(sys.argv[1:]),
        "threads": torch.get_num_threads(),
        "batch": args.batch,
        "prompt_len_min_mean_max": [min(lengths), round(sum(lengths) / len(lengths), 1), max(lengths)],
        "new_tokens": args.new_tokens,
        "layers": args.layers,
        "reps": args.reps,
        "best": best,
        "decode_speedup_cpu": ratio("decode_ms_per_step_cpu"),
        "decode_speedup_wall": ratio("decode_ms_per_step_wall"),
        "prefill_speedup_cpu": ratio("prefill_s_cpu"),
        "same_tokens": all(x.response_ids == y.response_ids for x, y in zip(old, new)),
        "max_abs_logprob_diff": lp_diff,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-lens", default="180,240", help="min,max prompt length (uniform)")
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--layers", type=int, default=30)
    args = ap.parse_args(argv)
    if args.new_tokens < 2:
        ap.error("--new-tokens: at least 2 (the first decode forward comes after the first token)")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
