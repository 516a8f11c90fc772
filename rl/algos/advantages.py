"""Group-relative advantages (GRPO, Dr. GRPO, RLOO), dynamic sampling and the DAPO overlong penalty.

Every function takes one scalar reward per sample (`[N]`) and the sample's group id (prompt id); groups may be
of any size and in any order (ids need not be contiguous, sorted or dense). Advantages come back per sample
(`[N]`, in the rewards' float dtype, float32 for integer or half inputs); the loss broadcasts them over the
sample's tokens.

Group statistics are computed in float64, and a group whose rewards are all equal (max == min, which includes a
singleton) gets an advantage of exactly 0 from every estimator. In float32, `r - mean` of equal rewards is a
rounding residue of ~1 ulp and so is the std: eight rewards of 0.7 gave +0.056 each and sixteen of 1.1 gave
-0.107 under GRPO, a step trained on noise whenever another group had signal. The GRPO std is the unbiased
(n - 1) sample std, as in TRL and verl.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch
from torch import Tensor

from rl.registry import lookup, make_register

GroupIds = Tensor | Sequence[Hashable]
AdvantageFn = Callable[..., Tensor]

ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {}
register_advantage_estimator = make_register(ADVANTAGE_ESTIMATORS, "advantage estimator")


def get_advantage_estimator(name: str) -> AdvantageFn:
    """The estimator registered as `name` (`fn(rewards, group_ids, eps=1e-6) -> [N]`); ValueError lists valid names."""
    return lookup(ADVANTAGE_ESTIMATORS, "advantage estimator", name)


def group_index(group_ids: GroupIds, device: torch.device | None = None) -> tuple[Tensor, int]:
    """Dense group index `[N]` (0..K-1) and K for arbitrary ids: an int tensor, or any hashables (str, tuples)."""
    if isinstance(group_ids, Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids must be 1-D, got shape {tuple(group_ids.shape)}")
        uniq, idx = torch.unique(group_ids, return_inverse=True)
        return idx.to(device) if device is not None else idx, int(uniq.numel())
    first: dict[Hashable, int] = {}
    idx_list = [first.setdefault(g, len(first)) for g in group_ids]
    return torch.tensor(idx_list, dtype=torch.long, device=device), len(first)


def _float(x: Tensor) -> Tensor:
    return x if x.is_floating_point() and x.dtype != torch.float16 and x.dtype != torch.bfloat16 else x.float()


def _rewards64(rewards: Tensor) -> Tensor:
    r = torch.as_tensor(rewards)
    if r.dim() != 1:
        raise ValueError(f"rewards must be 1-D (one scalar per sample), got shape {tuple(r.shape)}")
    return r.to(torch.float64)


def _group_reduce(r: Tensor, group_ids: GroupIds) -> tuple[Tensor, int, Tensor]:
    idx, k = group_index(group_ids, device=r.device)
    if idx.numel() != r.numel():
        raise ValueError(f"{r.numel()} rewards but {idx.numel()} group ids")
    count = torch.zeros(k, dtype=r.dtype, device=r.device).index_add_(0, idx, torch.ones_like(r))
    return idx, k, count


def group_stats(rewards: Tensor, group_ids: GroupIds) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-sample group mean, unbiased (n - 1) std, group size and all-equal flag (each `[N]`, float64 / bool),
    for any grouping. A singleton group's std is 0 (and it counts as all-equal)."""
    r = _rewards64(rewards)
    idx, k, count = _group_reduce(r, group_ids)
    mean = torch.zeros(k, dtype=r.dtype, device=r.device).index_add_(0, idx, r) / count
    sq = torch.zeros(k, dtype=r.dtype, device=r.device).index_add_(0, idx, (r - mean[idx]) ** 2)
    std = (sq / (count - 1).clamp_min(1)).sqrt()
    empty = torch.zeros(k, dtype=r.dtype, device=r.device)
    hi = empty.scatter_reduce(0, idx, r, reduce="amax", include_self=False)
    lo = empty.scatter_reduce(0, idx, r, reduce="amin", include_self=False)
    return mean[idx], std[idx], count[idx], (hi == lo)[idx]


def _finish(adv: Tensor, equal: Tensor, rewards: Tensor) -> Tensor:
    """Exactly 0 for all-equal groups (no rounding residue), back in the rewards' float dtype."""
    return torch.where(equal, torch.zeros_like(adv), adv).to(_float(torch.as_tensor(rewards)).dtype)


@register_advantage_estimator("grpo")
def grpo_advantages(rewards: Tensor, group_ids: GroupIds, eps: float = 1e-6) -> Tensor:
    """GRPO: (r − group mean) / (group unbiased std + eps); all-equal and singleton groups give exactly 0."""
    mean, std, _, equal = group_stats(rewards, group_ids)
    return _finish((_rewards64(rewards) - mean) / (std + eps), equal, rewards)


@register_advantage_estimator("dr_grpo")
def dr_grpo_advantages(rewards: Tensor, group_ids: GroupIds, eps: float = 1e-6) -> Tensor:
    """Dr. GRPO: r − group mean, no std normalisation (`eps` is accepted for a uniform signature and unused);
    all-equal groups give exactly 0."""
    mean, _, _, equal = group_stats(rewards, group_ids)
    return _finish(_rewards64(rewards) - mean, equal, rewards)


@register_advantage_estimator("rloo")
def rloo_advantages(rewards: Tensor, group_ids: GroupIds, eps: float = 1e-6) -> Tensor:
    """RLOO: r − mean of the *other* samples in the group (= n/(n−1)·(r − mean)); singleton and all-equal groups
    give exactly 0."""
    r = _rewards64(rewards)
    mean, _, n, equal = group_stats(r, group_ids)
    scale = torch.where(n > 1, n / (n - 1).clamp_min(1), torch.zeros_like(n))
    return _finish(scale * (r - mean), equal, rewards)


def compute_advantages(
    rewards: Tensor, group_ids: GroupIds, estimator: str = "grpo", eps: float = 1e-6, scored: Tensor | None = None
) -> Tensor:
    """Advantages `[N]` with the estimator registered as `estimator`. `scored` (bool `[N]`): samples that no reward
    scored (TRL's `None` from every reward function) are left out of their group's statistics and get 0."""
    fn = get_advantage_estimator(estimator)
    if scored is None or bool(scored.all()):
        return fn(rewards, group_ids, eps=eps)
    out = torch.zeros_like(_float(rewards))
    if bool(scored.any()):
        if isinstance(group_ids, Tensor):
            ids = group_ids[scored]
        else:
            ids = [g for g, keep in zip(group_ids, scored.tolist()) if keep]
        out[scored] = fn(rewards[scored], ids, eps=eps).to(out.dtype)
    return out


def dynamic_sampling_mask(rewards: Tensor, group_ids: GroupIds, atol: float = 0.0) -> tuple[Tensor, int]:
    """DAPO dynamic sampling: per-sample keep mask `[N]` (bool) of groups whose rewards are not all equal
    (max − min > atol), and the number of groups dropped; a singleton group counts as all-equal."""
    r = _float(rewards)
    idx, k = group_index(group_ids, device=r.device)
    empty = torch.zeros(k, dtype=r.dtype, device=r.device)
    hi = empty.scatter_reduce(0, idx, r, reduce="amax", include_self=False)
    lo = empty.scatter_reduce(0, idx, r, reduce="amin", include_self=False)
    keep_group = (hi - lo) > atol
    return keep_group[idx], int((~keep_group).sum().item())


def overlong_penalty(response_lengths: Tensor, max_length: int, buffer_length: int, factor: float = 1.0) -> Tensor:
    """DAPO soft overlong penalty (≤ 0, add to the reward): 0 up to max_length − buffer_length, then linear
    down to −factor at max_length, and −factor beyond."""
    if not 0 < buffer_length <= max_length:
        raise ValueError(f"need 0 < buffer_length <= max_length, got {buffer_length}, {max_length}")
    lengths = _float(torch.as_tensor(response_lengths))
    exceed = lengths - (max_length - buffer_length)
    return (-exceed / buffer_length * factor).clamp(min=-factor, max=0.0)
