"""Counter-based sampling for rollout engines: a sample's tokens depend on (seed, prompt index, sample index,
step) and the logits only — not on the batch it was decoded in.

Sample k of prompt i draws one uniform per step from a hash of (seed, i, k, step) and inverts the CDF of
softmax(logits / T) (after top-k / top-p if asked); no per-row `torch.Generator` loop in the step. Log-probs
follow the log-prob contract (rl/samples/logprob_contract.py): log π_b of the sampled token, where π_b is the
distribution sampled from (truncated by top-k / top-p and renormalised, the same kept set as vLLM's); T = 0 is
greedy with log-probs of the untempered logits.
"""

from __future__ import annotations

import torch

from rl.samples.logprob_contract import behaviour_log_softmax, truncation_active
from rl.samples.request import SamplingParams

_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """(x * m) mod 2**32 for x in [0, 2**32) in int64 without signed overflow (16-bit halves of m)."""
    return (x * (m & 0xFFFF) + (((x * (m >> 16)) & 0xFFFF) << 16)) & _MASK32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finalizer (full avalanche) on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def row_keys(seed: int, group_ids: torch.Tensor, sample_indices: torch.Tensor) -> torch.Tensor:
    """[B, 2] int64 keys of the random streams of samples (group_ids[b], sample_indices[b]) under `seed`."""
    seed = int(seed) & ((1 << 64) - 1)
    lo, hi = torch.tensor(seed & _MASK32), torch.tensor(seed >> 32)
    g = _fmix32(group_ids.long() * 2 + 1 & _MASK32)
    k = _fmix32(sample_indices.long() * 2 & _MASK32)
    k1 = _fmix32(g ^ _fmix32(lo ^ k))
    k2 = _fmix32(k ^ _fmix32(hi ^ g ^ 0x9E3779B9))
    return torch.stack([k1, k2], dim=1)


def uniforms(keys: torch.Tensor, step: int) -> torch.Tensor:
    """[B] float64 uniforms in [0, 1) with 53 random bits: a pure function of (key, step)."""
    t = torch.tensor(step & _MASK32)
    a = _fmix32(keys[:, 0] ^ _fmix32(t ^ keys[:, 1]))
    b = _fmix32(keys[:, 1] ^ _fmix32(a ^ 0x85EBCA6B))
    return ((a >> 6) * 2.0**27 + (b >> 5)).double() * 2.0**-53


def sample_tokens(logits: torch.Tensor, params: SamplingParams, u: torch.Tensor):
    """Sample one token per row. Returns (tokens [B] long, log-probs [B] float32 under the log-prob contract).

    `u` [B] are the rows' uniforms: the token is the first index whose CDF (in the order below) exceeds
    u * total mass, which samples it with its probability (inverse-CDF sampling).
    """
    logits = logits.float()
    if params.temperature == 0:
        lp, tok = torch.log_softmax(logits, dim=-1).max(dim=-1)  # argmax of log-probs = argmax of logits
        return tok, lp
    logp = behaviour_log_softmax(logits, params.temperature, params.top_k, params.top_p)
    probs = logp.exp()  # 0 outside the kept set
    order = None
    if truncation_active(params.top_k, params.top_p):
        # inverse CDF over the kept tokens in descending probability (the tail of zeros never reached)
        probs, order = probs.sort(dim=-1, descending=True)
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1:]
    # strictly below the total mass (u * total can round up to it): the first CDF entry above the target then
    # always belongs to a token with mass, so a zero-probability token is never drawn
    target = torch.minimum(u[:, None].double() * total, torch.nextafter(total, torch.zeros_like(total)))
    idx = torch.searchsorted(cdf, target, right=True)
    tok = (order.gather(1, idx) if order is not None else idx)[:, 0]
    return tok, logp.gather(1, tok[:, None])[:, 0]
