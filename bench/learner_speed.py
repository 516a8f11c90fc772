"""The learner at the machine's speed: tokens/s of fbrl's learner update against plain torch fwd + bwd + AdamW of the
same model on the same rows and threads, side by side in one process run. Prints one line per variant and JSON.

    python -m bench.learner_speed --config configs/tiny.yaml [--override k=v ...] [--threads N]
        [--reps 3] [--variant NAME=k=v,k=v ...] [--two-ranks] [--samples FILE] [--out FILE]

The batch is real: step 1's prompts of the config's task (its sampler, seed and prompt limit, as the loop draws
them) and `rollout.n_samples_per_prompt` samples each, generated in this process by the torch engine from the
config's checkpoint (with recorded states for replay); `--samples FILE` keeps the batch (written the first time,
read afterwards). Advantages are a fixed random draw: speed does not depend on them.

Variants (each timed on the whole batch: one optimizer step, as the loop's learner phase):
  * `plain` — the limit: a stock Hugging Face `LlamaForCausalLM` holding the checkpoint's backbone (every tensor
    but the fusion's), fbrl's own micro-batches (the update plan of rl/train/update_plan.py: rows sorted by length,
    cut by the learner's row and token budgets), each right-padded; the decoder stack over prompt + response, the LM
    head and an fp32 log-softmax at the response positions only, loss = -sum(A * log p) / response tokens, backward;
    then clip_grad_norm_ and torch AdamW.
  * `replay` — fbrl's learner rank as shipped: `actors.learner_rank.LearnerRank` (the DeepSpeed engine, ZeRO stage and
    optimizer of the config, world size 1: the same code each Ray rank runs) taking `update(samples, advantages)`,
    including the latent metrics and every learner metric; the config's estimator (replay in the shipped jobs).
  * `standard` — the same with `likelihood.estimator=standard rollout.decode_mode=standard`.
  * `--variant NAME=k=v,...` — more LearnerRank variants under extra overrides (e.g. `zero2=learner.zero_stage=2`,
    `bf16=learner.bf16=true`).
  * `--two-ranks` — the two-rank layout: 2 processes, one LearnerRank each (world size 2, gloo), each on half the
    threads, timed on the same batch after the in-process variants.
Timing: one warm-up round, then `--reps` rounds over the variants in turn (round-robin: a noisy neighbour hurts
every variant alike); medians reported, of wall seconds and of this process's CPU seconds (`cpu_s`: on a loaded
machine with `--threads 1` the CPU seconds are the work done, while the wall seconds also hold the waits for a
core). tokens/s = the batch's real (unpadded) prompt + response tokens / the
median seconds of one update (the count the peer comparison divides each framework's learner phase by). Each
fbrl variant also reports `mismatch/abs_logp_diff` of its warm-up update (the first rows): mean |learner - engine|
log-prob at the weights that drew the batch (an fp32 engine), which is what a bf16 learner costs in agreement.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch  # noqa: E402

STANDARD = ["likelihood.estimator=standard", "rollout.decode_mode=standard"]
WARM_UP_ROWS = 4  # the warm-up round: a few rows (the gradients and optimizer state are allocated whole anyway)


# ---- the batch -------------------------------------------------------------------------------------------------
def real_batch(cfg, seed: int = 0):
    """(samples, advantages): step 1 of the job's prompts, sampled by the torch engine in this process."""
    from actors.local import LocalRollout
    from rl.data.loaders import PromptSampler, load_task_split
    from rl.data.prompts import PromptFitter, prompt_token_limit
    from rl.data.tokenizer import load_tokenizer
    from rl.train.rollout_queue import generate_batch

    tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.path)
    fitter = PromptFitter(tokenizer, prompt_token_limit(cfg), cfg.data.overlong_prompts)
    rows, _ = fitter.fit(load_task_split(cfg.data, "train", tokenizer=tokenizer), "train data")
    sampler = PromptSampler(rows, seed=cfg.train.seed)
    torch_cfg = copy.deepcopy(cfg)
    torch_cfg.rollout.engine, torch_cfg.rollout.num_engines = "torch", 1  # the batch's maker, not measured
    rollout = LocalRollout(torch_cfg)
    batch = generate_batch(cfg, fitter, sampler, rollout, tokenizer.eos_token_id, 1, 0)
    rollout.close()
    g = torch.Generator().manual_seed(seed)
    return batch.samples, torch.randn(len(batch.samples), generator=g).tolist()


def load_or_make_batch(cfg, path: str | None):
    from rl.samples.batch import load_samples, save_samples

    if path and os.path.isfile(path):
        return load_samples(path)
    samples, adv = real_batch(cfg)
    if path:
        save_samples(samples, adv, path)
    return samples, adv


def batch_tokens(samples) -> int:
    return sum(s.prompt_len + s.response_len for s in samples)


# ---- the limit: plain torch ------------------------------------------------------------------------------------
def plain_llama(path: str):
    """The checkpoint's backbone as a stock `LlamaForCausalLM` (the fusion's tensors dropped: with feedback off an
    FBT is its backbone)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rl.model.files import load_fbt

    fbt = load_fbt(path)
    conf = {k: v for k, v in fbt.config.to_dict().items() if not k.startswith("fbt_")}
    conf.pop("model_type", None)
    conf.pop("architectures", None)
    model = LlamaForCausalLM(LlamaConfig(**conf))
    state = {k: v for k, v in fbt.state_dict().items() if not k.startswith("fusion.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"plain Llama: missing {missing}, unexpected {unexpected}")
    if model.config.tie_word_embeddings:
        model.tie_weights()
    return model.train()


class PlainStep:
    """fwd + bwd over fbrl's micro-batches of the batch, then clip + torch AdamW: the machine's practical limit."""

    def __init__(self, cfg, samples, advantages):
        from rl.train.update_plan import plan_for

        lcfg = cfg.learner
        self.model = plain_llama(cfg.model.path)
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=lcfg.lr, betas=tuple(lcfg.adam_betas), eps=1e-8, weight_decay=lcfg.weight_decay
        )
        self.clip = lcfg.grad_clip
        self.samples, self.adv = samples, advantages
        self.micro = [rows for rows in plan_for(samples, cfg, 1).micro[0][0] if rows]
        self.n_resp = sum(s.response_len for s in samples)
        self.split = []

    def _loss(self, rows):
        rows_s = [self.samples[i] for i in rows]
        L = max(s.prompt_len + s.response_len for s in rows_s)
        ids = torch.zeros(len(rows), L, dtype=torch.long)
        am = torch.zeros(len(rows), L, dtype=torch.long)
        sel_rows, sel_pos, targets, adv = [], [], [], []
        for j, (i, s) in enumerate(zip(rows, rows_s)):
            seq = s.prompt_ids + s.response_ids
            ids[j, : len(seq)] = torch.tensor(seq)
            am[j, : len(seq)] = 1
            p, r = s.prompt_len, s.response_len
            sel_rows += [j] * r
            sel_pos += list(range(p - 1, p + r - 1))  # response token t is predicted by the state at p + t - 1
            targets += s.response_ids
            adv += [self.adv[i]] * r
        pos = (am.cumsum(-1) - 1).clamp(min=0)
        h = self.model.model(input_ids=ids, attention_mask=am, position_ids=pos).last_hidden_state
        logits = self.model.lm_head(h[torch.tensor(sel_rows), torch.tensor(sel_pos)])
        logp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(targets)[:, None])[:, 0]
        return -(torch.tensor(adv) * logp).sum() / self.n_resp

    def __call__(self, warm_up: bool = False) -> dict:
        t0 = time.perf_counter()
        for rows in self.micro[:1] if warm_up else self.micro:
            self._loss(rows).backward()
        t1 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip or float("inf"))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.split.append((t1 - t0, time.perf_counter() - t1))
        return {}

    def close(self):
        self.model = self.opt = None


# ---- fbrl's learner rank ---------------------------------------------------------------------------------------
class RankStep:
    """One `LearnerRank.update` on the whole batch (world size 1), with the optimizer step timed apart."""

    def __init__(self, cfg, samples, advantages, threads: int):
        from actors.learner_rank import LearnerRank

        self.rank = LearnerRank(cfg, num_threads=threads)
        self.samples, self.adv = samples, advantages
        self.step_s = []
        step = self.rank.backend.step

        def timed_step():  # the bench's own timer around the backend's step (the optimizer and its reductions)
            t0 = time.perf_counter()
            out = step()
            self.step_s.append(time.perf_counter() - t0)
            return out

        self.rank.backend.step = timed_step
        self.first_metrics = None

    def __call__(self, warm_up: bool = False) -> dict:
        n = WARM_UP_ROWS if warm_up else len(self.samples)
        m = self.rank.update(self.samples[:n], self.adv[:n])
        if self.first_metrics is None:
            self.first_metrics = m
        return m

    def close(self):
        self.rank.close()


def variant_config(base_args, extra: list[str]):
    from rl.config import load_config

    return load_config(base_args.config, [*base_args.override, *extra])


# ---- two ranks in two processes ---------------------------------------------------------------------------------
def _two_rank_child(rank, port, cfg, samples, adv, threads, reps, out_q):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from actors.learner_rank import LearnerRank

    r = LearnerRank(cfg, rank, 2, "127.0.0.1", port, num_threads=threads)
    times = []
    for _ in range(reps + 1):
        torch.distributed.barrier()
        t0 = time.perf_counter()
        r.update(samples, adv)
        times.append(time.perf_counter() - t0)
    out_q.put((rank, times[1:]))
    torch.distributed.barrier()


def two_ranks(cfg, samples, adv, threads: int, reps: int) -> list[float]:
    """Seconds per update of a 2-rank group (each rank's update on the whole batch list, its own rows; the slower
    rank's time per round)."""
    import torch.multiprocessing as mp

    from actors.deepspeed_setup import free_port

    ctx = mp.get_context("spawn")
    q, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_two_rank_child, args=(r, port, cfg, samples, adv, threads, reps, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    return [max(a, b) for a, b in zip(got[0], got[1])]


# ---- report -----------------------------------------------------------------------------------------------------
def summarize(name, times, tokens, extra) -> dict:
    med = statistics.median(times)
    return {"variant": name, "step_s": med, "tokens_per_s": tokens / med, "all_step_s": times, **extra}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/tiny.yaml")
    ap.add_argument("--override", action="append", default=[], help="a k=v override for every variant")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: every core)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variant", action="append", default=[], help="NAME=k=v,k=v: one more LearnerRank variant")
    ap.add_argument("--no-standard", action="store_true", help="skip the standard-estimator variant")
    ap.add_argument("--two-ranks", action="store_true", help="also time the 2-rank layout (2 processes)")
    ap.add_argument("--samples", help="keep the generated batch in this file (read it when it exists)")
    ap.add_argument("--rows", type=int, default=0, help="time the first N rows of the batch only (default: all)")
    ap.add_argument("--no-plain", action="store_true", help="skip plain torch (ratios are then not reported)")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    cfg = variant_config(args, [])
    t0 = time.perf_counter()
    samples, adv = load_or_make_batch(cfg, args.samples)
    if args.rows:
        samples, adv = samples[: args.rows], adv[: args.rows]
    tokens = batch_tokens(samples)
    resp = sum(s.response_len for s in samples)
    print(
        f"learner_speed: {args.config} {' '.join(args.override)}; {len(samples)} rows, {tokens} tokens "
        f"({tokens - resp} prompt + {resp} response), batch in {time.perf_counter() - t0:.0f} s; {threads} "
        f"thread(s), load {os.getloadavg()[0]:.2f}",
        flush=True,
    )

    specs = [("replay", [])] + ([] if args.no_standard else [("standard", STANDARD)])
    for v in args.variant:
        name, _, kv = v.partition("=")
        specs.append((name, [x for x in kv.split(",") if x]))
    runners = {} if args.no_plain else {"plain": PlainStep(cfg, samples, adv)}
    for name, extra in specs:
        runners[name] = RankStep(variant_config(args, extra), samples, adv, threads)
    times = {name: [] for name in runners}
    cpu = {name: [] for name in runners}  # this process's CPU seconds: less moved by other jobs than wall seconds
    for rep in range(args.reps + 1):
        for name, run in runners.items():
            torch.set_num_threads(threads)
            t, c = time.perf_counter(), time.process_time()
            run(warm_up=not rep)
            took, cpu_took = time.perf_counter() - t, time.process_time() - c
            print(
                f"learner_speed: round {rep}{' (warm-up)' if not rep else ''} {name}: {took:.3f} s "
                f"(CPU {cpu_took:.3f} s)",
                flush=True,
            )
            if rep:  # round 0 is the warm-up
                times[name].append(took)
                cpu[name].append(cpu_took)
    results = []
    plain = statistics.median(times["plain"]) if "plain" in times else float("nan")
    for name, run in runners.items():
        extra = {}
        if isinstance(run, PlainStep):
            extra = {
                "fwd_bwd_s": statistics.median(t[0] for t in run.split[1:]),
                "optimizer_s": statistics.median(t[1] for t in run.split[1:]),
            }
        else:
            m = run.first_metrics
            extra = {
                "optimizer_s": statistics.median(run.step_s[1:]),
                # against the engine's log-probs only where the batch was drawn in the variant's mode
                "abs_logp_diff": m.get("mismatch/abs_logp_diff")
                if samples[0].decode_mode == run.rank.cfg.rollout.decode_mode
                else None,
                "zero_stage": run.rank.cfg.learner.zero_stage,
                "bf16": run.rank.cfg.learner.bf16,
                "estimator": run.rank.cfg.likelihood.estimator,
            }
        res = summarize(name, times[name], tokens, {**extra, "cpu_s": statistics.median(cpu[name])})
        res["vs_plain"] = plain / res["step_s"]
        results.append(res)
        run.close()
    if args.two_ranks:
        two = two_ranks(cfg, samples, adv, max(1, threads // 2), args.reps)
        res = summarize(
            "two_ranks", two, tokens, {"threads_per_rank": max(1, threads // 2), "zero_stage": cfg.learner.zero_stage}
        )
        res["vs_plain"] = plain / res["step_s"]
        results.append(res)
    for r in results:
        more = " ".join(
            f"{k} {r[k]:.3g}" for k in ("cpu_s", "fwd_bwd_s", "optimizer_s", "abs_logp_diff") if r.get(k) is not None
        )
        print(
            f"learner_speed: {r['variant']:>10}: {r['step_s']:.3f} s/update = {r['tokens_per_s']:.0f} tokens/s, "
            f"{r['vs_plain']:.2f}x plain  ({more})  [{' '.join(f'{t:.3f}' for t in r['all_step_s'])}]",
            flush=True,
        )
    report = {
        "config": args.config,
        "overrides": args.override,
        "threads": threads,
        "rows": len(samples),
        "tokens": tokens,
        "load_after": os.getloadavg(),
        "results": results,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({r["variant"]: round(r["vs_plain"], 3) for r in results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
