"""The multi-pass objective of `fbrl pretrain` and its pass schedule (rl/pretrain/trainer.py runs them).

Pass 1 is the ordinary forward; pass k fuses pass k-1's final-normalized states shifted one position right and
reruns the whole stack; `L = L_1 + mean(L_2..L_K)` with nothing detached (`multipass_loss`). `exact_loss` is
the exact recurrence (BPTT through every position). K per step comes from `pretrain.pass_schedule` or
`pretrain.mixture_probs` (`passes_for_step`); the learning rate follows warmup + decay (`lr_factor`).
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F

# ------------------------------------------------------------------------------------------- objective


def masked_ce(model, hidden: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Token-mean next-token cross-entropy of one pass.

    hidden [B, L, d] are the pass's final-normalized states; position t predicts input_ids[:, t+1], counted
    where loss_mask[:, t+1] is set. The LM head runs only on counted positions (saves most of the head's cost
    on large vocabularies and prompt-masked SFT).
    """
    target_mask = loss_mask[:, 1:].bool()
    h = hidden[:, :-1][target_mask]
    targets = input_ids[:, 1:][target_mask]
    if targets.numel() == 0:
        return hidden.sum() * 0.0  # keeps the graph (and the device) when a batch has nothing to learn
    logits = model.logits_from_hidden(h).float()
    return F.cross_entropy(logits, targets)


def multipass_loss(
    model,
    input_ids,
    attention_mask,
    loss_mask,
    num_passes: int,
    jitter: float = 0.0,
    prefix_mixin: float = 0.0,
    generator: torch.Generator | None = None,
    feedback_on: str = "all",
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """`L_1 + mean(L_2..L_K)` and the per-pass losses [L_1, ..., L_K] (graph kept, nothing detached).

    feedback_on="response": passes >= 2 fuse states only at the loss-masked (response) positions, so the
    K-pass forward converges to the `soft` decoding recurrence the model will be sampled with."""
    feedback_mask = None
    if feedback_on == "response":
        feedback_mask = model.feedback_mask(input_ids, attention_mask) & loss_mask.bool()
    out = model.multipass_forward(
        input_ids,
        num_passes,
        attention_mask=attention_mask,
        jitter=jitter,
        prefix_mixin=prefix_mixin,
        generator=generator,
        feedback_mask=feedback_mask,
    )
    losses = [masked_ce(model, h, input_ids, loss_mask) for h in out.hidden]
    total = losses[0] if num_passes == 1 else losses[0] + torch.stack(losses[1:]).mean()
    return total, losses


def exact_loss(
    model, input_ids, attention_mask, loss_mask, feedback_on: str = "all"
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """`L_exact` (and [L_exact]): the loss of the exact recurrence, backpropagated through time — the
    K -> infinity limit of the multi-pass objective.

    The recurrence runs token by token with a KV cache (`model.recurrent_forward`) from the first fed-back
    position on, so it costs about one pass of FLOPs (sequential in the sequence length; on CPU ~2.5x a parallel
    pass), where K passes cost K. With `feedback_on: response` that is the answer only: exactly the computation
    `soft` decoding does, at any answer length, where K passes are exact on the first K-1 answer tokens only.
    No plain pass is added: steps of the ordinary schedule (`exact_prob` < 1) train that one. Rows must be
    right-padded (`collate` does): padding then never reaches a real position."""
    fb = model.feedback_mask(input_ids, attention_mask)
    if feedback_on == "response":
        fb = fb & loss_mask.bool()
    loss = masked_ce(model, model.recurrent_forward(input_ids, feedback_mask=fb), input_ids, loss_mask)
    return loss, [loss]


# -------------------------------------------------------------------------------------------- schedule


def exact_step(step: int, pcfg) -> bool:
    """Whether optimizer step `step` trains the exact recurrence (`exact_loss`) instead of K passes: drawn with
    probability `pretrain.exact_prob` from a stream seeded by (seed, step), like the mixture's K."""
    return pcfg.exact_prob > 0 and random.Random(f"fbrl-exact:{pcfg.seed}:{step}").random() < pcfg.exact_prob


def passes_for_step(step: int, total_steps: int, pcfg) -> int:
    """K for optimizer step `step` (0-based) of `total_steps`.

    boundaries: the first `[fraction, K]` entry with step/total_steps < fraction (so with 100 steps and the
    default schedule, steps 0-74 run K=1, 75-96 K=2, 97-99 K=3). mixture: K ~ mixture_probs, drawn from a
    stream seeded by (seed, step) so a step's K never depends on what ran before it.
    """
    if pcfg.schedule == "mixture":
        rng = random.Random(f"fbrl-passes:{pcfg.seed}:{step}")
        return rng.choices(range(1, len(pcfg.mixture_probs) + 1), weights=pcfg.mixture_probs)[0]
    frac = step / max(total_steps, 1)
    for boundary, k in pcfg.pass_schedule:
        if frac < boundary:
            return int(k)
    return int(pcfg.pass_schedule[-1][1])


def max_passes(pcfg) -> int:
    if pcfg.schedule == "mixture":
        return max(k + 1 for k, p in enumerate(pcfg.mixture_probs) if p > 0)
    return max(int(k) for _, k in pcfg.pass_schedule)


def lr_factor(step: int, pcfg) -> float:
    """Linear warmup to 1, then cosine / linear decay to `min_lr_ratio` (constant: stays 1)."""
    if step < pcfg.warmup:
        return (step + 1) / pcfg.warmup
    if pcfg.lr_schedule == "constant":
        return 1.0
    progress = min(1.0, (step - pcfg.warmup) / max(1, pcfg.steps - pcfg.warmup))
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if pcfg.lr_schedule == "cosine" else 1 - progress
    return pcfg.min_lr_ratio + (1 - pcfg.min_lr_ratio) * shape
