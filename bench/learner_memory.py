"""Learner step under token-budget micro-batches: peak memory at 64 vs 256 rollout rows, and tokens/s of the
token-budget micro-batches vs padded ones on mixed lengths. Prints JSON (also `bench/likelihood.py --learner`).

    python -m bench.learner_memory [--shapes tiny,tiny-v32k] [--repeats 3] [--threads 1]

Goal: the 256-row peak <= 1.2 x the 64-row peak.

Memory: one learner step as `rl.train.policy_update.PolicyUpdater` runs it (replay estimator, `algo.mini_batches=2`, so
the old log-probs are computed first and two optimizer steps follow), on rows of mixed lengths (prompts 8-40,
responses 1-64 tokens) with recorded states. Each figure comes from a fresh process whose glibc mmap threshold
is fixed at 64 KiB (freed tensors go back to the OS, so the resident high-water mark is what was live). The
process first takes a warm-up step on 8 rows (optimizer state, gradients and allocator pools then exist), then
resets the high-water mark (/proc/self/clear_refs) and takes the measured step; reported: the peak's increase
over the resident size just before the step (`step_peak_mib`, the step's own memory; the input samples, which
grow with the batch by construction, are already resident) and the absolute peak.

Throughput: fwd+bwd of the replay log-probs under a GRPO-like surrogate over every micro-batch of a 256-row batch
(no optimizer), two ways on the same rows: `padded` — rows in arrival order, `micro_batch_size` rows per
micro-batch, log-softmax over [rows, R, V] (the learner before token budgets) — and `token_budget` — the
micro-batches of `rl.train.update_plan.plan_update` (rows sorted by length, <= 2048 padded tokens and <= 1024 response
tokens) with logits at real response tokens only (`rl.estimators.likelihood.token_logprobs`). tokens/s counts real
prompt + response tokens; medians of round-robin repeats after a warm-up round.

Shapes: `tiny` is the committed checkpoints/tiny-arith (d=128, 3 layers, vocab 101); `tiny-v32k` a random FBT
Llama with the same body and a 32,768-token vocabulary, where, as in real LMs, the [tokens, V] log-softmax is most
of a step's memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

CKPT = os.path.join(ROOT, "checkpoints", "tiny-arith")
SHAPES = ("tiny", "tiny-v32k")
MICRO_ROWS, BUDGET, RESPONSE_BUDGET = 64, 2048, 1024
PROMPT, RESPONSE = (8, 40), (1, 64)
GOAL = 1.2


def build_model(shape: str):
    if shape == "tiny":
        from rl.model.files import load_fbt

        return load_fbt(CKPT)
    from rl.model import FBTLlamaConfig, FBTLlamaForCausalLM

    torch.manual_seed(0)
    cfg = FBTLlamaConfig(
        hidden_size=128,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=384,
        vocab_size=32768,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
    )
    return FBTLlamaForCausalLM(cfg).float()


def mixed_samples(n: int, vocab: int, d: int, seed: int = 0):
    """GRPO-shaped rows (groups of 8) of mixed lengths, with recorded states (values do not change the cost)."""
    from rl.samples.batch import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        P = int(torch.randint(PROMPT[0], PROMPT[1] + 1, (1,), generator=g))
        R = int(torch.randint(RESPONSE[0], RESPONSE[1] + 1, (1,), generator=g))
        out.append(
            Sample(
                [1] + torch.randint(3, vocab, (P - 1,), generator=g).tolist(),
                torch.randint(3, vocab, (R,), generator=g).tolist(),
                (-torch.rand(R, generator=g)).tolist(),
                "stop",
                1,
                states=torch.randn(R, d, generator=g),
                group_id=i // 8,
                sample_index=i % 8,
            )
        )
    return out


def learner_config():
    from rl.config import LearnerConfig, load_config

    over = [
        "likelihood.estimator=replay",
        "algo.mini_batches=2",
        f"learner.micro_batch_size={MICRO_ROWS}",
        "rollout.max_tokens=64",
    ]
    if "max_tokens_per_micro_batch" in LearnerConfig.__dataclass_fields__:  # absent before token-budget micro-batches
        over += [
            f"learner.max_tokens_per_micro_batch={BUDGET}",
            f"learner.max_response_tokens_per_micro_batch={RESPONSE_BUDGET}",
        ]
    return load_config(None, over)


def _proc_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_child(shape: str, rows: int, threads: int) -> dict:
    """One measured learner step in this (fresh) process."""
    import gc

    from rl.train.policy_update import PolicyUpdater, TorchBackend

    torch.set_num_threads(threads)
    model = build_model(shape).train()
    cfg = learner_config()
    backend = TorchBackend(model, lr=1e-5)
    updater = PolicyUpdater(model, cfg, pad_id=0)
    d, V = model.config.hidden_size, model.config.vocab_size
    warm = mixed_samples(8, V, d, seed=1)
    updater.update(warm, torch.randn(8).tolist(), backend)
    samples = mixed_samples(rows, V, d)
    adv = torch.randn(rows, generator=torch.Generator().manual_seed(3)).tolist()
    del warm
    gc.collect()
    before = _proc_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident size
    t0 = time.perf_counter()
    updater.update(samples, adv, backend)
    seconds = time.perf_counter() - t0
    peak = _proc_kib("VmHWM")
    return {
        "shape": shape,
        "rows": rows,
        "tokens": sum(s.prompt_len + s.response_len for s in samples),
        "rss_before_mib": round(before / 1024, 1),
        "peak_mib": round(peak / 1024, 1),
        "step_peak_mib": round((peak - before) / 1024, 1),
        "step_seconds": round(seconds, 2),
    }


def measure_memory(shape: str, rows: int, threads: int) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", PYTHONPATH=os.environ.get("PYTHONPATH", ROOT))
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", shape, str(rows), str(threads)],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory child {shape}/{rows} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def throughput(shape: str, repeats: int, rows: int = 256) -> dict:
    from rl.estimators.likelihood import get_estimator, response_hidden, response_log_dists
    from rl.samples.batch import collate
    from rl.train.update_plan import plan_update

    model = build_model(shape).train()
    samples = mixed_samples(rows, model.config.vocab_size, model.config.hidden_size)
    adv = torch.randn(rows, generator=torch.Generator().manual_seed(3))
    lengths = [s.prompt_len + s.response_len for s in samples]
    resp_tokens = sum(s.response_len for s in samples)
    padded = [list(range(i, min(i + MICRO_ROWS, rows))) for i in range(0, rows, MICRO_ROWS)]
    plan = plan_update(lengths, 1, 1, MICRO_ROWS, BUDGET, [s.response_len for s in samples], RESPONSE_BUDGET)
    budget = [m for m in plan.rank_micro_batches(0, 0) if m]
    replay = get_estimator("replay")

    def step(plan, unpadded: bool) -> float:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        for rows_ in plan:
            mb = collate([samples[i] for i in rows_], 0, with_states=True)
            if unpadded:
                lp = replay(model, mb, "soft").logprobs
            else:  # the learner before token budgets: log-softmax over every [row, R] slot, padding included
                logp = response_log_dists(model, response_hidden(model, mb, "soft", "replay"), mb)
                lp = logp.gather(-1, mb.response_ids[..., None])[..., 0] * mb.response_mask
            (-(lp * adv[rows_, None]).sum() / resp_tokens).backward()
        return time.perf_counter() - t0

    runs = {"padded": (padded, False), "token_budget": (budget, True)}
    times = {k: [] for k in runs}
    for r in range(repeats + 1):
        for k, (plan, unpadded) in runs.items():
            t = step(plan, unpadded)
            if r:
                times[k].append(t)
    real = sum(lengths)
    out = {"shape": shape, "rows": rows, "real_tokens": real, "response_tokens": resp_tokens}
    for k, (plan, _) in runs.items():
        stack = sum(len(p) * max(lengths[i] for i in p) for p in plan)
        logits = sum(len(p) * max(samples[i].response_len for i in p) for p in plan) if k == "padded" else resp_tokens
        med = statistics.median(times[k])
        out[k] = {
            "micro_batches": len(plan),
            "median_s": round(med, 3),
            "best_s": round(min(times[k]), 3),
            "tokens_per_s": round(real / med),
            "stack_padding": round(stack / real - 1, 3),
            "logit_rows_per_response_token": round(logits / resp_tokens, 3),
        }
    out["speedup"] = round(out["token_budget"]["tokens_per_s"] / out["padded"]["tokens_per_s"], 3)
    return out


def learner_report(shapes, repeats: int, threads: int) -> dict:
    results = []
    for shape in shapes:
        if shape not in SHAPES:
            raise SystemExit(f"unknown shape {shape!r}; valid: {', '.join(SHAPES)}")
        mem = {rows: measure_memory(shape, rows, threads) for rows in (64, 256)}
        ratio = mem[256]["step_peak_mib"] / mem[64]["step_peak_mib"]
        res = {
            "shape": shape,
            "memory": list(mem.values()),
            "step_peak_256_over_64": round(ratio, 3),
            "abs_peak_256_over_64": round(mem[256]["peak_mib"] / mem[64]["peak_mib"], 3),
            "meets_goal": ratio <= GOAL,
            "throughput": throughput(shape, repeats),
        }
        results.append(res)
        print(json.dumps(res), file=sys.stderr)
    return {
        "bench": "learner_memory",
        "threads": threads,
        "goal_256_over_64": GOAL,
        "micro_batch_size": MICRO_ROWS,
        "max_tokens_per_micro_batch": BUDGET,
        "max_response_tokens_per_micro_batch": RESPONSE_BUDGET,
        "results": results,
    }


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(memory_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(json.dumps(learner_report(args.shapes.split(","), args.repeats, args.threads), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
