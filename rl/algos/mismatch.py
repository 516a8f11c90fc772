"""Train/rollout mismatch: metrics and off-policy corrections (TIS, masking, masked IS).

The engine samples with its own numerics — and, in asynchronous training, with the weights of the version that
made the sample, up to `train.max_staleness` versions behind the learner; the learner recomputes log-probs of the
same tokens at its current weights (`old_logp`). Per token, log r = old_logp − engine_logp,
r = π_learner / π_engine: the denominator is always the engine's log-prob of the sampling version, so one ratio
corrects both the kernels' and the staleness' part of the mismatch. All tensors are `[B, T]` with a `[B, T]`
mask of response tokens; nothing here needs gradients.

Corrections are pure functions of the ratio behind the `IS_CORRECTIONS` registry (`register_is_correction`);
`rollout_correction` first lifts the token ratios to the requested level (token, sequence = Π r_t, geometric =
exp(mean log r_t)) and then applies the mode:

| mode       | weight                                    | token level         | sequence level            |
|------------|-------------------------------------------|---------------------|---------------------------|
| `truncate` | min(r, cap)                               | TIS                 | sequence TIS              |
| `mask`     | 1 inside [a, b], 0 outside                | token rejection     | sequence rejection        |
| `mis`      | r inside [a, b], 0 outside (masked IS)    | IcePop              | seq-MIS                   |

A masked token weighs 0 but stays in the loss denominators (the aggregation counts are taken from the
response mask), so masking never rescales the other tokens' gradients.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rl.registry import lookup, make_register

IS_LEVELS = ("token", "sequence", "geometric")
# name -> fn(ratio [B,T] (already at the level, masked positions arbitrary), mask [B,T] bool, cap, bounds)
#         -> (weights [B,T], kept [B,T] bool)
IS_CORRECTIONS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {}
register_is_correction = make_register(IS_CORRECTIONS, "IS correction")
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


def mismatch_metrics(
    learner_logp: Tensor, engine_logp: Tensor, mask: Tensor, bounds: tuple[float, float] = (0.8, 1.2)
) -> dict[str, float]:
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
        ess = w.sum() ** 2 / (w.numel() * (w**2).sum())
    else:
        ess = torch.ones((), dtype=log_r.dtype)
    vals = torch.stack([log_r.abs().sum() / n_tok, k3.sum() / n_tok, outside.sum() / n_tok, ess.to(log_r)])
    out = vals.tolist()
    return {
        "mismatch/abs_logp_diff": out[0],
        "mismatch/k3": out[1],
        "mismatch/ratio_outside_frac": out[2],
        "mismatch/seq_ess": out[3],
    }


def mismatch_decomposition(
    engine_logp: Tensor,
    exact_then: Tensor,
    exact_now: Tensor,
    estimator_now: Tensor,
    mask: Tensor,
    then_known: Tensor | None = None,
) -> dict[str, float]:
    """Mean |Δ| and mean Δ per part over masked tokens: engine = exact_then − engine, staleness = exact_now −
    exact_then (rows where `then_known` [B]), estimator = estimator_now − exact_now, total = their sum."""
    m = mask.bool()
    known = m if then_known is None else m & then_known.bool().to(m.device)[:, None]
    f = lambda t: t.detach().double()  # noqa: E731
    diffs = {
        "engine": (f(exact_then) - f(engine_logp), known),
        "staleness": (f(exact_now) - f(exact_then), known),
        "estimator": (f(estimator_now) - f(exact_now), m),
        "total": (f(estimator_now) - f(engine_logp), m),
    }
    out = {}
    for name, (d, where) in diffs.items():
        n = where.sum()
        if int(n) == 0:
            continue
        d = d.masked_fill(~where, 0.0)
        out[name] = float(d.abs().sum() / n)
        out[f"{name}_signed"] = float(d.sum() / n)
    return out


def get_is_correction(name: str) -> Callable[..., tuple[Tensor, Tensor]]:
    """The correction registered as `name`; ValueError listing the valid names otherwise."""
    return lookup(IS_CORRECTIONS, "IS mode", name)


@register_is_correction("truncate")
def truncated_is(ratio: Tensor, mask: Tensor, cap: float = 2.0, bounds=(0.5, 2.0)) -> tuple[Tensor, Tensor]:
    """TIS: weight min(r, cap); every token kept."""
    return ratio.clamp(max=cap), mask


@register_is_correction("mask")
def rejection_mask(ratio: Tensor, mask: Tensor, cap: float = 2.0, bounds=(0.5, 2.0)) -> tuple[Tensor, Tensor]:
    """Rejection: weight 1 where bounds[0] <= r <= bounds[1], 0 (dropped) elsewhere."""
    keep = (ratio >= bounds[0]) & (ratio <= bounds[1]) & mask
    return keep.to(ratio.dtype), keep


@register_is_correction("mis")
def masked_is(ratio: Tensor, mask: Tensor, cap: float = 2.0, bounds=(0.5, 2.0)) -> tuple[Tensor, Tensor]:
    """Masked IS: weight r inside [bounds[0], bounds[1]], 0 (dropped) outside — IcePop's double-sided mask at token
    level (its paper's band: [0.5, 5]), seq-MIS at sequence level."""
    keep = (ratio >= bounds[0]) & (ratio <= bounds[1]) & mask
    return torch.where(keep, ratio, torch.zeros_like(ratio)), keep


def rollout_correction(
    old_logp: Tensor,
    engine_logp: Tensor,
    mask: Tensor,
    mode: str = "truncate",
    level: str = "token",
    cap: float = 2.0,
    bounds: tuple[float, float] = (0.5, 2.0),
) -> tuple[Tensor, Tensor]:
    """Detached (weights [B,T], kept [B,T]) of correction `mode` at `level` (token r, or per sequence Π r_t /
    exp(mean log r_t) broadcast over its tokens); weights are 0 on padding and dropped tokens."""
    fn = get_is_correction(mode)
    if level not in IS_LEVELS:
        raise ValueError(f"unknown IS level {level!r}; valid choices: {', '.join(IS_LEVELS)}")
    log_r, m = _prep(old_logp, engine_logp, mask)
    if level != "token":
        log_r = sequence_log_ratio(log_r, m, level).unsqueeze(-1).expand_as(log_r)
    ratio = log_r.clamp(-_LOG_CLAMP, _LOG_CLAMP).exp()
    dtype = old_logp.dtype if old_logp.dtype in (torch.float32, torch.float64) else torch.float32
    weights, kept = fn(ratio, m, cap=cap, bounds=bounds)
    return weights.masked_fill(~m, 0.0).to(dtype), kept & m


IS_MODES = tuple(IS_CORRECTIONS)  # the built-in modes; `IS_CORRECTIONS` also holds any registered later
