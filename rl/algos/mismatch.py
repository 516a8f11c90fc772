"""Train/rollout mismatch: metrics and truncated importance sampling (TIS) / masking.

The engine samples with its own numerics; the learner recomputes log-probs of the same tokens at the
behaviour policy (`old_logp`). Per token, log r = old_logp − engine_logp, r = π_learner / π_engine. All tensors
are `[B, T]` with a `[B, T]` mask of response tokens; nothing here needs gradients.
"""
from __future__ import annotations

import torch
from torch import Tensor

IS_MODES = ("truncate", "mask")
IS_LEVELS = ("token", "sequence", "geometric")
_LOG_CLAMP = 20.0  # exp(±20) keeps weights finite in float32 whatever the sequence length


def _prep(a: Tensor, b: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    if a.shape != b.shape or a.shape != mask.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)}, {tuple(b.shape)}, mask {tuple(mask.shape)}")
    m = mask.bool()
    log_r = (a.detach().double() - b.detach().double()).masked_fill(~m, 0.0)
    return log_r, m


def sequence_log_ratio(log_r: Tensor, mask: Tensor, level: str = "sequence") -> Tensor:
    """Per-sequence log ratio `[B]`: sum of token log ratios (`sequence`) or their mean (`geometric`)."""
    m = mask.bool()
    s = log_r.masked_fill(~m, 0.0).sum(-1)
    if level == "sequence":
        return s
    if level == "geometric":
        return s / m.sum(-1).clamp_min(1)
    raise ValueError(f"unknown sequence level {level!r}; valid choices: geometric, sequence")


def mismatch_metrics(learner_logp: Tensor, engine_logp: Tensor, mask: Tensor,
                     bounds: tuple[float, float] = (0.8, 1.2)) -> dict[str, float]:
    """Mean |Δ log p|, k3 KL(engine‖learner), fraction of token ratios outside `bounds` (masked tokens), and
    sequence-level ESS (Σw)²/(N·Σw²) ∈ (0, 1], w = Π_t r_t over non-empty sequences."""
    log_r, m = _prep(learner_logp, engine_logp, mask)
    n_tok = m.sum().clamp_min(1)
    ratio = log_r.clamp(-_LOG_CLAMP, _LOG_CLAMP).exp()
    k3 = (ratio - 1.0 - log_r).masked_fill(~m, 0.0)
    outside = ((ratio < bounds[0]) | (ratio > bounds[1])) & m
    seq_ok = m.any(-1)
    lw = sequence_log_ratio(log_r, m)[seq_ok]
    if lw.numel():
        w = (lw - lw.max()).exp()  # ESS is scale-free, so shift in log space for stability
        ess = w.sum() ** 2 / (w.numel() * (w ** 2).sum())
    else:
        ess = torch.ones((), dtype=log_r.dtype)
    vals = torch.stack([log_r.abs().sum() / n_tok, k3.sum() / n_tok, outside.sum() / n_tok, ess.to(log_r)])
    out = vals.tolist()
    return {"mismatch/abs_logp_diff": out[0], "mismatch/k3": out[1],
            "mismatch/ratio_outside_frac": out[2], "mismatch/seq_ess": out[3]}


def rollout_correction(old_logp: Tensor, engine_logp: Tensor, mask: Tensor, mode: str = "truncate",
                       level: str = "token", cap: float = 2.0,
                       bounds: tuple[float, float] = (0.5, 2.0)) -> tuple[Tensor, Tensor]:
    """Detached (weights [B,T], mask [B,T]): `truncate` (TIS) weight = min(r, cap); `mask` drops tokens or whole
    sequences (r = Π r_t for `sequence`, exp(mean log r_t) for `geometric`) whose r is outside `bounds`."""
    if mode not in IS_MODES:
        raise ValueError(f"unknown IS mode {mode!r}; valid choices: {', '.join(IS_MODES)}")
    if level not in IS_LEVELS:
        raise ValueError(f"unknown IS level {level!r}; valid choices: {', '.join(IS_LEVELS)}")
    log_r, m = _prep(old_logp, engine_logp, mask)
    if level != "token":
        log_r = sequence_log_ratio(log_r, m, level).unsqueeze(-1).expand_as(log_r)
    ratio = log_r.clamp(-_LOG_CLAMP, _LOG_CLAMP).exp()
    dtype = old_logp.dtype if old_logp.dtype in (torch.float32, torch.float64) else torch.float32
    if mode == "truncate":
        return ratio.clamp(max=cap).masked_fill(~m, 0.0).to(dtype), m
    keep = (ratio >= bounds[0]) & (ratio <= bounds[1]) & m
    return keep.to(dtype), keep
