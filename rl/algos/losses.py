"""Policy losses (PPO clip with asymmetric/dual clip, REINFORCE), loss aggregation, KL to a reference policy,
and the "no usable signal" skip decision.

Shapes: `logp`, `old_logp`, `ref_logp`, `engine_logp`, `entropy`, `mask` are `[B, T]` over response tokens;
advantages are `[B]` (broadcast over tokens) or `[B, T]`. Loss functions return per-token matrices; only
`aggregate_loss` reduces, so a micro-batch given the *global* token/sequence counts returns its exact share of
the batch loss (sum the parts over micro-batches and ranks — with ranks, sum gradients rather than average).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rl.registry import lookup, make_register

from .mismatch import IS_LEVELS, get_is_correction, mismatch_metrics, rollout_correction

Count = int | float | Tensor | None

POLICY_LOSSES: dict[str, Callable] = {}
LOSS_AGG_MODES: dict[str, Callable] = {}
KL_ESTIMATORS: dict[str, Callable] = {}
register_policy_loss = make_register(POLICY_LOSSES, "policy loss")
register_loss_agg_mode = make_register(LOSS_AGG_MODES, "loss aggregation mode")
register_kl_estimator = make_register(KL_ESTIMATORS, "KL estimator")


def get_policy_loss(name: str) -> Callable:
    """`fn(logp, old_logp, advantages, cfg) -> (loss [B,T], {flag: bool [B,T]})` registered as `name`."""
    return lookup(POLICY_LOSSES, "policy loss", name)


def get_loss_agg_mode(name: str) -> Callable:
    """`fn(loss_mat, mask, global_token_count=, global_seq_count=, max_length=) -> scalar` registered as `name`."""
    return lookup(LOSS_AGG_MODES, "loss aggregation mode", name)


def get_kl_estimator(name: str) -> Callable:
    """`fn(logp, ref_logp) -> [B,T]` per-token KL(π‖π_ref) estimate registered as `name`."""
    return lookup(KL_ESTIMATORS, "KL estimator", name)


@dataclass
class PolicyLossConfig:
    """Static settings of `compute_policy_loss` (per-call counts and tensors are arguments)."""

    loss_type: str = "ppo"  # POLICY_LOSSES key: "ppo" | "reinforce"
    eps_low: float = 0.2  # ratio clipped below at 1 − eps_low (A < 0)
    eps_high: float = 0.2  # ratio clipped above at 1 + eps_high (A > 0); DAPO clip-higher: 0.28
    clip_ratio_c: float | None = None  # dual clip for A < 0: loss ≤ −A·c (c > 1); None = off
    agg_mode: str = "token_mean"  # LOSS_AGG_MODES key
    max_length: int | None = None  # constant normaliser of seq_mean_token_sum_norm (default: T of the call)
    kl_coef: float = 0.0  # 0 = no reference policy needed
    kl_estimator: str = "k3"  # KL_ESTIMATORS key
    is_mode: str | None = None  # engine/learner correction: None | an IS_CORRECTIONS name (truncate, mask, mis)
    is_level: str = "token"  # "token" | "sequence" | "geometric"
    is_cap: float = 2.0  # TIS cap C
    is_bounds: tuple[float, float] = (0.5, 2.0)  # ratios kept by the "mask" and "mis" modes

    def __post_init__(self) -> None:
        get_policy_loss(self.loss_type), get_loss_agg_mode(self.agg_mode), get_kl_estimator(self.kl_estimator)
        if self.eps_low < 0 or self.eps_high < 0 or self.eps_low >= 1:
            raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got {self.eps_low}, {self.eps_high}")
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.kl_coef > 0 and self.kl_estimator in KL_NOT_A_LOSS:
            raise ValueError(f"kl_estimator {self.kl_estimator!r} with kl_coef > 0: {KL_NOT_A_LOSS[self.kl_estimator]}")
        if self.is_mode is not None:
            get_is_correction(self.is_mode)  # ValueError naming the registered modes
        if self.is_level not in IS_LEVELS:
            raise ValueError(f"unknown is_level {self.is_level!r}; valid choices: {', '.join(IS_LEVELS)}")


def _f(x: Tensor) -> Tensor:
    """Half/bf16 → float32 (log-ratios and exp need it); float32/float64 unchanged. Gradients flow through."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _adv(advantages: Tensor, like: Tensor) -> Tensor:
    a = _f(advantages).detach().to(like.dtype)
    return a.unsqueeze(-1).expand_as(like) if a.dim() == 1 else a


# ---- policy losses: per-token matrices --------------------------------------------------------------------


@register_policy_loss("ppo")
def ppo_clip_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, cfg: PolicyLossConfig):
    """PPO: max(−A·r, −A·clip(r, 1−eps_low, 1+eps_high)), r = exp(logp − old_logp); with clip_ratio_c, also
    min(·, −A·c) where A < 0 (dual clip)."""
    logp = _f(logp)
    log_r = (logp - _f(old_logp).detach().to(logp.dtype)).clamp(-20.0, 20.0)
    ratio = log_r.exp()
    a = _adv(advantages, logp)
    lo, hi = 1.0 - cfg.eps_low, 1.0 + cfg.eps_high
    loss = torch.maximum(-a * ratio, -a * ratio.clamp(lo, hi))
    flags = {"clip_low": (a < 0) & (ratio < lo), "clip_high": (a > 0) & (ratio > hi)}
    if cfg.clip_ratio_c is not None:
        dual = (a < 0) & (ratio > cfg.clip_ratio_c)
        loss = torch.where(a < 0, torch.minimum(loss, -a * cfg.clip_ratio_c), loss)
        flags["clip_dual"] = dual
    return loss, flags


@register_policy_loss("reinforce")
def reinforce_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, cfg: PolicyLossConfig):
    """REINFORCE: −A·logp (`old_logp` unused); same gradient as PPO when logp == old_logp (one update per batch)."""
    logp = _f(logp)
    return -_adv(advantages, logp) * logp, {}


# ---- aggregation -------------------------------------------------------------------------------------------


def _den(count: Count, local: Tensor) -> Tensor:
    c = local if count is None else torch.as_tensor(count, dtype=local.dtype, device=local.device)
    return c.clamp_min(1)


def token_count(mask: Tensor) -> int:
    """Tokens `token_mean` divides by: sum them over micro-batches and ranks to get `global_token_count`."""
    return int(mask.bool().sum().item())


def seq_count(mask: Tensor) -> int:
    """Sequences with at least one token (what the `seq_mean_*` modes divide by); sum for `global_seq_count`."""
    return int(mask.bool().any(-1).sum().item())


@register_loss_agg_mode("token_mean")
def agg_token_mean(
    loss_mat: Tensor,
    mask: Tensor,
    global_token_count: Count = None,
    global_seq_count: Count = None,
    max_length: int | None = None,
) -> Tensor:
    """Σ masked token losses / global_token_count (default: this call's token count)."""
    m = mask.to(loss_mat.dtype)
    return (loss_mat * m).sum() / _den(global_token_count, m.sum())


@register_loss_agg_mode("seq_mean_token_mean")
def agg_seq_mean_token_mean(
    loss_mat: Tensor,
    mask: Tensor,
    global_token_count: Count = None,
    global_seq_count: Count = None,
    max_length: int | None = None,
) -> Tensor:
    """Mean over each sequence's tokens, then Σ over sequences / global_seq_count (default: non-empty seqs here)."""
    m = mask.to(loss_mat.dtype)
    per_seq = (loss_mat * m).sum(-1) / m.sum(-1).clamp_min(1)
    return per_seq.sum() / _den(global_seq_count, (m.sum(-1) > 0).sum().to(m.dtype))


@register_loss_agg_mode("seq_mean_token_sum_norm")
def agg_seq_mean_token_sum_norm(
    loss_mat: Tensor,
    mask: Tensor,
    global_token_count: Count = None,
    global_seq_count: Count = None,
    max_length: int | None = None,
) -> Tensor:
    """Dr. GRPO: each sequence's token-loss sum / max_length (a constant; default T), then Σ over sequences /
    global_seq_count (default: non-empty sequences here)."""
    m = mask.to(loss_mat.dtype)
    norm = float(max_length if max_length is not None else loss_mat.shape[-1])
    per_seq = (loss_mat * m).sum(-1) / norm
    return per_seq.sum() / _den(global_seq_count, (m.sum(-1) > 0).sum().to(m.dtype))


def aggregate_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str = "token_mean",
    *,
    global_token_count: Count = None,
    global_seq_count: Count = None,
    max_length: int | None = None,
) -> Tensor:
    """Reduce a `[B,T]` per-token loss with the aggregation mode registered as `mode`."""
    return get_loss_agg_mode(mode)(
        loss_mat, mask, global_token_count=global_token_count, global_seq_count=global_seq_count, max_length=max_length
    )


# ---- KL to the reference policy ------------------------------------------------------------------------------

KL_CLAMP = 10.0  # per-token k3 bound, as verl's low_var_kl (OpenRLHF clamps the same way)
# Estimators whose value is fine as a metric but whose gradient as a loss term is wrong: name -> why.
KL_NOT_A_LOSS = {
    "k1": "k1 = log π − log π_ref has zero expected gradient as a loss (E_π[∇ log π] = 0): it only "
    "adds noise; use k2 (its gradient is the gradient of KL(π‖π_ref)) or k3"
}


@register_kl_estimator("k1")
def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = log π − log π_ref (unbiased value, high variance, can be negative; refused as a loss term)."""
    return _f(logp) - _f(ref_logp).detach()


@register_kl_estimator("k2")
def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = ½ (log π − log π_ref)² (biased, low variance, ≥ 0)."""
    return 0.5 * (_f(logp) - _f(ref_logp).detach()) ** 2


@register_kl_estimator("k3")
def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = exp(log π_ref − log π) − (log π_ref − log π) − 1 (unbiased, ≥ 0; the GRPO paper's choice), clamped
    at KL_CLAMP per token like verl and OpenRLHF (a clamped token adds no gradient)."""
    # Without the clamp one token the reference finds far likelier (up to e^20) swamps the whole batch's loss.
    d = (_f(ref_logp).detach() - _f(logp)).clamp(-20.0, 20.0)
    return (d.exp() - d - 1.0).clamp(max=KL_CLAMP)


# ---- the one call the learner makes --------------------------------------------------------------------------


def compute_policy_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    cfg: PolicyLossConfig | None = None,
    *,
    ref_logp: Tensor | None = None,
    engine_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[Tensor, dict[str, float]]:
    """Loss (scalar, differentiable w.r.t. `logp`) and float metrics for one (micro-)batch; pass the global
    token/sequence counts when the batch is split so that the parts' losses and gradients sum to the whole's."""
    # old_logp None = on-policy (logp.detach()). engine_logp adds mismatch metrics and, with cfg.is_mode, an
    # off-policy correction: TIS / masks / masked IS with weights from old_logp vs engine_logp (the engine's
    # log-prob of the sampling version is the denominator); masked tokens weigh 0 but stay in the denominators,
    # so counts taken from the incoming `mask` stay valid. ref_logp is needed only when kl_coef > 0.
    cfg = cfg or PolicyLossConfig()
    if logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and mask {tuple(mask.shape)} differ")
    old = logp.detach() if old_logp is None else old_logp
    agg = dict(global_token_count=global_token_count, global_seq_count=global_seq_count, max_length=cfg.max_length)
    m = mask.bool()

    pg_mat, flags = get_policy_loss(cfg.loss_type)(logp, old, advantages, cfg)
    metrics: dict[str, Tensor] = {}
    if engine_logp is not None:
        metrics.update({k: torch.tensor(v) for k, v in mismatch_metrics(old, engine_logp, m).items()})
        if cfg.is_mode is not None:
            w, kept = rollout_correction(old, engine_logp, m, cfg.is_mode, cfg.is_level, cfg.is_cap, cfg.is_bounds)
            pg_mat = pg_mat * w.to(pg_mat.dtype)
            n = m.sum().clamp_min(1)
            metrics["is/weight_mean"] = (w.to(pg_mat.dtype) * m).sum() / n
            metrics["is/masked_frac"] = (m & ~kept).sum() / n
    pg_loss = aggregate_loss(pg_mat, m, cfg.agg_mode, **agg)
    loss = pg_loss
    if cfg.kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp")
        kl_mat = get_kl_estimator(cfg.kl_estimator)(logp, ref_logp)
        kl_loss = aggregate_loss(kl_mat, m, cfg.agg_mode, **agg)
        loss = pg_loss + cfg.kl_coef * kl_loss
        metrics["kl_loss"] = kl_loss

    with torch.no_grad():
        n = m.sum().clamp_min(1)
        log_r = (_f(logp).detach() - _f(old).detach().to(_f(logp).dtype)).clamp(-20.0, 20.0)
        mean = lambda x: (x.to(log_r.dtype) * m).sum() / n  # noqa: E731
        metrics["pg_loss"], metrics["loss"] = pg_loss, loss
        metrics["approx_kl"] = mean(log_r.exp() - 1.0 - log_r)  # k3 of old vs current policy
        metrics["ratio_mean"] = mean(log_r.exp())
        for name in ("clip_low", "clip_high", "clip_dual"):  # low/high always (0 for unclipped losses)
            if name in flags or name != "clip_dual":
                metrics[f"pg_clipfrac_{name[5:]}"] = mean(flags[name]) if name in flags else torch.zeros(())
        if entropy is not None:
            metrics["entropy"] = mean(_f(entropy))
        a = _adv(advantages, log_r)[m]
        if a.numel():
            metrics.update(
                {"adv_mean": a.mean(), "adv_std": a.std(correction=0), "adv_min": a.min(), "adv_max": a.max()}
            )
        names = list(metrics)
        vals = torch.stack([metrics[k].detach().to(device=log_r.device, dtype=torch.float64) for k in names])
    return loss, dict(zip(names, vals.tolist()))


def no_usable_signal(keep: Tensor | None = None, token_mask: Tensor | None = None) -> bool:
    """True = skip the optimizer step: no group survives dynamic sampling (`keep` [B]) or no token of a kept
    sample is left (`token_mask` [B,T]). Decide on the whole batch, before sharding, so every rank agrees."""
    if keep is None and token_mask is None:
        raise ValueError("no_usable_signal needs keep and/or token_mask")
    if keep is not None and not bool(keep.bool().any()):
        return True
    if token_mask is not None:
        tm = token_mask.bool()
        if keep is not None:
            tm = tm & keep.bool().to(tm.device).unsqueeze(-1)
        return not bool(tm.any())
    return False
