"""An fbrl GRPO job (configs/tiny.yaml by default, or e.g. configs/smollm_rl.yaml; standard decode mode) run by
Hugging Face TRL's GRPOTrainer.

Run in a venv with trl==1.16.0 (no vLLM), with fbrl's source on PYTHONPATH for its config, data and reward code
(those imports pull no vLLM / Ray / DeepSpeed / wandb; checked at start):

    PYTHONPATH=<checkout> <trl venv>/bin/python run_trl.py --model WORK/tiny-arith-mixed-llama --out WORK/trl \\
        --config <checkout>/configs/tiny.yaml rollout.decode_mode=standard likelihood.estimator=standard \\
        'train.eval_decode_modes=[standard]' train.steps=40 train.eval_every=40 train.checkpoint_every=0

Every setting comes from the fbrl config given (the same file and key=value overrides as the fbrl run), so the two
jobs cannot drift apart: the train prompts are fbrl's (`load_task_split` + `PromptFitter` + `PromptSampler` with
train.seed, in fbrl's order, fed to TRL unshuffled: step k trains on exactly fbrl's step-k prompts, checked by
digest), the held-out set is fbrl's (`load_task_split(data, "test", n=train.eval_n)`), and the reward and the
accuracy check are fbrl's `math` reward (rewards.loader.build_reward_set, strict on arith, as
actors/reward_workers.py builds it) called through a TRL reward_funcs wrapper that passes finish reasons (a
truncated completion scores 0, as in fbrl). The model is the FBT checkpoint exported as a plain
LlamaForCausalLM (export_llama.py: bit-equal to fbrl's standard mode), or the stock Llama an FBT was converted
from (export_llama.py --check). The held-out greedy eval runs before and after training with transformers
`generate` (do_sample=False, max_new_tokens=rollout.max_tokens, stop at EOS), scored like fbrl's eval.

Chat tasks (data.chat_template, e.g. word_problems): fbrl renders each row's `messages` with the tokenizer's chat
template and encodes the text without added special tokens. TRL gets the same `messages` as conversational
prompts and applies the same tokenizer's template itself (`apply_chat_template(add_generation_prompt=True)`);
its token ids are checked equal to fbrl's for the first step's prompts through TRL's own `_tokenize_prompts`.
The rendered text rides along as the `fbrl_prompt` column (for the digest and the reward's `prompts`).

Prints one line per step (reward, accuracy, length, truncation, seconds and where they went, the learner
phase's tokens/s) and writes OUT/result.json (per-step times, rewards, token counts and each row's prompt /
completion length, prompt digests, eval before/after, the step-1 gradient check) for run_compare.sh /
summarize.py / bench_torch.py. At step 1 it also runs fbrl's learner on TRL's own samples and compares gradients
(--no-check-gradient skips it; its time is kept out of the step times). The config's mapping onto GRPOConfig is
trl_settings.py; the held-out eval and the gradient check are fbrl_checks.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from bench.peer_trl.trl_settings import map_settings


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/tiny.yaml", help="fbrl config (the same as the fbrl run)")
    ap.add_argument("--model", required=True, help="exported plain Llama dir (export_llama.py)")
    ap.add_argument("--out", required=True, help="output dir (result.json, TRL output_dir)")
    ap.add_argument(
        "--eval-batch-size",
        type=int,
        default=0,
        help="greedy eval batch (0: all eval rows at once, like fbrl's loop eval)",
    )
    ap.add_argument(
        "--threads", type=int, default=0, help="torch intra-op threads (0: torch's default, the core count)"
    )
    ap.add_argument(
        "--no-check-gradient",
        action="store_true",
        help="skip the step-1 check that fbrl's learner gives TRL's gradient on TRL's own samples",
    )
    ap.add_argument("overrides", nargs="*", help="fbrl dotted key=value overrides (train.steps=N, ...)")
    return ap.parse_args()


def digest(prompts) -> str:
    """fbrl's `prompts_digest` (rl/loop.py `_digest`) of one step's prompts, in order."""
    return hashlib.sha256("\x00".join(prompts).encode()).hexdigest()[:16]


def main() -> int:
    args = parse_args()
    t_start = time.perf_counter()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    # fbrl's own code (config, data, reward, the checks using them): importing it must not pull in vLLM / Ray /
    # DeepSpeed
    from bench.peer_trl.fbrl_checks import check_gradient, eval_agreement, greedy_eval
    from rewards.loader import build_reward_set
    from rl.config import load_config
    from rl.data.loaders import PromptSampler, load_task_split, reward_columns
    from rl.data.prompts import PromptFitter, prompt_token_limit

    heavy = sorted({m.split(".")[0] for m in sys.modules} & {"vllm", "ray", "deepspeed", "wandb"})
    if heavy:
        raise SystemExit(f"run_trl.py: importing fbrl's data/reward code pulled in {heavy}")

    cfg = load_config(args.config, args.overrides)
    settings = map_settings(cfg)
    import transformers
    import trl

    print(
        f"trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), fbrl config {args.config} + {args.overrides}",
        flush=True,
    )
    torch.manual_seed(cfg.train.seed)

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM", type(model).__name__
    G, B, N = cfg.rollout.n_samples_per_prompt, cfg.train.prompts_per_step, cfg.train.steps

    # ---- data: fbrl's rows, fitter and sampler (rl/loop.py `train` / `generate_batch`)
    fitter = PromptFitter(tok, prompt_token_limit(cfg, model.config), cfg.data.overlong_prompts)
    train_rows, over = fitter.fit(load_task_split(cfg.data, "train", tokenizer=tok), "train data")
    eval_rows, over_e = fitter.fit(load_task_split(cfg.data, "test", n=cfg.train.eval_n, tokenizer=tok), "eval data")
    if over or over_e:
        raise SystemExit("run_trl.py: over-long prompts are not handled here")
    chat = {bool(r.get("chat_templated")) for r in train_rows + eval_rows}
    if len(chat) != 1:
        raise SystemExit("run_trl.py: a mix of chat-templated and plain prompts is not handled here")
    chat = chat.pop()  # rows rendered with the chat template (fbrl encodes them without added special tokens)
    reward_columns(train_rows + eval_rows)
    sampler = PromptSampler(train_rows, seed=cfg.train.seed)
    steps_rows = [sampler.next(B) for _ in range(N)]
    expected_digests = [digest(r["prompt"] for r in rows) for rows in steps_rows]
    flat = [row for rows in steps_rows for row in rows]
    prompt_lens = {r["prompt"]: len(fitter.encode(r)) for r in flat}  # fbrl's prompt ids, by rendered text
    if not chat:
        # TRL tokenizes a plain prompt with processing_class(text=...) (add_special_tokens=True): fbrl's ids
        assert tok([r["prompt"] for r in flat[:B]])["input_ids"] == [fitter.encode(r) for r in flat[:B]]
    keep = ("answer", "id", "question", "difficulty")
    # chat rows: TRL gets the conversation and applies the chat template itself; fbrl's rendered text rides along
    train_ds = datasets.Dataset.from_list(
        [
            {
                "prompt": row["messages"] if chat else row["prompt"],
                "fbrl_prompt": row["prompt"],
                **{k: row[k] for k in keep},
            }
            for row in flat
        ]
    )

    # ---- reward: fbrl's `math` reward, built as actors/reward_workers.py builds it from reward.fns
    entries = cfg.reward.entries()
    if len(entries) != 1 or entries[0]["fn"] != "math" or entries[0].get("weight", 1.0) != 1.0:
        raise SystemExit(f"run_trl.py: only a single math reward of weight 1 is wired, got {entries}")
    # actors/reward_workers.py `_math_options` (that module imports Ray, so its two lines are repeated here), then
    # fbrl's own loader: the same MathReward (strict on arith, reward.num_workers, the entry's timeout)
    entries[0]["options"] = {
        "num_workers": cfg.reward.num_workers,
        **({"strict": True} if cfg.data.task == "arith" else {}),
        **(entries[0].get("options") or {}),
    }
    scorer = build_reward_set(entries, default_timeout_s=cfg.reward.timeout_s).entries[0].fn
    assert type(scorer).__name__ == "MathReward" and scorer.strict == (cfg.data.task == "arith"), scorer
    eos_ids = {tok.eos_token_id}

    def finish_reasons(completion_ids):
        return ["stop" if ids and ids[-1] in eos_ids else "length" for ids in completion_ids]

    calls = []  # one entry per reward call = per generation batch = per optimizer step
    first_batch = {}  # step 1's samples, for the gradient check

    def fbrl_math(prompts, completions, completion_ids, answer, fbrl_prompt, **kwargs):
        t0 = time.perf_counter()
        reasons = finish_reasons(completion_ids)
        # conversational completions are [{"role": "assistant", "content": text}] (TRL's decode, special tokens
        # skipped, as fbrl's); fbrl_prompt is the prompt text fbrl's reward gets (the rendered chat)
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        cols = {k: kwargs[k] for k in ("id", "question", "difficulty") if k in kwargs}
        scores = [float(s) for s in scorer(fbrl_prompt, texts, answer, finish_reasons=reasons, **cols)]
        if not calls:
            first_batch.update(
                prompts=list(fbrl_prompt),
                completion_ids=[list(c) for c in completion_ids],
                reasons=reasons,
                scores=scores,
            )
        rows = [[prompt_lens[p], len(c)] for p, c in zip(fbrl_prompt, completion_ids)]
        calls.append(
            {
                "digest": digest(fbrl_prompt[::G]),
                "reward": sum(scores) / len(scores),
                "len": sum(len(c) for c in completion_ids) / len(completion_ids),
                "trunc": reasons.count("length") / len(reasons),
                "time_reward_s": time.perf_counter() - t0,
                "prompt_tokens": sum(r[0] for r in rows),
                "completion_tokens": sum(r[1] for r in rows),
                "row_lengths": rows,
            }
        )
        return scores

    def held_out(m) -> dict:
        return greedy_eval(m, eval_rows, fitter, tok, scorer, cfg, args.eval_batch_size)

    ev0 = held_out(model)
    print(
        f"trl step {0:>{len(str(N))}}/{N} | eval standard {ev0['accuracy']:.3f} (held-out greedy, {ev0['n']} "
        f"problems; mean len {ev0['mean_len']:.1f}, trunc {ev0['truncated']:.2f}; {eval_agreement(ev0)}; "
        f"{ev0['time_s']:.1f}s)",
        flush=True,
    )

    # ---- the trainer
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    targs = GRPOConfig(output_dir=str(out / "trl_output"), **settings)
    assert targs.generation_batch_size == B * G and targs.steps_per_generation == targs.gradient_accumulation_steps
    trainer = GRPOTrainer(
        model=model, reward_funcs=[fbrl_math], args=targs, train_dataset=train_ds, processing_class=tok
    )
    if chat:  # TRL's own tokenization of the conversations (its chat template call) gives fbrl's prompt ids
        trl_ids = trainer._tokenize_prompts([r["messages"] for r in flat[:B]])[0]
        assert [list(x) for x in trl_ids] == [fitter.encode(r) for r in flat[:B]], "TRL's chat prompt ids differ"
        print(
            f"trl prompts: conversational, TRL's chat-template ids equal fbrl's for step 1's {B} prompts "
            f"({min(map(len, trl_ids))}-{max(map(len, trl_ids))} tokens)",
            flush=True,
        )
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)

    gen_times = []
    inner_generate = trainer._generate_single_turn

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        try:
            return inner_generate(*a, **kw)
        finally:
            gen_times.append(time.perf_counter() - t0)

    trainer._generate_single_turn = timed_generate

    trl_grad = {}
    inner_clip = trainer._clip_grad_norm

    def capturing_clip(m):
        if not trl_grad:  # step 1: the accumulated gradient before clipping
            trl_grad["g"] = torch.cat(
                [
                    (p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten()
                    for p in trainer.model.parameters()
                ]
            ).clone()
        return inner_clip(m)

    trainer._clip_grad_norm = capturing_clip
    gradient_check = {}

    steps = []

    class StepTimer(TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            self.last = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            now = time.perf_counter()
            dt, self.last = now - self.last, now
            c = calls[-1] if calls else {}
            k = state.global_step
            rollout = gen_times[-1] if len(gen_times) >= k else float("nan")
            rw = c.get("time_reward_s", float("nan"))
            tokens = c.get("prompt_tokens", 0) + c.get("completion_tokens", 0)  # the rows the learner trained on
            s = {
                "step": k,
                "time_step_s": dt,
                "time_rollout_s": rollout,
                "time_reward_s": rw,
                "time_learner_s": dt - rollout - rw,
                "reward_mean": c.get("reward"),
                "response_len_mean": c.get("len"),
                "truncation_rate": c.get("trunc"),
                "prompts_digest": c.get("digest"),
                "prompts_match_fbrl": c.get("digest") == expected_digests[k - 1],
                "prompt_tokens": c.get("prompt_tokens"),
                "completion_tokens": c.get("completion_tokens"),
                "learner_tokens_per_s": tokens / (dt - rollout - rw),
                "row_lengths": c.get("row_lengths"),
            }
            steps.append(s)
            print(
                f"trl step {k:>{len(str(N))}}/{N} | reward {s['reward_mean']:.3f} acc {s['reward_mean']:.3f} | "
                f"len {s['response_len_mean']:.1f} trunc {s['truncation_rate']:.2f} | {dt:.1f}s: rollout "
                f"{rollout:.1f} reward {rw:.2f} learner {s['time_learner_s']:.1f} ({tokens} tokens, "
                f"{s['learner_tokens_per_s']:.0f}/s) | prompts = fbrl step {k}: "
                f"{'yes' if s['prompts_match_fbrl'] else 'NO'}",
                flush=True,
            )
            if k == 1 and not args.no_check_gradient:
                gradient_check.update(check_gradient(trl_grad, args.model, first_batch, tok, chat, cfg))
                self.last = time.perf_counter()  # the check is not part of any step's time
                gradient_check["time_s"] = self.last - now  # nor of TRL's process (summarize.py takes it out)

    trainer.add_callback(StepTimer())
    print("trl trainer built", flush=True)  # the end of start-up on the timeline (summarize.py)
    t_train = time.perf_counter()
    trainer.train()
    train_wall = time.perf_counter() - t_train
    ev1 = held_out(trainer.model)
    times = [s["time_step_s"] for s in steps]
    print(
        f"trl step {N}/{N} | eval standard {ev1['accuracy']:.3f} (held-out greedy, {ev1['n']} problems; mean len "
        f"{ev1['mean_len']:.1f}, trunc {ev1['truncated']:.2f}; {eval_agreement(ev1)}; {ev1['time_s']:.1f}s)",
        flush=True,
    )
    med = statistics.median(times) if times else float("nan")
    print(
        f"trl done: {len(steps)} steps, median {med:.2f} s/step, train loop {train_wall:.1f}s, process "
        f"{time.perf_counter() - t_start:.1f}s; held-out greedy accuracy (standard, {ev1['n']} problems): "
        f"{ev0['accuracy']:.3f} -> {ev1['accuracy']:.3f} ({100 * (ev1['accuracy'] - ev0['accuracy']):+.1f} points)",
        flush=True,
    )
    result = {
        "framework": "trl",
        "trl_version": trl.__version__,
        "steps": steps,
        "median_step_s": med,
        "eval_before": ev0,
        "eval_after": ev1,
        "train_wall_s": train_wall,
        "process_wall_s": time.perf_counter() - t_start,
        "expected_digests": expected_digests,
        "gradient_check": gradient_check,
        "settings": dict(settings),
        "fbrl_config": args.config,
        "overrides": args.overrides,
        "torch_threads": torch.get_num_threads(),
    }
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    if not all(s["prompts_match_fbrl"] for s in steps) or len(steps) != N:
        print("run_trl.py: TRL did not train on fbrl's prompts step for step", file=sys.stderr)
        return 1
    if any(math.isnan(s["time_rollout_s"]) for s in steps):
        print("run_trl.py: a step had no generation timing (generation not once per step?)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
