"""`learner.lora`: LoRA adapters on the backbone (peft), the FBT's fusion weights trained in full.

Null (the default) trains every weight. A mapping turns LoRA on; `learner.lora={}` takes every default. Read by
rl/model/lora_policy.py, which builds the adapters for the RL learner and for `fbrl pretrain`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from rl.config.bounds import ge, gt, within

# The attention and MLP projections of every Llama / Qwen2 / Qwen3 / Mistral decoder layer (the usual LoRA targets).
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraConfig:
    rank: Annotated[int, ge(1)] = 16
    alpha: Annotated[float, gt(0)] = 32.0  # the update is B·A · alpha / rank
    # on the adapters' input, training only (the estimators' forwards too)
    dropout: Annotated[float, within(0, 1, high_open=True)] = 0.0
    # module names (the last part of a dotted module path) of the backbone's linear layers that get adapters
    target_modules: list[str] = field(default_factory=lambda: list(DEFAULT_TARGET_MODULES))
    # the fusion weights (W_U, W_T / W_G / W_C) train in full beside the adapters; false: they stay frozen
    train_fusion: bool = True

    def validate(self):
        if not self.target_modules:
            yield "target_modules", "expected a non-empty list of module names, e.g. [q_proj, v_proj]"
        elif any(not m or "fusion" in m.split(".") for m in self.target_modules):
            yield (
                "target_modules",
                (
                    f"expected names of backbone linear layers, got {self.target_modules} (the "
                    f"fusion weights train in full through learner.lora.train_fusion)"
                ),
            )
