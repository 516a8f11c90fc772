"""The machine's practical limit for the learner phase: bare torch fwd + bwd + AdamW of the plain HF model on the
row shapes of a real step, no framework around it.

    <trl venv>/bin/python bench_torch.py --model HF_DIR --shapes RUN/trl/result.json --out RUN/bench_torch.json \\
        [--threads 2,1] [--micro-batches 4,16] [--reps 3] [--lr 2e-6]

`--shapes` takes a run_trl.py result.json and uses the (prompt tokens, completion tokens) of every row of the step
whose total is the median one (`--step K` picks another), or `--rows P:R,P:R,...` gives them directly. Each
configuration (torch threads x rows per micro-batch) runs 1 warm-up and `--reps` timed optimizer steps on the
same rows, random token ids (speed does not depend on them), fp32:

  * rows sorted by length (fbrl's plan) and cut into micro-batches of N rows, each right-padded to its longest
    row, attention mask + positions from the mask;
  * per micro-batch: the decoder stack over prompt + response, the LM head and log_softmax at the response
    positions only (as both fbrl's estimators and TRL's logits_to_keep do), loss = -sum(A * log p) / (the
    step's response tokens), backward; gradients accumulate over micro-batches;
  * then clip_grad_norm_(1.0) and torch AdamW (lr, betas 0.9/0.999, eps 1e-8), zero_grad.

Reported per configuration: median seconds per optimizer step (and its fwd+bwd / optimizer split), and tokens/s =
the step's real (unpadded) prompt + response tokens / seconds, the same count summarize.py divides each
framework's learner phase by.

`--fbrl-config CONFIG [--fbrl-override k=v ...]` (fbrl's source on PYTHONPATH) also times fbrl's own learner code
on the same rows in this process, without Ray or DeepSpeed: `rl.train.policy_update.PolicyUpdater(...).update(samples,
advantages, TorchBackend)` (its plan and micro-batches, the configured estimator and log-prob contract, the
entropy metric, the loss, clip + torch AdamW), at the first of --threads. Its difference to the bare step is
fbrl's learner code; the rest of a rank's learner phase is DeepSpeed, the collectives and the actors.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def rows_from(args) -> tuple[list[tuple[int, int]], str]:
    if args.rows:
        rows = [tuple(int(x) for x in item.split(":")) for item in args.rows.split(",")]
        return rows, "--rows"
    r = json.loads(Path(args.shapes).read_text())
    steps = [s for s in r["steps"] if s.get("row_lengths")]
    if not steps:
        raise SystemExit(f"bench_torch.py: {args.shapes} has no per-row lengths (an older run_trl.py result)")
    if args.step:
        step = next(s for s in steps if s["step"] == args.step)
    else:
        by_total = sorted(steps, key=lambda s: (sum(p + c for p, c in s["row_lengths"]), s["step"]))
        step = by_total[(len(by_total) - 1) // 2]
    return [tuple(x) for x in step["row_lengths"]], f"{args.shapes} step {step['step']}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="plain HF causal LM directory")
    ap.add_argument("--shapes", help="run_trl.py result.json (per-row prompt / completion lengths)")
    ap.add_argument("--step", type=int, default=0, help="the step of --shapes to use (default: the median total)")
    ap.add_argument("--rows", help="P:R,P:R,... prompt:response tokens per row (instead of --shapes)")
    ap.add_argument("--threads", default="2", help="comma-separated torch thread counts (default 2)")
    ap.add_argument("--micro-batches", default="4,16", help="comma-separated rows per micro-batch (default 4,16)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=2e-6)
    ap.add_argument("--fbrl-config", help="also time fbrl's PolicyUpdater + TorchBackend under this fbrl config")
    ap.add_argument("--fbrl-override", action="append", default=[], help="a key=value override of --fbrl-config")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    if not (args.rows or args.shapes):
        ap.error("give --shapes RESULT_JSON or --rows P:R,...")
    rows, source = rows_from(args)

    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.train()
    V = model.config.vocab_size
    order = sorted(range(len(rows)), key=lambda i: -(rows[i][0] + rows[i][1]))  # longest first, like fbrl's plan
    ids_of = [torch.randint(3, V, (p + r,)) for p, r in rows]
    adv = torch.randn(len(rows))
    n_resp = sum(r for _, r in rows)
    n_tokens = sum(p + r for p, r in rows)
    results = []
    print(
        f"bench_torch: {type(model).__name__} {sum(p.numel() for p in model.parameters()):,} params, torch "
        f"{torch.__version__}; {len(rows)} rows from {source}: {n_tokens} tokens ({n_tokens - n_resp} prompt + "
        f"{n_resp} response; prompts {min(p for p, _ in rows)}-{max(p for p, _ in rows)}, responses "
        f"{min(r for _, r in rows)}-{max(r for _, r in rows)})",
        flush=True,
    )

    def micro_loss(mb: list[int]):
        L = max(rows[i][0] + rows[i][1] for i in mb)
        ids = torch.zeros(len(mb), L, dtype=torch.long)
        am = torch.zeros(len(mb), L, dtype=torch.long)
        for j, i in enumerate(mb):
            ids[j, : len(ids_of[i])] = ids_of[i]
            am[j, : len(ids_of[i])] = 1
        pos = (am.cumsum(-1) - 1).clamp(min=0)
        h = model.model(input_ids=ids, attention_mask=am, position_ids=pos).last_hidden_state
        # response token t of row j sits at P + t and is predicted by the state at P + t - 1
        sel_rows, sel_pos, targets, a = [], [], [], []
        for j, i in enumerate(mb):
            p, r = rows[i]
            sel_rows += [j] * r
            sel_pos += list(range(p - 1, p + r - 1))
            targets.append(ids_of[i][p : p + r])
            a += [float(adv[i])] * r
        logits = model.lm_head(h[torch.tensor(sel_rows), torch.tensor(sel_pos)])
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, torch.cat(targets)[:, None])[:, 0]
        return -(torch.tensor(a) * logp).sum() / n_resp

    for threads in [int(x) for x in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for mbs in [int(x) for x in args.micro_batches.split(",")]:
            opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
            micro = [order[i : i + mbs] for i in range(0, len(order), mbs)]
            padded = sum(len(mb) * max(rows[i][0] + rows[i][1] for i in mb) for mb in micro)
            times = []
            for rep in range(args.reps + 1):
                t0 = time.perf_counter()
                for mb in micro:
                    micro_loss(mb).backward()
                t1 = time.perf_counter()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                t2 = time.perf_counter()
                if rep:  # rep 0 is the warm-up
                    times.append((t2 - t0, t1 - t0, t2 - t1))
            step = statistics.median(t[0] for t in times)
            res = {
                "threads": threads,
                "rows_per_micro_batch": mbs,
                "micro_batches": len(micro),
                "padded_tokens": padded,
                "tokens": n_tokens,
                "step_s": step,
                "fwd_bwd_s": statistics.median(t[1] for t in times),
                "optimizer_s": statistics.median(t[2] for t in times),
                "tokens_per_s": n_tokens / step,
                "all_step_s": [t[0] for t in times],
            }
            results.append(res)
            print(
                f"bench_torch: {threads} thread(s), {len(micro)} micro-batches of <= {mbs} rows ({padded} padded "
                f"tokens): {step:.2f} s/step (fwd+bwd {res['fwd_bwd_s']:.2f}, clip+AdamW {res['optimizer_s']:.2f})"
                f" = {res['tokens_per_s']:.0f} tokens/s  [{' '.join(f'{t[0]:.2f}' for t in times)}]",
                flush=True,
            )
            del opt
    if args.fbrl_config:
        results.append(fbrl_updater(args, model, rows, ids_of, adv, n_tokens))
    if args.out:
        Path(args.out).write_text(
            json.dumps({"source": source, "rows": rows, "model": args.model, "results": results}, indent=1)
        )
    return 0


def fbrl_updater(args, model, rows, ids_of, adv, n_tokens) -> dict:
    """fbrl's learner code (rl.train.policy_update.PolicyUpdater with its one-process TorchBackend) on the same rows."""
    import torch

    from rl.config import load_config
    from rl.samples.batch import Sample
    from rl.train.policy_update import PolicyUpdater, TorchBackend
    from rl.train.update_plan import plan_for

    cfg = load_config(args.fbrl_config, args.fbrl_override)
    threads = int(args.threads.split(",")[0])
    torch.set_num_threads(threads)
    G = cfg.rollout.n_samples_per_prompt
    samples = [
        Sample(
            ids[:p].tolist(),
            ids[p:].tolist(),
            [0.0] * r,
            "stop",
            0,
            group_id=i // G,
            sample_index=i % G,
            decode_mode=cfg.rollout.decode_mode,
        )
        for i, (ids, (p, r)) in enumerate(zip(ids_of, rows))
    ]
    lc = cfg.learner
    backend = TorchBackend(model, lc.lr, lc.weight_decay, tuple(lc.adam_betas), lc.grad_clip)
    updater = PolicyUpdater(model, cfg, pad_id=int(model.config.pad_token_id or 0))
    plan = plan_for(samples, cfg, 1)
    times = []
    for rep in range(args.reps + 1):
        t0 = time.perf_counter()
        updater.update(samples, adv.tolist(), backend)
        if rep:
            times.append(time.perf_counter() - t0)
    step = statistics.median(times)
    res = {
        "threads": threads,
        "fbrl_updater": True,
        "estimator": cfg.likelihood.estimator,
        "micro_batches": len(plan.micro[0][0]),
        "rows_per_micro_batch": lc.micro_batch_size,
        "tokens": n_tokens,
        "step_s": step,
        "tokens_per_s": n_tokens / step,
        "all_step_s": times,
    }
    print(
        f"bench_torch: fbrl PolicyUpdater + TorchBackend (no Ray, no DeepSpeed; estimator "
        f"{cfg.likelihood.estimator}), {threads} thread(s), {res['micro_batches']} micro-batches of <= "
        f"{lc.micro_batch_size} rows: {step:.2f} s/step = {res['tokens_per_s']:.0f} tokens/s  "
        f"[{' '.join(f'{t:.2f}' for t in times)}]",
        flush=True,
    )
    return res


if __name__ == "__main__":
    sys.exit(main())
