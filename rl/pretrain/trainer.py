"""Multi-pass pretraining / SFT of an FBT checkpoint (`fbrl pretrain CONFIG [key=value ...]`).

Owns: the single-process training loop (torch AdamW, warmup + cosine/linear decay), per-pass validation loss,
and atomic checkpoints (save_pretrained + tokenizer); the multi-pass objective and the pass schedule are
rl/pretrain/objective.py.

The objective (docs/DESIGN.md §3): pass 1 is the ordinary forward; pass k fuses pass k-1's final-normalized
states shifted one position right and reruns the whole stack; `L = L_1 + mean(L_2..L_K)` with nothing
detached, so the gradient of L_k reaches every earlier pass through the carried states. Jitter (uniform on the
carried states, fresh per pass) and prefix mixin are applied by `model.multipass_forward` during training only.

K per step comes from `pretrain.pass_schedule` (deterministic by step fraction: `[[0.75,1],[0.97,2],[1.0,3]]`
is the paper's 75/22/3 %) or, with `pretrain.schedule: mixture`, from `pretrain.mixture_probs` drawn per step
with a seed (P(K=1), P(K=2), ...). The health signal printed at the end: pass-2 validation loss below pass-1.

Documents are `prompt + target + <eos>` (target = the row's `solution` if it has one, else its `answer`), one
per row, right-padded; `loss_on: response` masks the loss to the target and <eos> (SFT), `all` trains on
every token after the first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import torch

from rl import decode_modes
from rl import model as fbt_model
from rl.atomic_files import replace_dir
from rl.config import Config
from rl.data.tasks import TASKS
from rl.model.lora_policy import maybe_wrap
from rl.pretrain.objective import exact_loss, exact_step, lr_factor, max_passes, multipass_loss, passes_for_step

# ---------------------------------------------------------------------------------------- model + data


def load_model_and_tokenizer(cfg: Config):
    """A fresh FBT model (`model.init` set), an FBT checkpoint, or a stock Llama / Qwen2 / Qwen3 / Mistral converted to FBT."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    m = cfg.model
    dtype = getattr(torch, m.dtype)
    tok_dir = m.tokenizer or (None if m.init is not None else m.path)
    if tok_dir is None:
        from rl.data.tokenizer import build_tokenizer

        tokenizer = build_tokenizer()  # the project's char-level tokenizer (pad 0, bos 1, eos 2)
    else:
        tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    if m.init is not None:
        torch.manual_seed(cfg.pretrain.seed)
        model = (
            fbt_model.FBTLlamaForCausalLM(fresh_config(m.init, m.fusion_mode, tokenizer))
            if m.init.backbone == "llama"
            else fbt_model.FBTQwen2ForCausalLM(fresh_config(m.init, m.fusion_mode, tokenizer))
        )
        return model.to(dtype), tokenizer
    if not m.path:
        raise ValueError("model.path: required unless model.init describes a fresh model")
    if AutoConfig.from_pretrained(m.path).model_type.startswith("fbt_"):
        model = AutoModelForCausalLM.from_pretrained(m.path, dtype=dtype)
    else:
        model = fbt_model.convert_to_fbt(
            AutoModelForCausalLM.from_pretrained(m.path, dtype=dtype), m.fusion_mode, seed=cfg.pretrain.seed
        )
    return model, tokenizer


@torch.no_grad()
def identity_fusion_(model) -> None:
    """Make the fused input the token embedding itself, whatever the fed-back state: W_U = 0, W_T = I
    (linear_addition) or W_C = [0, I] (concat_projection). Then `F(h, e) = RMS(RMS(e)) * rms(e) = e` up to the
    RMS epsilons, every decode mode equals standard decoding, and the gradient with respect to W_U is not zero,
    so training can grow the latent channel. gate_product has no such setting (the token only gates the state)."""
    f, d = model.fusion, model.config.hidden_size
    eye = torch.eye(d, dtype=next(f.parameters()).dtype)
    if f.mode == "linear_addition":
        f.w_u.weight.zero_()
        f.w_t.weight.copy_(eye)
    elif f.mode == "concat_projection":
        f.w_c.weight.zero_()
        f.w_c.weight[:, d:].copy_(eye)
    else:
        raise ValueError(
            f"pretrain.fusion_init=identity: fusion {f.mode!r} has no identity setting "
            f"(use linear_addition or concat_projection)"
        )


def fresh_config(init, fusion_mode: str, tokenizer):
    """FBT config for a model built from scratch with the tokenizer's vocabulary and special ids."""
    base_cls = fbt_model.FBT_CLASSES[init.backbone][0]
    return base_cls(
        vocab_size=len(tokenizer),
        hidden_size=init.hidden_size,
        num_hidden_layers=init.num_layers,
        num_attention_heads=init.num_heads,
        num_key_value_heads=init.num_kv_heads,
        head_dim=init.hidden_size // init.num_heads,
        intermediate_size=init.intermediate_size,
        max_position_embeddings=init.max_position_embeddings,
        rope_theta=init.rope_theta,
        tie_word_embeddings=init.tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        fbt_fusion_mode=fusion_mode,
        architectures=[fbt_model.FBT_CLASSES[init.backbone][1].__name__],
    )


def encode_rows(rows: list[dict], tokenizer, seq_len: int, loss_on: str) -> list[tuple[list[int], list[int]]]:
    """Each row -> (ids, loss mask): prompt (+ BOS if the tokenizer adds one), target, <eos>; cut at seq_len.

    A target with calculator annotations (`<<48/2=24>>`) is encoded segment by segment, as a multi-turn rollout
    builds it (docs/TOOLS.md): the policy's text up to each `=`, then the tool's `24>>`, which is not trained on
    (loss mask 0, and so no feedback under `feedback_on: response`)."""
    from rl.data.loaders import encode_prompt
    from rl.data.word_problems import calculator_segments

    prompts = [encode_prompt(tokenizer, r) for r in rows]  # a templated chat already holds its special tokens
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    out = []
    for p, row in zip(prompts, rows):
        segments = calculator_segments(row.get("solution") or row["answer"])
        pieces = tokenizer([text for text, _ in segments], add_special_tokens=False)["input_ids"]
        t = [tok for piece in pieces for tok in piece]
        t_mask = [int(policy) for piece, (_, policy) in zip(pieces, segments) for _ in piece]
        ids = (p + t + eos)[:seq_len]
        mask = ([0] * len(p) + t_mask + [1] * len(eos))[:seq_len] if loss_on == "response" else [1] * len(ids)
        out.append((ids, mask))
    return out


def param_groups(model, p) -> list[dict]:
    """AdamW groups: backbone matrices (weight decay), backbone norms (none: decay would shrink them to 0), and
    the fusion at `pretrain.fusion_lr`. With `train_backbone: false` the backbone is frozen (no gradients)."""
    fusion_ids = {id(q) for n, q in model.named_parameters() if ".fusion." in f".{n}"}
    if not p.train_backbone:
        for q in model.parameters():
            q.requires_grad_(id(q) in fusion_ids and q.requires_grad)
    trainable = [q for q in model.parameters() if q.requires_grad]
    fusion = [q for q in trainable if id(q) in fusion_ids]
    backbone = [q for q in trainable if id(q) not in fusion_ids]
    groups = [
        {"params": [q for q in backbone if q.ndim >= 2], "weight_decay": p.weight_decay},
        {"params": [q for q in backbone if q.ndim < 2], "weight_decay": 0.0},
        {"params": fusion, "weight_decay": p.weight_decay, "lr": p.fusion_lr if p.fusion_lr is not None else p.lr},
    ]
    return [g for g in groups if g["params"]]


def collate_documents(encoded: list[tuple[list[int], list[int]]], pad_id: int):
    """Right-pad to the longest row: (input_ids, attention_mask, loss_mask), all [B, L] long."""
    L = max(len(ids) for ids, _ in encoded)
    B = len(encoded)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention = torch.zeros(B, L, dtype=torch.long)
    loss_mask = torch.zeros(B, L, dtype=torch.long)
    for b, (ids, mask) in enumerate(encoded):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        attention[b, : len(ids)] = 1
        loss_mask[b, : len(ids)] = torch.tensor(mask)
    return input_ids, attention, loss_mask


@torch.no_grad()
def validation_losses(model, batches, num_passes: int, feedback_on: str = "all", exact: bool = False) -> list[float]:
    """Per-pass validation loss (token-weighted over all batches) with K passes, no jitter, no mixin; with
    `exact`, the exact recurrence's loss is appended (the loss `soft` decoding sees)."""
    was_training = model.training
    model.eval()
    sums, count = [0.0] * (num_passes + exact), 0
    for input_ids, attention, loss_mask in batches:
        n = int(loss_mask[:, 1:].sum())
        _, losses = multipass_loss(model, input_ids, attention, loss_mask, num_passes, feedback_on=feedback_on)
        if exact:
            losses = losses + exact_loss(model, input_ids, attention, loss_mask, feedback_on)[1]
        sums = [s + float(loss) * n for s, loss in zip(sums, losses)]
        count += n
    model.train(was_training)
    return [s / max(count, 1) for s in sums]


# ------------------------------------------------------------------------------------------ checkpoints


def git_commit() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).resolve().parent,
                timeout=10,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def save_checkpoint(
    model, tokenizer, out_dir: str | Path, extra_files: dict[str, str] | None = None, lora=None
) -> None:
    """Write the checkpoint to `<out_dir>.tmp-<pid>` and swap it in, so `out_dir` is never half-written.

    With LoRA (`learner.lora`; `lora` an rl.model.lora_policy.LoraPolicy) the checkpoint is the merged model, and the adapters
    in peft's format go into its `adapter/` subdirectory.

    Written in a temporary directory beside `out_dir` and swapped in (`rl.atomic_files.replace_dir`): at every
    moment one complete checkpoint exists.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    if lora is None:
        model.save_pretrained(tmp, safe_serialization=True)
    else:
        model.save_pretrained(
            tmp, safe_serialization=True, state_dict={k: v.detach().clone() for k, v in lora.merged_tensors()}
        )
        lora.save_adapter(str(tmp / "adapter"))
    tokenizer.save_pretrained(tmp)
    for name, text in (extra_files or {}).items():
        (tmp / name).write_text(text)
    replace_dir(tmp, out)


# ----------------------------------------------------------------------------------------------- loop


def train(cfg: Config, log=print) -> dict:
    """Run `cfg.pretrain`; returns a summary (final per-pass val loss, wall time, the health check)."""
    from rl.data.loaders import PromptSampler, load_task_split

    p = cfg.pretrain
    torch.set_num_threads(p.threads)
    torch.manual_seed(p.seed)
    t_start, cpu_start = time.time(), time.process_time()
    model, tokenizer = load_model_and_tokenizer(cfg)
    if p.fusion_init == "identity":
        identity_fusion_(model)
    model, lora = maybe_wrap(
        model, cfg.learner.lora, p.seed
    )  # learner.lora: adapters + fusion train (rl/model/lora_policy.py)
    model.train()
    decode_modes.record(model.config, decode_modes.modes_of_pretraining(p))  # saved in every checkpoint's config
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    # chats (`messages` rows) are rendered with the tokenizer's template, as the RL job renders its prompts
    train_rows = load_task_split(cfg.data, "train", tokenizer=tokenizer)
    val_n = p.val_batches * p.batch_size
    file_task = not TASKS[cfg.data.task].generated  # generated tasks have their own val split
    val_rows = load_task_split(cfg.data, "test" if file_task else "val", n=val_n, tokenizer=tokenizer)
    train_enc = encode_rows(train_rows, tokenizer, p.seq_len, p.loss_on)
    val_enc = encode_rows(val_rows, tokenizer, p.seq_len, p.loss_on)
    val_batches = [
        collate_documents(val_enc[i : i + p.batch_size], pad_id) for i in range(0, len(val_enc), p.batch_size)
    ]
    sampler = PromptSampler(train_enc, seed=p.seed)  # rows here are encoded (ids, mask) pairs
    k_eval = max(3, max_passes(p))

    opt = torch.optim.AdamW(param_groups(model, p), lr=p.lr, betas=(0.9, 0.95))
    trainable = [q for q in model.parameters() if q.requires_grad]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, p))
    gen = torch.Generator().manual_seed(p.seed)  # jitter and prefix-mixin noise
    n_params = sum(q.numel() for q in model.parameters())
    if lora is not None:
        log(
            f"pretrain: LoRA rank {cfg.learner.lora.rank}, {sum(q.numel() for q in trainable) / 1e6:.3f}M "
            f"trainable parameters"
        )
    log(
        f"pretrain: {n_params / 1e6:.2f}M params, {len(train_rows)} train rows, {len(val_rows)} val rows, "
        f"{p.steps} steps x {p.batch_size}, max K={max_passes(p)}, threads={p.threads}"
    )

    history, k_counts, tokens = [], {}, 0
    with_exact = p.exact_prob > 0
    val = validation_losses(model, val_batches, k_eval, p.feedback_on, with_exact)
    history.append({"step": 0, "val": val})
    log("step 0 val " + _val_line(val, k_eval))
    t_loop = time.time()
    last = p.stop_after or p.steps
    for step in range(last):
        exact = exact_step(step, p)
        k = "exact" if exact else passes_for_step(step, p.steps, p)
        k_counts[k] = k_counts.get(k, 0) + 1
        input_ids, attention, loss_mask = collate_documents(sampler.next(p.batch_size), pad_id)
        if exact:
            loss, losses = exact_loss(model, input_ids, attention, loss_mask, p.feedback_on)
        else:
            loss, losses = multipass_loss(
                model, input_ids, attention, loss_mask, k, p.jitter, p.prefix_mixin, gen, p.feedback_on
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = (
            torch.nn.utils.clip_grad_norm_(model.parameters(), p.grad_clip) if p.grad_clip > 0 else torch.tensor(0.0)
        )
        opt.step()
        sched.step()
        tokens += int(attention.sum())
        if (step + 1) % cfg.logging.log_every == 0 and cfg.logging.progress:
            el = time.time() - t_loop
            log(
                f"step {step + 1}/{p.steps} K={k} loss={loss.item():.4f} "
                + " ".join(f"L{i + 1}={v.item():.4f}" for i, v in enumerate(losses))
                + f" lr={sched.get_last_lr()[0]:.2e} gnorm={float(grad_norm):.2f} tok/s={tokens / el:.0f}"
                + f" elapsed={el:.0f}s cpu={time.process_time() - cpu_start:.0f}s"
            )
        if (p.eval_every and (step + 1) % p.eval_every == 0) or step + 1 == last:
            val = validation_losses(model, val_batches, k_eval, p.feedback_on, with_exact)
            history.append(
                {
                    "step": step + 1,
                    "val": val,
                    "elapsed_s": round(time.time() - t_start, 1),
                    "cpu_s": round(time.process_time() - cpu_start, 1),
                }
            )
            log(f"step {step + 1} val " + _val_line(val, k_eval))
            if step + 1 < last:
                save_checkpoint(
                    model, tokenizer, p.out_dir, _extra_files(cfg, history, k_counts, t_start, cpu_start, False), lora
                )
    summary = _summary(cfg, history, k_counts, t_start, cpu_start, True)
    save_checkpoint(model, tokenizer, p.out_dir, _extra_files(cfg, history, k_counts, t_start, cpu_start, True), lora)
    return summary


def _val_line(val: list[float], k_eval: int) -> str:
    return " ".join(f"pass{i + 1}={v:.4f}" if i < k_eval else f"exact={v:.4f}" for i, v in enumerate(val))


def _summary(cfg, history, k_counts, t_start, cpu_start, finished: bool) -> dict:
    k_eval = max(3, max_passes(cfg.pretrain))
    val, exact = history[-1]["val"][:k_eval], history[-1]["val"][k_eval:]
    # cpu_time_s (all threads of this process) tells a run on a shared machine from a slow one: with one
    # thread on an idle core, wall time ~= cpu time.
    return {
        "finished": finished,
        "steps_done": history[-1]["step"],
        "stop_after": cfg.pretrain.stop_after,  # of `steps`: the schedules spanned those
        "wall_time_s": round(time.time() - t_start, 1),
        "cpu_time_s": round(time.process_time() - cpu_start, 1),
        "threads": cfg.pretrain.threads,
        "git_commit": git_commit(),
        "final_val_loss_per_pass": val,
        "final_val_loss_exact": exact[0] if exact else None,
        "pass2_below_pass1": len(val) > 1 and val[1] < val[0],
        "steps_per_k": {str(k): v for k, v in sorted(k_counts.items(), key=lambda kv: str(kv[0]))},
        "val_history": history,
    }


def _extra_files(cfg, history, k_counts, t_start, cpu_start, finished: bool) -> dict[str, str]:
    return {
        "pretrain_config.yaml": cfg.to_yaml(),
        "training_summary.json": json.dumps(_summary(cfg, history, k_counts, t_start, cpu_start, finished), indent=1),
    }


# ------------------------------------------------------------------------------------------------ CLI
