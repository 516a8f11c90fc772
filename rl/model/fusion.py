"""The fusion `F(h_{t-1}, e_t)` of a full-bandwidth transformer and the tensor helpers of its passes: the
parameter-free RMS norms, shifting states one position right, position ids from a padding mask. Plain torch
(no transformers), so the engines and estimators share these definitions with the model."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

FUSION_MODES = ("gate_product", "concat_projection", "linear_addition")
INPUT_SCALES = ("embedding_rms", "unit")


def rms_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Parameter-free RMSNorm, computed in fp32 so bf16 states do not lose the scale."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rms_value(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return torch.sqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)


class Fusion(nn.Module):
    """`F(h, e)` before scaling, returning a unit-RMS vector. Weight names are part of the checkpoint format.

    gate_product:      RMS((W_U h) ⊙ σ(W_G RMS(e)))   — the state rides the value path, the token only gates
    concat_projection: RMS(W_C [RMS(h); RMS(e)])
    linear_addition:   RMS(W_U h + W_T RMS(e))
    """

    def __init__(self, hidden_size: int, mode: str, eps: float = 1e-6):
        super().__init__()
        if mode not in FUSION_MODES:
            raise ValueError(f"fbt_fusion_mode: expected one of {FUSION_MODES}, got {mode!r}")
        self.mode, self.eps = mode, eps
        d = hidden_size
        if mode == "gate_product":
            self.w_u, self.w_g = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        elif mode == "concat_projection":
            self.w_c = nn.Linear(2 * d, d, bias=False)
        else:
            self.w_u, self.w_t = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        for lin in self.children():
            lin._fbt_fusion = True  # tells _init_weights to use the paper's uniform init

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        eps = self.eps
        if self.mode == "gate_product":
            z = self.w_u(h) * torch.sigmoid(self.w_g(rms_normalize(e, eps)))
        elif self.mode == "concat_projection":
            z = self.w_c(torch.cat([rms_normalize(h, eps), rms_normalize(e, eps)], dim=-1))
        else:
            z = self.w_u(h) + self.w_t(rms_normalize(e, eps))
        return rms_normalize(z, eps)


def shift_right(states: torch.Tensor) -> torch.Tensor:
    """carried[:, t] = states[:, t-1]; position 0 gets zeros (it never takes feedback)."""
    return F.pad(states[:, :-1], (0, 0, 1, 0))


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids for left- or right-padded rows: 0 at each row's first real token."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@contextlib.contextmanager
def dropout_off(model, active: bool = True):
    """The model in eval mode inside the block (no dropout), its mode restored after: for the forwards that only
    score or reconstruct (behaviour log-probs, kpass's first passes), which a dropout mask would make noisy."""
    was = model.training
    if active and was:
        model.eval()
    try:
        yield model
    finally:
        if active and was:
            model.train()
