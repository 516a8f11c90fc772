"""Attention for grouped-query backbones (SmolLM2, Qwen, Llama 3) that reads shared K/V heads without copying them.

With an attention mask (left-padded prompts), transformers' `sdpa` attention expands every layer's whole K/V cache
to one copy per query head (`repeat_kv`) before calling `scaled_dot_product_attention`, at every decode step. At
small batch-times-context that copy costs more than the attention itself. `shared_kv_sdpa_attention` computes the
same attention from the kv heads as they are:

- on CPU, `scaled_dot_product_attention(..., enable_gqa=True)`: the CPU kernels handle shared heads and a mask
  without expanding them, and give the very same numbers as the expanded call;
- elsewhere, for a single query token (a decode step), the query heads of one kv head are laid out as that kv
  head's query rows (`[B, H, 1, hd]` → `[B, kvH, G, hd]`): the `[B, 1, 1, L]` mask broadcasts over them, and the
  fused attention kernels accept it (on CUDA, `enable_gqa` with a mask falls back to the unfused math kernel);
- everything else (no mask, no shared heads, several query tokens on an accelerator) is transformers' `sdpa`.

`use_shared_kv_attention(model)` switches a model that uses `sdpa` and has shared K/V heads to this function,
registered with transformers as `"sdpa_shared_kv"` (its masks are sdpa's). The name is not saved with the config.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

SHARED_KV_SDPA = "sdpa_shared_kv"


def _grouped_rows(query, key, value, mask, scaling, dropout) -> torch.Tensor:
    """Attention of one query token per row, its G query heads per kv head laid out as G query rows:
    query [B, H, 1, hd], key/value [B, kvH, L, hd], mask [B, 1, 1, L] → [B, H, 1, hd]."""
    B, H, _, hd = query.shape
    kv_heads = key.shape[1]
    out = F.scaled_dot_product_attention(
        query.reshape(B, kv_heads, H // kv_heads, hd), key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )
    return out.reshape(B, H, 1, out.shape[-1])


def layout_for(query: torch.Tensor) -> str:
    """How `shared_kv_sdpa_attention` reads shared K/V heads for this query (module docstring): "gqa" (CPU),
    "rows" (one query token elsewhere) or "expand" (transformers' sdpa)."""
    if query.device.type == "cpu":
        return "gqa"
    return "rows" if query.shape[2] == 1 else "expand"


def shared_kv_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [B, H, q, hd], key/value [B, kvH, L, hd] → [B, q, H, hd]."""
    shared = (
        getattr(module, "num_key_value_groups", 1) > 1
        and attention_mask is not None
        and attention_mask.dim() == 4
        and attention_mask.shape[1] == 1
        and kwargs.get("position_bias") is None
        and kwargs.get("cache") is None
    )
    layout = layout_for(query) if shared else "expand"
    if layout == "rows" and query.shape[2] == 1:
        out = _grouped_rows(query, key, value, attention_mask, scaling, dropout)
    elif layout == "gqa":
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
        )
    else:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(SHARED_KV_SDPA, shared_kv_sdpa_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(SHARED_KV_SDPA, sdpa_mask)


def has_shared_kv_heads(config) -> bool:
    heads = config.num_attention_heads
    return (getattr(config, "num_key_value_heads", None) or heads) < heads


def use_shared_kv_attention(model) -> bool:
    """Switch `model` from `sdpa` to `sdpa_shared_kv` when its attention shares K/V heads; True if it uses it now.
    Other implementations (eager, flash, ...) are kept: they either do not copy or were chosen on purpose."""
    impl = getattr(model.config, "_attn_implementation", None)
    if impl == SHARED_KV_SDPA:
        return True
    if impl != "sdpa" or not has_shared_kv_heads(model.config):
        return False
    model.set_attn_implementation(SHARED_KV_SDPA)
    return model.config._attn_implementation == SHARED_KV_SDPA
