"""The latent channel, made visible: how big the fusion weights are, how much of the fused input the fed-back
state makes up, and how much feedback moves the policy.

Computed by the learner (where the weights live: `actors/learner_rank.py` calls `latent_metrics` on rank 0 before each
update, on the samples the engines just drew with the same weights) and logged per step by the loop under
`learner/latent/*`; `plot_latent` draws them with the run's other plots.

- `w_state_norm`: ‖W_U‖_F (linear_addition, gate_product) or ‖W_C[:, :d]‖_F (concat_projection)
- `w_token_dev`: ‖W_T − I‖_F or ‖W_C[:, d:] − I‖_F: how far the token path moved from an identity start
- `w_gate_norm`: ‖W_G‖_F (gate_product)
- `state_share`: mean over fused response positions of ‖state term‖ / ‖token term‖ before the final RMS:
  ‖W_U h‖ / ‖W_T RMS(e)‖, or ‖W_C[:, :d] RMS(h)‖ / ‖W_C[:, d:] RMS(e)‖ (0 at an identity start)
- `gate_mean`, `gate_std`: gate_product: statistics of σ(W_G RMS(e)) there (the state is the value path)
- `policy_shift`: mean over response tokens of |log π_soft(y) − log π_standard(y)|: what feedback changes in the
  policy's log-probs of its own samples (0 at an identity start)
- `state_share_after_tool`, `policy_shift_after_tool` (multi-turn samples, docs/TOOLS.md): the same two at the first
  token the policy writes after a tool's answer, whose input fuses the state at the answer's last token

`policy_shift` uses the recorded states (replay, exact for the weights that drew the samples) when the batch has
them, else the exact recurrence; the standard log-probs are an ordinary forward. Subset: the first `max_rows` rows.
"""

from __future__ import annotations

import torch

from rl.estimators.likelihood import last_pass_inputs, run_pass, token_logprobs
from rl.samples.batch import LearnerBatch

__all__ = ["weight_norms", "latent_metrics", "plot_latent", "PLOTTED"]


@torch.no_grad()
def weight_norms(model) -> dict[str, float]:
    fusion, d = model.fusion, model.config.hidden_size
    if fusion.mode == "concat_projection":
        w = fusion.w_c.weight.float()
        eye = torch.eye(d, device=w.device)
        return {"w_state_norm": float(w[:, :d].norm()), "w_token_dev": float((w[:, d:] - eye).norm())}
    out = {"w_state_norm": float(fusion.w_u.weight.float().norm())}
    if fusion.mode == "linear_addition":
        w_t = fusion.w_t.weight.float()
        out["w_token_dev"] = float((w_t - torch.eye(d, device=w_t.device)).norm())
    else:
        out["w_gate_norm"] = float(fusion.w_g.weight.float().norm())
    return out


@torch.no_grad()
def _fusion_terms(model, carried: torch.Tensor, e: torch.Tensor) -> dict[str, float]:
    """Share of the state in the fused input at positions with carried states [n, d] and embeddings [n, d]."""
    from rl.model import rms_normalize

    fusion, d, eps = model.fusion, model.config.hidden_size, model.fusion.eps
    carried = carried.to(e.dtype)
    if fusion.mode == "gate_product":
        gate = torch.sigmoid(fusion.w_g(rms_normalize(e, eps))).float()
        return {"gate_mean": float(gate.mean()), "gate_std": float(gate.std())}
    if fusion.mode == "linear_addition":
        state, token = fusion.w_u(carried), fusion.w_t(rms_normalize(e, eps))
    else:
        w = fusion.w_c.weight
        state = rms_normalize(carried, eps) @ w[:, :d].T
        token = rms_normalize(e, eps) @ w[:, d:].T
    ratio = state.float().norm(dim=-1) / token.float().norm(dim=-1).clamp_min(1e-12)
    return {"state_share": float(ratio.mean())}


@torch.no_grad()
def latent_metrics(
    model, batch: LearnerBatch, decode_mode: str = "soft", max_rows: int = 4, temperature: float = 1.0
) -> dict[str, float]:
    """Every metric of the module docstring, on the first `max_rows` rows of `batch` (keys without prefix)."""
    out = weight_norms(model)
    if decode_mode == "standard" or len(batch) == 0:
        return out
    sub = batch.select(range(min(max_rows, len(batch))))
    estimator = "replay" if sub.states is not None else "exact"
    carried, mask = last_pass_inputs(model, sub, decode_mode, estimator)
    e = model.embed(sub.input_ids.to(carried.device))
    if bool(mask.any()):
        out.update(_fusion_terms(model, carried[mask], e[mask]))
    # the estimator's final pass over its own inputs, and the same rows with nothing fused
    soft = token_logprobs(model, run_pass(model, sub, carried, mask)[0], sub, temperature).logprobs
    std = token_logprobs(model, run_pass(model, sub, carried, torch.zeros_like(mask))[0], sub, temperature).logprobs
    m = sub.response_mask.to(soft.device)
    out["policy_shift"] = float(((soft - std).abs() * m).sum() / m.sum().clamp_min(1))
    after = _after_tool(sub).to(soft.device)
    if bool(after.any()):
        rows, js = after.nonzero(as_tuple=True)
        pos = sub.prompt_lens.to(soft.device)[rows] + js
        share = _fusion_terms(model, carried[rows, pos], e[rows, pos]).get("state_share")
        if share is not None:
            out["state_share_after_tool"] = share
        out["policy_shift_after_tool"] = float((soft - std).abs()[after].mean())
    return out


def _after_tool(batch: LearnerBatch) -> torch.Tensor:
    """[B, R] bool: the first sampled token after each observation (a 0 of `response_mask` inside the response)."""
    m = batch.response_mask.bool()
    inside = torch.arange(m.shape[1])[None, :] < batch.response_lens[:, None]
    observed = ~m & inside
    return m & torch.nn.functional.pad(observed[:, :-1], (1, 0), value=False)


PLOTTED = (
    ("w_state_norm", "‖state weights‖_F"),
    ("state_share", "state share of fused input"),
    ("policy_shift", "mean |log π_soft − log π_std|"),
    ("policy_shift_after_tool", "... at the first token after a tool"),
    ("w_token_dev", "‖token weights − I‖_F"),
    ("gate_mean", "gate mean"),
)


def plot_latent(rows: list[dict], path, prefix: str = "learner/latent/") -> bool:
    """One figure with a panel per latent metric present in the metrics rows; False when there is none."""
    series = [
        (key, label, [(r["step"], r[prefix + key]) for r in rows if r.get(prefix + key) is not None])
        for key, label in PLOTTED
    ]
    series = [s for s in series if s[2]]
    if not series:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(series), figsize=(3.6 * len(series), 3.0), squeeze=False)
    for ax, (_key, label, pts) in zip(axes[0], series):
        ax.plot(*zip(*pts), marker=".")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle("latent channel", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
