"""The FBT on each supported backbone (Llama, Qwen2, Qwen3 and Mistral families): its config (`fbt_llama`,
`fbt_qwen2`, `fbt_qwen3`, `fbt_mistral`: the backbone's config plus the `fbt_*` fields), its causal-LM class
(the backbone's class with rl/model/fbt.py's `FBTMixin`), `FBT_CLASSES` / `FBT_ARCHITECTURES` (the supported
backbones by name). Importing this module registers every config and class with the Auto classes.
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from rl.model.fbt import FBTMixin


@strict
class FBTLlamaConfig(LlamaConfig):
    model_type = "fbt_llama"
    fbt_fusion_mode: str = "gate_product"
    # Llama, Qwen2, Qwen3 and Mistral feed the raw embedding, so the unit-RMS fused vector is rescaled to the token embedding's RMS.
    fbt_input_scale: str = "embedding_rms"
    fbt_reset_token_ids: list[int] | None = None  # document starts; None = [bos_token_id]
    fbt_prefill_passes: int = 2  # passes of the `fused` prompt mode
    # epsilon of the fusion's parameter-free RMS norms (and of the embedding-RMS scale). An identity conversion
    # (`identity_init_fusion`) sets it ~0 so that the fused input equals the token embedding to fp32 rounding.
    fbt_rms_eps: float = 1e-6


@strict
class FBTQwen2Config(Qwen2Config):
    model_type = "fbt_qwen2"
    fbt_fusion_mode: str = "gate_product"
    fbt_input_scale: str = "embedding_rms"
    fbt_reset_token_ids: list[int] | None = None
    fbt_prefill_passes: int = 2
    fbt_rms_eps: float = 1e-6


@strict
class FBTQwen3Config(Qwen3Config):
    model_type = "fbt_qwen3"
    fbt_fusion_mode: str = "gate_product"
    fbt_input_scale: str = "embedding_rms"
    fbt_reset_token_ids: list[int] | None = None
    fbt_prefill_passes: int = 2
    fbt_rms_eps: float = 1e-6


@strict
class FBTMistralConfig(MistralConfig):
    model_type = "fbt_mistral"
    fbt_fusion_mode: str = "gate_product"
    fbt_input_scale: str = "embedding_rms"
    fbt_reset_token_ids: list[int] | None = None
    fbt_prefill_passes: int = 2
    fbt_rms_eps: float = 1e-6


class FBTLlamaForCausalLM(FBTMixin, LlamaForCausalLM):
    config_class = FBTLlamaConfig

    def __init__(self, config):
        super().__init__(config)
        self._init_fbt(config)
        self.post_init()


class FBTQwen2ForCausalLM(FBTMixin, Qwen2ForCausalLM):
    config_class = FBTQwen2Config

    def __init__(self, config):
        super().__init__(config)
        self._init_fbt(config)
        self.post_init()


class FBTQwen3ForCausalLM(FBTMixin, Qwen3ForCausalLM):
    config_class = FBTQwen3Config

    def __init__(self, config):
        super().__init__(config)
        self._init_fbt(config)
        self.post_init()


class FBTMistralForCausalLM(FBTMixin, MistralForCausalLM):
    config_class = FBTMistralConfig

    def __init__(self, config):
        super().__init__(config)
        self._init_fbt(config)
        self.post_init()


# backbone model_type -> (FBT config, FBT model): every backbone that `fbrl convert`, the torch engine, the vLLM
# plugin (rollout/vllm_plugin.py) and the estimators support. They all feed the raw token embedding.
FBT_CLASSES = {
    "llama": (FBTLlamaConfig, FBTLlamaForCausalLM),
    "qwen2": (FBTQwen2Config, FBTQwen2ForCausalLM),
    "qwen3": (FBTQwen3Config, FBTQwen3ForCausalLM),
    "mistral": (FBTMistralConfig, FBTMistralForCausalLM),
}
FBT_ARCHITECTURES = tuple(cls.__name__ for _, cls in FBT_CLASSES.values())

for _cfg, _cls in FBT_CLASSES.values():
    AutoConfig.register(_cfg.model_type, _cfg, exist_ok=True)
    AutoModelForCausalLM.register(_cfg, _cls, exist_ok=True)
