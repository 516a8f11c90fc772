"""rl.model — the full-bandwidth transformer (FBT) on Hugging Face backbones (Llama, Qwen2, Qwen3 and Mistral).

`fusion` (the fusion `F(h_{t-1}, e_t)` and its tensor helpers, plain torch), `fbt` (the FBT configs and models:
multi-pass forward, recurrent step, prefill), `convert` (an FBT from a plain checkpoint and back), `attention`
(grouped-query attention that reads shared K/V heads without copying them). Importing `rl.model` registers
`fbt_llama` / `fbt_qwen2` / `fbt_qwen3` / `fbt_mistral` with transformers' Auto classes.
"""

from rl.model.conversion import (
    FUSION_INITS,
    IDENTITY_RMS_EPS,
    as_standard_lm,
    convert_to_fbt,
    fbt_config_from,
    identity_init_fusion,
)
from rl.model.fbt import (
    FBT_ARCHITECTURES,
    FBT_CLASSES,
    FBTLlamaConfig,
    FBTLlamaForCausalLM,
    FBTMixin,
    FBTQwen2Config,
    FBTQwen2ForCausalLM,
    MultiPassOutput,
)
from rl.model.fusion import (
    FUSION_MODES,
    INPUT_SCALES,
    Fusion,
    positions_from_mask,
    rms_normalize,
    rms_value,
    shift_right,
)

__all__ = [
    "FUSION_MODES",
    "INPUT_SCALES",
    "FUSION_INITS",
    "IDENTITY_RMS_EPS",
    "Fusion",
    "rms_normalize",
    "rms_value",
    "shift_right",
    "positions_from_mask",
    "FBTMixin",
    "MultiPassOutput",
    "FBTLlamaConfig",
    "FBTQwen2Config",
    "FBTLlamaForCausalLM",
    "FBTQwen2ForCausalLM",
    "FBT_CLASSES",
    "FBT_ARCHITECTURES",
    "as_standard_lm",
    "fbt_config_from",
    "identity_init_fusion",
    "convert_to_fbt",
]
