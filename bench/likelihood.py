"""Learner cost of the likelihood estimators: fwd+bwd time of replay / standard and K=3 / standard; and the
learner step's memory and throughput under token-budget micro-batches (`--learner`). Prints JSON.

    python -m bench.likelihood [--shapes tiny,135m] [--repeats 5] [--threads 1] [--decode-mode soft]
    python -m bench.likelihood --learner [--learner-shapes tiny,tiny-v32k] [--repeats 3]

Goals: replay / standard <= 1.1, kpass(K=3) / standard <= 2.0; the peak memory of one
learner step with 256 rollout rows <= 1.2 x that with 64 rows (`--learner`, bench/learner_memory.py).

One measurement = the estimator's log-probs of the response tokens on one batch, a GRPO-like surrogate
(sum of log-prob x advantage over response tokens, / token count) and its backward — what a learner step costs
before the optimizer. Every estimator sees the same batch (prompt + response rows, response tokens random, the
recorded states of replay taken from a no-grad forward so they sit at a real state's scale: replay's cost does
not depend on their values). Estimators are timed round-robin after one warm-up round (this machine is shared
and noisy); the median of each is reported with its best, and ratios are of medians (best-of ratios too).

Shapes: `tiny` is checkpoints/tiny-arith when it exists, else a random Llama with d=128, 2 layers, 2 heads of
64, intermediate 384, vocab 64, on the demo's learner micro-batch: 64 rows x (40 prompt + 32 response) tokens,
8 prompts x 8 samples (a GRPO batch repeats each prompt G times; fused prompts are prefilled once per prompt);
`135m` is a random model of SmolLM2-135M's shape (d=576, 30 layers, 9 heads / 3 KV heads of 64, intermediate 1536, vocab
49,152) on a small batch of 4 x (16 + 48) tokens. `exact` (fwd+bwd through the sequential recurrence) is timed on `tiny`
only. Threads default to 1: on a shared 2-core box oversubscribed intra-op threads make timings erratic.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch  # noqa: E402

from rl.estimators.likelihood import get_estimator  # noqa: E402
from rl.model import FBTLlamaConfig, FBTLlamaForCausalLM  # noqa: E402
from rl.samples.batch import LearnerBatch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_CKPT = os.path.join(ROOT, "checkpoints", "tiny-arith")
GOALS = {"replay/standard": 1.1, "kpass3/standard": 2.0}

SHAPES = {
    # the demo's learner micro-batch: 64 rows = 8 prompts x 8 samples, arithmetic-sized prompts and responses
    "tiny": dict(
        cfg=dict(
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=64,
            intermediate_size=384,
            vocab_size=64,
        ),
        rows=64,
        group=8,
        prompt=40,
        response=32,
    ),
    "135m": dict(
        cfg=dict(
            hidden_size=576,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            head_dim=64,
            intermediate_size=1536,
            vocab_size=49152,
            tie_word_embeddings=True,
        ),
        rows=4,
        group=1,
        prompt=16,
        response=48,
    ),
}


def build_model(shape: str):
    """(model, source): the committed tiny checkpoint when present, else a random FBT Llama of the shape."""
    if shape == "tiny" and os.path.isdir(TINY_CKPT):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(TINY_CKPT, dtype=torch.float32), TINY_CKPT
    torch.manual_seed(0)
    cfg = FBTLlamaConfig(
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0, **SHAPES[shape]["cfg"]
    )
    return FBTLlamaForCausalLM(cfg).float(), "random init"


def build_batch(model, rows: int, prompt: int, response: int, group: int = 1, seed: int = 0) -> LearnerBatch:
    """Right-padded rows of equal length (BOS + random prompt + random response), states from a no-grad pass.
    Consecutive `group` rows share their prompt, as the G samples of a GRPO group do."""
    g = torch.Generator().manual_seed(seed)
    V = model.config.vocab_size
    L = prompt + response
    ids = torch.randint(3, V, (rows, L), generator=g)
    ids[:, :prompt] = ids[::group, :prompt].repeat_interleave(group, dim=0)[:rows]
    ids[:, 0] = model.config.bos_token_id
    am = torch.ones(rows, L, dtype=torch.long)
    batch = LearnerBatch(
        ids,
        am,
        torch.full((rows,), prompt),
        torch.full((rows,), response),
        torch.ones(rows, response),
        torch.zeros(rows, response),
    )
    with torch.no_grad():
        h, _ = model.run_stack(model.embed(ids), am)
    batch.states = h[:, prompt - 1 : L - 1].clone()  # row j = state at P + j - 1
    batch.extras["advantages"] = torch.randn(rows, generator=g)
    return batch


def step_seconds(model, batch: LearnerBatch, name: str, passes: int, mode: str) -> float:
    """One fwd+bwd of the estimator under a GRPO-like surrogate; wall seconds."""
    est = get_estimator(name)
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    lp = est(model, batch, mode, passes=passes).logprobs
    loss = -(lp * batch.extras["advantages"][:, None]).sum() / batch.response_mask.sum()
    loss.backward()
    return time.perf_counter() - t0


def bench_shape(shape: str, repeats: int, mode: str, with_exact: bool) -> dict:
    model, source = build_model(shape)
    model.train()
    spec = SHAPES[shape]
    batch = build_batch(model, spec["rows"], spec["prompt"], spec["response"], spec["group"])
    runs = {"standard": ("standard", 1), "replay": ("replay", 1), "kpass3": ("kpass", 3)}
    if with_exact:
        runs["exact"] = ("exact", 1)
    times = {k: [] for k in runs}
    for r in range(repeats + 1):  # round 0 warms up (allocator, kernels), not recorded
        for key, (name, passes) in runs.items():
            t = step_seconds(model, batch, name, passes, mode)
            if r:
                times[key].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    ratios = {f"{k}/standard": med[k] / med["standard"] for k in runs if k != "standard"}
    best_ratios = {f"{k}/standard": best[k] / best["standard"] for k in runs if k != "standard"}
    n_params = sum(p.numel() for p in model.parameters())
    return {
        "shape": shape,
        "model": source,
        "params_M": round(n_params / 1e6, 1),
        "decode_mode": mode,
        "batch": f"{spec['rows']} x ({spec['prompt']} prompt + {spec['response']} response), "
        f"{spec['group']} rows per prompt",
        "repeats": repeats,
        "median_ms": {k: round(1000 * v, 2) for k, v in med.items()},
        "best_ms": {k: round(1000 * v, 2) for k, v in best.items()},
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "best_ratios": {k: round(v, 3) for k, v in best_ratios.items()},
        "meets_goals": {k: ratios[k] <= g for k, g in GOALS.items()},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="tiny,135m", help="comma list of: " + ", ".join(SHAPES))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--repeats-135m", type=int, default=3, help="repeats for the 135m shape (seconds each)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--decode-mode", choices=("soft", "fused"), default="soft")
    p.add_argument(
        "--learner",
        action="store_true",
        help="learner-step memory (64 vs 256 rows) and packed vs padded tokens/s instead",
    )
    p.add_argument("--learner-shapes", default="tiny,tiny-v32k")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.learner:
        from bench.learner_memory import learner_report

        print(json.dumps(learner_report(args.learner_shapes.split(","), args.repeats, args.threads), indent=2))
        return 0
    results = []
    for shape in args.shapes.split(","):
        if shape not in SHAPES:
            raise SystemExit(f"unknown shape {shape!r}; valid: {', '.join(SHAPES)}")
        reps = args.repeats_135m if shape == "135m" else args.repeats
        results.append(bench_shape(shape, reps, args.decode_mode, with_exact=shape == "tiny"))
        print(json.dumps(results[-1]), file=sys.stderr)  # progress: the 135m shape takes a while
    print(json.dumps({"bench": "likelihood", "threads": args.threads, "goals": GOALS, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
