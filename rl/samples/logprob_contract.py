"""The log-prob contract: the behaviour policy's density, one definition for the engines and the learner.

A rollout token is drawn from softmax(logits / T) restricted to a kept set K and renormalised over it:

    π_b(y) = softmax(logits / T)[y] / Σ_{v ∈ K} softmax(logits / T)[v]   (y ∈ K; 0 outside)

K is every token when top-k and top-p are off. Otherwise, as vLLM 0.32 builds it (`apply_top_k_top_p`): top-k
keeps the tokens whose scaled logit is >= the k-th largest (ties at the boundary stay), then top-p keeps, in
descending order of the top-k-renormalised probabilities, each token whose preceding mass is < top_p (the most
likely token always stays). Both engines return log π_b of the sampled token (the torch engine through
`rollout/sampling.py`, vLLM with `logprobs_mode="processed_logprobs"`, which is log_softmax of the masked
logits), and the learner's estimators score rollout tokens with the same π_b, so the ratio the mismatch metrics
and TIS see is 1 up to numerics when the weights are the behaviour weights.

The learner applies the truncation too (rather than full-vocabulary log-probs) because the policy that
generated the data is the truncated one: its ratio to the full-vocabulary policy, Σ_{v ∈ K} p_v, is < 1 for
every token, a gap of 7.6e-2 per token at top_p 0.8 that TIS would read as mismatch and clip. The gradient is
then the policy gradient of π_b: logits inside K move, the ones outside get none (the tokens there could not be
sampled). The kept set is rebuilt from the learner's own logits; a sampled token that rounding puts just outside
it is kept anyway (`always_keep`), so a rollout token never scores -inf.

T = 0 is greedy: log-probs of the untempered logits. Temperatures in (0, TEMPERATURE_MIN) or above
TEMPERATURE_MAX are refused (vLLM clamps the first silently and rejects the second; both engines refuse both
the same way, `rl.samples.batch.SamplingParams.validate`).
"""

from __future__ import annotations

import torch

SORT_CHUNK = 2**24  # top-p sorts this many entries at a time (values + int64 indices: 12 bytes each)


def truncation_active(top_k: int, top_p: float) -> bool:
    return top_k > 0 or top_p < 1.0


@torch.no_grad()
def kept_tokens(scaled_logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor | None:
    """[..., V] bool: the kept set K of each row of logits / T (None when top-k and top-p are off)."""
    if not truncation_active(top_k, top_p):
        return None
    x = scaled_logits.float()
    V = x.shape[-1]
    keep = torch.ones_like(x, dtype=torch.bool)
    if 0 < top_k < V:
        kth = x.topk(top_k, dim=-1).values[..., -1:]
        keep = x >= kth
    if top_p < 1.0:
        flat, kflat = x.reshape(-1, V), keep.reshape(-1, V)
        # rows in chunks of ~SORT_CHUNK entries: a learner micro-batch of thousands of tokens x a 100k vocabulary
        # would otherwise sort ~10 GB at once
        step = max(1, SORT_CHUNK // V)
        for i in range(0, flat.shape[0], step):
            rows = slice(i, i + step)
            probs = torch.softmax(flat[rows].masked_fill(~kflat[rows], float("-inf")), dim=-1)
            p_sorted, order = probs.sort(dim=-1, descending=True)
            keep_sorted = (p_sorted.cumsum(-1) - p_sorted) < top_p  # the mass before each token
            keep_sorted[:, 0] = True
            kflat[rows] &= torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        keep = kflat.reshape(keep.shape)
    return keep


def behaviour_log_softmax(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    always_keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """log π_b over the vocabulary ([..., V], fp32 or wider, -inf outside K), differentiable in `logits`.

    `always_keep` ([...] token ids) are put in K whatever the truncation says: the learner passes the sampled
    tokens, which the engine's kept set did contain.
    """
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature > 0 and temperature != 1.0:  # (T = 1: no [N, V] copy)
        x = x / temperature
    keep = kept_tokens(x.detach(), top_k, top_p) if temperature > 0 else None
    if keep is None:
        return torch.log_softmax(x, dim=-1)
    if always_keep is not None:
        keep = keep.scatter(-1, always_keep[..., None].to(keep.device), True)
    return torch.log_softmax(x.masked_fill(~keep, float("-inf")), dim=-1)


def entropy_of(logp: torch.Tensor) -> torch.Tensor:
    """Entropy [...] of distributions given as log-probs [..., V] that may hold -inf (truncated ones)."""
    finite = torch.isfinite(logp)
    # 0 · (-inf) is nan, in the value and in the gradient: take p · log p only where log p is finite
    safe = torch.where(finite, logp, torch.zeros_like(logp))
    return -(safe.exp() * safe * finite).sum(-1)
