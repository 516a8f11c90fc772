"""rl.model — the full-bandwidth transformer (FBT) on Hugging Face backbones; importing it registers the FBT configs."""

from rl.model.conversion import (
    FUSION_INITS,
    IDENTITY_RMS_EPS,
    as_standard_lm,
    convert_to_fbt,
    fbt_config_from,
    identity_init_fusion,
)
from rl.model.fbt import FBTMixin, MultiPassOutput
from rl.model.fbt_backbones import (
    FBT_ARCHITECTURES,
    FBT_CLASSES,
    FBTLlamaConfig,
    FBTLlamaForCausalLM,
    FBTQwen2Config,
    FBTQwen2ForCausalLM,
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
