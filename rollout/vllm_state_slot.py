"""The FBT's recurrent state inside vLLM: the per-request `h_prev` slot (`LatentStateLayer`, a mamba-style state
layer vLLM allocates, frees and indexes), the config hook that makes vLLM treat the model as hybrid, and what keeps
the slot out of prefix caching (`keep_state_cache_mode_none`: prompt tokens are plain, so a cached prefix holds no
recurrent state, and the uncached rest of a prompt writes the slot fresh). rollout/vllm_plugin.py's models use them.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.core.single_type_kv_cache_manager import MambaManager
from vllm.v1.kv_cache_interface import MambaSpec

from rl.model import FBT_ARCHITECTURES

LATENT_LAYER_TYPE = "fbt_latent_state"


def keep_state_cache_mode_none() -> None:
    """With prefix caching on, vLLM turns every hybrid model's state cache into mamba mode "align" (chunked,
    block-aligned prefill and a state checkpoint per block). An FBT's state slot needs none of that: prompt tokens
    are plain, so their cached K/V hold no recurrent state, and the slot only needs h at the last computed position,
    which the uncached rest of the prompt (vLLM recomputes at least one token) writes fresh. For FBT architectures
    the hybrid hook therefore runs as if prefix caching were off (mode "none", one slot per request), and the slot's
    cache group opts out of prefix caching (`LatentStateLayer.get_kv_cache_spec`)."""
    from vllm.model_executor.models import config as model_configs

    hook = model_configs.HybridAttentionMambaModelConfig
    if getattr(hook, "fbt_wrapped", False):
        return
    original = hook.verify_and_update_config

    def verify_and_update_config(cls, vllm_config) -> None:
        cache = vllm_config.cache_config
        if vllm_config.model_config.architecture not in FBT_ARCHITECTURES or not cache.enable_prefix_caching:
            return original(vllm_config)
        cache.enable_prefix_caching = False
        try:
            original(vllm_config)
        finally:
            cache.enable_prefix_caching = True

    hook.verify_and_update_config = classmethod(verify_and_update_config)
    hook.fbt_wrapped = True

    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    KVCacheSpecRegistry._ensure_registered()  # the built-in specs first: a non-empty registry is taken as complete
    KVCacheSpecRegistry.register(ScratchStateSpec, StateSlotManager, uniform_type_base_spec=MambaSpec)


def declare_state_layer(hf_config) -> None:
    """Make vLLM see the latent-state layer in the config, so that it treats the model as hybrid.

    vLLM decides "hybrid" from the model class *and* `hf_config.layer_types`: a config whose layer_types are all
    attention (Qwen2's always has them) is treated as a plain transformer, and then no state slot is allocated.
    Appending one non-attention entry after the real layers fixes that; per-layer lookups only index the first
    `num_hidden_layers` entries. Qwen2's vLLM model asserts `max_window_layers == num_hidden_layers` as soon as
    the types differ; it does not implement sliding windows otherwise, so that value changes nothing else.
    """
    types = getattr(hf_config, "layer_types", None)
    if types is None or LATENT_LAYER_TYPE in types:
        return
    hf_config.layer_types = list(types) + [LATENT_LAYER_TYPE]
    if hasattr(hf_config, "max_window_layers"):
        hf_config.max_window_layers = hf_config.num_hidden_layers


class FBTConfigHook:
    """vLLM's per-architecture config hook (vllm.model_executor.models.config.MODELS_CONFIG_MAP)."""

    @staticmethod
    def verify_and_update_model_config(model_config) -> None:
        declare_state_layer(model_config.hf_config)

    @staticmethod
    def verify_and_update_config(vllm_config) -> None:
        declare_state_layer(vllm_config.model_config.hf_config)


class ScratchStateSpec(MambaSpec):
    """The state slot's cache spec: one scratch slot per request that takes no part in prefix caching (a cache hit
    never restores it; the prefill of the uncached rest of the prompt writes it). Its block size is the attention
    block size, so the scheduler's granularity (the lcm of the groups' block sizes) stays that of the attention
    blocks, and hits land on any attention block; `StateSlotManager` still gives a request exactly one block. The
    block table row spans the whole sequence, since the runner computes a (never read) slot mapping for it."""

    @property
    def prefix_cacheable(self) -> bool:
        return False

    def max_num_blocks_per_req(self, vllm_config, max_len: int) -> int:
        return -(-max_len // self.block_size)


class StateSlotManager(MambaManager):
    """Exactly one block (the state slot) per request, held from its first step to its end, whatever the block
    size."""

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return 0  # the slot is never released mid-request

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, *args, **kwargs) -> int:
        return 0 if self.req_to_blocks.get(request_id) else 1

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int):
        blocks = self.req_to_blocks[request_id]
        if blocks:
            return []
        new = self.block_pool.get_new_blocks(1)
        blocks.extend(new)
        if self._record_new_block_ids:
            self.new_block_ids.extend(b.block_id for b in new)
        return new


class LatentStateLayer(MambaBase, nn.Module):
    """The per-request `h_prev` slot: one `(d,)` state in vLLM's mamba cache, no parameters, no compute.

    Its name must carry a layer index distinct from the attention layers' (vLLM binds caches by index), hence
    `model.layers.{num_hidden_layers}.fbt_state`.
    """

    def __init__(self, hidden_size: int, dtype: torch.dtype, prefix: str):
        nn.Module.__init__(self)
        self.hidden_size, self.state_dtype, self.prefix = hidden_size, dtype, prefix
        ctx = get_current_vllm_config().compilation_config.static_forward_context
        if prefix in ctx:
            raise ValueError(f"duplicate layer name {prefix}")
        ctx[prefix] = self
        self.kv_cache = (torch.tensor([]),)  # replaced by vLLM's bind_kv_cache with a [num_slots, d] view

    def get_state_shape(self):
        return ((self.hidden_size,),)

    def get_kv_cache_spec(self, vllm_config: VllmConfig):
        spec = super().get_kv_cache_spec(vllm_config)
        if spec.mamba_cache_mode != "none":
            raise ValueError(f"FBT state slot: mamba_cache_mode must be 'none', got {spec.mamba_cache_mode!r}")
        fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
        fields["block_size"] = vllm_config.cache_config.block_size
        return ScratchStateSpec(**fields)

    def get_state_dtype(self):
        return (self.state_dtype,)

    @property
    def mamba_type(self):
        # Any mamba backend gives the generic metadata we need (slot indices, prefill/decode split);
        # SHORT_CONV's builder is the plainest one.
        return MambaAttentionBackendEnum.SHORT_CONV
