"""An FBT made from a plain Llama / Qwen2 / Qwen3 / Mistral checkpoint (`convert_to_fbt`, behind `fbrl convert`), with the fusion at
its identity point when asked (the converted model then decodes exactly like its source), and the way back
(`as_standard_lm`: the backbone as a plain causal LM)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from rl.model.fbt import FBTMixin
from rl.model.fbt_backbones import FBT_CLASSES


def as_standard_lm(model):
    """A stock Hugging Face causal LM (a supported backbone) that decodes in `standard` mode wherever an FBT model does.

    Its class gains `FBTMixin`'s feedback-free building blocks (`embed`, `run_stack`, `logits_from_hidden`,
    `prefill(mode="standard")`); it has no fusion, so every feedback mode refuses it. `fbrl eval` uses this to
    score a backbone before conversion with the same engine and scorer as the converted model.
    """
    if hasattr(model, "fusion"):
        return model
    model.__class__ = type(f"Standard{type(model).__name__}", (FBTMixin, type(model)), {})
    return model


def fbt_config_from(base_config, fusion_mode: str = "gate_product", **fbt_fields):
    """An FBT config carrying every field of a stock config of a supported backbone."""
    backbone = base_config.model_type.removeprefix("fbt_")
    if backbone not in FBT_CLASSES:
        raise ValueError(
            f"model_type {base_config.model_type!r} is not a supported backbone; supported: {sorted(FBT_CLASSES)}"
        )
    cfg_cls, model_cls = FBT_CLASSES[backbone]
    fields = base_config.to_dict()
    for k in ("model_type", "architectures", "transformers_version", "quantization_config"):
        fields.pop(k, None)
    fields.update(fbt_fusion_mode=fusion_mode, **fbt_fields)
    cfg = cfg_cls(**fields)
    cfg.architectures = [model_cls.__name__]
    return cfg


# Fusion epsilon of an identity conversion: ~0 next to any embedding's mean square (fp32 keeps 1e-12 exactly), so
# the three RMS epsilons no longer scale the fused input by 1/sqrt(ms/(ms+eps) + eps) ≠ 1 (docs/BENCHMARKS.md).
IDENTITY_RMS_EPS = 1e-12
FUSION_INITS = ("random", "identity")
_NO_IDENTITY = (
    "identity init: fusion mode 'gate_product' has no identity point (the carried state is its value "
    "path, the token only gates it); use 'linear_addition' or 'concat_projection'"
)


@torch.no_grad()
def identity_init_fusion(model) -> None:
    """Set the fusion to its identity point: fused input == token embedding, whatever the carried state.

    linear_addition: W_U = 0, W_T = I, so RMS(W_U h + W_T RMS(e)) · rms(e) = e; concat_projection:
    W_C = [0, I]. The state then has no effect on the forward pass, but ∂L/∂W_U = (∂L/∂z) hᵀ is not zero, so
    SFT or RL can grow the latent channel from a model that decodes exactly like its backbone in every mode.
    gate_product, RMS((W_U h) ⊙ σ(W_G RMS(e))), has no such point: the state is the value path, the token only
    gates it, so no weights make the fused input equal e.
    """
    fusion = model.fusion
    if fusion.mode == "gate_product":
        raise ValueError(_NO_IDENTITY)
    d = model.config.hidden_size
    eye = torch.eye(d, dtype=model.dtype, device=model.device)
    if fusion.mode == "linear_addition":
        fusion.w_u.weight.zero_()
        fusion.w_t.weight.copy_(eye)
    else:
        fusion.w_c.weight.zero_()
        fusion.w_c.weight[:, d:].copy_(eye)


def convert_to_fbt(model, fusion_mode: str = "gate_product", seed: int = 0, init: str = "random", **fbt_fields):
    """Stock HF causal LM (module or directory) → FBT model.

    The one-pass model is unchanged: every backbone tensor is copied bit for bit. `init="random"`: the paper's
    fusion init (needs multi-pass SFT before feedback helps); `init="identity"`: `identity_init_fusion` with
    `fbt_rms_eps=IDENTITY_RMS_EPS`, so every decode mode equals the backbone from step 0.
    """
    if init not in FUSION_INITS:
        raise ValueError(f"init: expected one of {FUSION_INITS}, got {init!r}")
    if isinstance(model, str):
        model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    if init == "identity":
        fbt_fields.setdefault("fbt_rms_eps", IDENTITY_RMS_EPS)
    cfg = fbt_config_from(model.config, fusion_mode, **fbt_fields)
    if init == "identity" and fusion_mode == "gate_product":
        raise ValueError(_NO_IDENTITY)
    torch.manual_seed(seed)
    fbt = FBT_CLASSES[cfg.model_type.removeprefix("fbt_")][1](cfg).to(next(model.parameters()).dtype)
    missing, unexpected = fbt.load_state_dict(model.state_dict(), strict=False)
    if unexpected or any(not k.startswith("fusion.") for k in missing):
        raise ValueError(f"backbone weights do not fit: missing={missing} unexpected={unexpected}")
    if init == "identity":
        identity_init_fusion(fbt)
    return fbt


def convert_checkpoint(
    src, out, fusion_mode: str | None = None, init: str = "identity", seed: int = 0, model=None, tokenizer=None
) -> str:
    """A stock checkpoint directory `src` (or an already loaded `model` / `tokenizer`, e.g. from GGUF) written to
    `out` as an FBT checkpoint, with its tokenizer and generation config. Returns the fusion mode used (default:
    linear_addition with the identity init, which gate_product lacks; gate_product with the random one)."""
    from pathlib import Path

    from transformers import AutoTokenizer, GenerationConfig

    from rl.decode_modes import DECODE_MODES, record

    src = Path(src)
    if model is None:  # safetensors only: a pickled checkpoint is refused, never unpickled
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, use_safetensors=True)
    mode = fusion_mode or ("linear_addition" if init == "identity" else "gate_product")
    fbt = convert_to_fbt(model, mode, seed=seed, init=init)
    if src.is_dir() and (src / "generation_config.json").is_file():
        fbt.generation_config = GenerationConfig.from_pretrained(src)
    # random fusion weights are untrained: only the backbone's own mode is served; the identity init decodes
    # exactly like the backbone in every mode (W_U = 0: nothing is fed back yet)
    record(fbt.config, DECODE_MODES if init == "identity" else ["standard"])
    fbt.save_pretrained(out)
    try:
        (tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(src)).save_pretrained(out)
    except (OSError, ValueError):
        print(f"note: no tokenizer in {src}; copy one into {out} before training")
    return mode
