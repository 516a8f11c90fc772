"""How the torch engine lays prompts out for prefill: left-padded into one batch (`left_pad`), in groups of
similar length (`prefill_groups`) so that padding costs little (rollout/torch_engine.py says why left padding)."""

from __future__ import annotations

import torch


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, P] token ids and attention mask of left-padded prompts."""
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), P, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, P - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[b, P - len(p) :] = 1
    return ids.to(device), mask.to(device)


def prefill_groups(lengths: list[int], call_cost: float, max_distinct: int = 128) -> list[list[int]]:
    """Partition prompt indices into groups of similar length for prefill (each group left-padded on its own).

    Groups are ranges of the sorted lengths minimizing Σ rows × longest + call_cost × groups (dynamic
    programming): padding costs compute, every extra group costs one more forward call.
    """
    step = -(-max(lengths) // max_distinct)  # coarsen to ≤ max_distinct distinct lengths: the DP is quadratic
    keyed = [-(-n // step) * step for n in lengths]
    vals = sorted(set(keyed))
    counts = [0] * (len(vals) + 1)  # counts[j] = prompts with coarse length <= vals[j - 1]
    where = {v: j for j, v in enumerate(vals)}
    for k in keyed:
        counts[where[k] + 1] += 1
    for j in range(1, len(counts)):
        counts[j] += counts[j - 1]
    best, cut = [0.0] + [float("inf")] * len(vals), [0] * (len(vals) + 1)
    for j in range(1, len(vals) + 1):
        for i in range(j):
            cost = best[i] + (counts[j] - counts[i]) * vals[j - 1] + call_cost
            if cost < best[j]:
                best[j], cut[j] = cost, i
    bounds, j = [], len(vals)
    while j > 0:
        bounds.append((vals[cut[j]], vals[j - 1]))
        j = cut[j]
    return [[i for i, k in enumerate(keyed) if lo <= k <= hi] for lo, hi in reversed(bounds)]
