"""LoRA learners for FBTs: peft adapters on the backbone, the fusion weights trained in full.

`LoraPolicy.wrap(model, lora_cfg)` puts peft's LoRA layers into the model in place (`peft.get_peft_model`): every
`learner.lora.target_modules` linear layer gets B·A (B = 0 at the start, as peft initialises it), the fusion
becomes one of peft's `modules_to_save` (a trainable copy beside the frozen original) when
`learner.lora.train_fusion`, and everything else is frozen. The model object keeps its class and methods, so the
likelihood estimators, latent metrics and engines' code run on it unchanged.

What leaves the learner is the merged model, named as the checkpoint names it: each adapted weight as
W + B·A·(alpha / rank), the fusion weights as trained (`merged_tensors`). Engines, `RUN_DIR/policy/` and the
checkpoints' `model/` therefore hold a plain FBT any loader reads. The adapters are also written in peft's own
format (`save_adapter`): `PeftModel.from_pretrained(base FBT, that directory)` rebuilds the trained model.

The KL reference is the same model with the adapters off (`reference()`, peft's `disable_adapter`): the frozen
base weights and the fusion's frozen original, i.e. the starting policy, with no second model in memory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import torch

from rl.atomic_files import replace_dir

ADAPTER = "default"  # peft's adapter name
FUSION = "fusion"  # the FBT's fusion module (rl/model/)
ADAPTER_FILE = "adapter_model.safetensors"  # peft's file name in an adapter directory
_LORA_PARTS = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.", ".lora_magnitude_vector.")


def peft_config(lora_cfg, model):
    """peft's LoraConfig for `learner.lora` on `model`; a target that names no linear layer of the model is an error
    naming the key (peft would otherwise adapt nothing, or say so without the key)."""
    from peft import LoraConfig

    leaf_names = {
        name.rsplit(".", 1)[-1]
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.Linear) and not name.startswith(f"{FUSION}.")
    }
    missing = sorted(set(lora_cfg.target_modules) - leaf_names)
    if missing:
        raise ValueError(
            f"learner.lora.target_modules: {missing} name no linear layer of the backbone; "
            f"its linear layers are {sorted(leaf_names)}"
        )
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if tied and "lm_head" in lora_cfg.target_modules:
        raise ValueError(
            "learner.lora.target_modules: 'lm_head' is tied to the input embeddings in this model "
            "(config.tie_word_embeddings), so an adapter on it would also change the embeddings the engines "
            "never receive as adapted; leave 'lm_head' out"
        )
    fusion = lora_cfg.train_fusion and hasattr(model, FUSION)
    return LoraConfig(
        r=lora_cfg.rank,
        lora_alpha=lora_cfg.alpha,
        lora_dropout=lora_cfg.dropout,
        target_modules=list(lora_cfg.target_modules),
        bias="none",
        modules_to_save=[FUSION] if fusion else None,
    )


def clean_name(name: str) -> str | None:
    """A parameter's name in the merged checkpoint, or None for a parameter that is not one of its tensors (the
    adapters' A and B, the trained copy of a `modules_to_save` module: both are folded into the merged tensors)."""
    if any(part in name for part in _LORA_PARTS) or f".modules_to_save.{ADAPTER}." in name:
        return None
    return name.replace(".base_layer.", ".").replace(".original_module.", ".")


def merged_weight(weight: torch.Tensor, layer) -> torch.Tensor:
    """W + B·A·scale in fp32 as one new tensor: W copied, then B·A accumulated into the copy by one GEMM (peft's
    `get_delta_weight` makes B·A and then B·A·scale, two more tensors of the layer's size). Layers that are not a
    plain peft Linear (DoRA, fan-in-fan-out, other layer kinds) use peft's delta."""
    from peft.tuners.lora import Linear

    w = weight.detach().to(torch.float32, copy=True)
    plain = type(layer) is Linear and not layer.fan_in_fan_out and not layer.use_dora.get(ADAPTER, False)
    if plain:
        a, b = layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight
        return w.addmm_(b.float(), a.float(), alpha=layer.scaling[ADAPTER])
    return w.add_(layer.get_delta_weight(ADAPTER).float())


class LoraPolicy:
    """A model with peft's LoRA layers in it, and what the learner needs from it (merged weights, the adapter-off
    reference, peft-format adapter files)."""

    def __init__(self, peft_model):
        self.peft_model = peft_model
        self.model = peft_model.get_base_model()  # the FBT module itself, adapted in place

    @classmethod
    def wrap(cls, model, lora_cfg, seed: int = 0) -> LoraPolicy:
        """A is drawn at random (B = 0) from `seed`, so every rank, and a learner rebuilt in the job, starts from the
        same adapters; the global RNG is left as it was."""
        from peft import get_peft_model

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls(get_peft_model(model, peft_config(lora_cfg, model)))

    # -- what trains ----------------------------------------------------------------------------------------
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def counts(self) -> dict[str, int]:
        """Parameter counts: trainable (adapters + fusion copy) and the merged model's."""
        return {
            "trainable": sum(p.numel() for p in self.trainable_parameters()),
            "merged": sum(t.numel() for _, t in self.merged_tensors()),
        }

    # -- the reference ----------------------------------------------------------------------------------------
    def reference(self):
        """Context in which the model is the starting policy: adapters off and the fusion's frozen original in use."""
        return self.peft_model.disable_adapter()

    # -- merged weights ---------------------------------------------------------------------------------------
    def _adapted(self) -> dict[str, object]:
        """{merged tensor name: the LoRA layer that adapts it}."""
        from peft.tuners.lora import LoraLayer

        return {
            f"{name}.weight": mod
            for name, mod in self.model.named_modules()
            if isinstance(mod, LoraLayer) and ADAPTER in mod.lora_A
        }

    @torch.no_grad()
    def merged_tensors(self):
        """(name, tensor) of the merged model in the base checkpoint's parameter order (tied weights once): an
        adapted weight as W + B·A·scale, the fusion weights as trained, every other weight as loaded.

        The merge is computed in fp32 and an adapted weight leaves in fp32 whatever the base's dtype: a few Adam
        steps make B·A entries of ~1e-4, below half a bf16 ulp of most weights, so a merge rounded to bf16 would
        give back the base weight while the learner's forward (W x + B A x) has moved. An engine that runs bf16
        rounds on load; docs/GPU.md has what that costs. Each delta is computed when its tensor is reached (one
        adapted layer's worth of memory at a time). Tensors are new (merged) or detached views of the parameters:
        copy before keeping."""
        from peft.utils import ModulesToSaveWrapper

        adapted = self._adapted()
        trained_fusion = {}
        for name, mod in self.model.named_modules():
            if isinstance(mod, ModulesToSaveWrapper) and ADAPTER in mod.modules_to_save:
                for sub, p in mod.modules_to_save[ADAPTER].named_parameters():
                    trained_fusion[f"{name}.{sub}"] = p
        emitted = set()
        for name, p in self.model.named_parameters():
            out = clean_name(name)
            if out is None:
                continue
            emitted.add(out)
            layer = adapted.get(out)
            if layer is not None:
                yield out, merged_weight(p, layer)
            else:
                yield out, trained_fusion.get(out, p).detach()
        lost = sorted(set(adapted) - emitted)
        if lost:  # a tied weight is emitted under its other name: that layer's update would never leave
            raise ValueError(f"learner.lora.target_modules: adapted weights {lost} are tied to another weight")

    def metadata(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        """(name, dtype, shape) of `merged_tensors` without computing a delta."""
        adapted = self._adapted()
        out = []
        for name, p in self.model.named_parameters():
            clean = clean_name(name)
            if clean is not None:
                out.append((clean, torch.float32 if clean in adapted else p.dtype, tuple(p.shape)))
        return out

    # -- files ------------------------------------------------------------------------------------------------
    def save_adapter(self, directory: str) -> None:
        """peft's adapter directory (adapter_config.json + adapter_model.safetensors: A, B and the trained fusion),
        written beside it and swapped in, so a reader never sees half of one."""
        final = Path(directory)
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        self.peft_model.save_pretrained(str(tmp))
        replace_dir(tmp, final)

    @torch.no_grad()
    def load_adapter(self, directory: str) -> None:
        """Set the adapters (and the trained fusion) from a `save_adapter` directory (safetensors, never pickle)."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        try:
            result = set_peft_model_state_dict(self.peft_model, load_file(str(Path(directory) / ADAPTER_FILE)))
        except KeyError as e:  # peft's own lookup of a trained module's tensors (the fusion copy)
            raise ValueError(f"{directory}: adapters do not fit the model: missing {e}") from None
        # peft loads non-strictly: the frozen base is always "missing"; an adapter or trained-fusion tensor must not be
        missing = [k for k in result.missing_keys if clean_name(k.removeprefix("base_model.model.")) is None]
        if result.unexpected_keys or missing:
            raise ValueError(
                f"{directory}: adapters do not fit the model (learner.lora changed?): "
                f"unexpected {sorted(result.unexpected_keys)[:4]}, missing {sorted(missing)[:4]}"
            )


def maybe_wrap(model, lora_cfg, seed: int = 0) -> tuple[object, LoraPolicy | None]:
    """(the model to train, its LoraPolicy or None): `learner.lora` null leaves the model as it is."""
    if lora_cfg is None:
        return model, None
    lora = LoraPolicy.wrap(model, lora_cfg, seed)
    return lora.model, lora


def reference_scope(lora: LoraPolicy | None):
    """The context the reference log-probs are computed in: adapters off for a LoRA policy, else nothing."""
    return lora.reference if lora is not None else contextlib.nullcontext
