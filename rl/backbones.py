"""The backbones an FBT is built on, by name: what a checkpoint's config.json is checked against before anything
heavy is imported (the checks before a job starts run in the driver, which never loads the model classes).

`rl.model.fbt_backbones.FBT_CLASSES` holds the classes for these names (tests/test_backbones.py keeps the two
equal). Also here, for the same reason: `TOKENIZER_FILES`, the files a checkpoint's tokenizer may be saved as (a
saved model gets them beside it; the run directory's exported policy copies them).
"""

from __future__ import annotations

# a stock checkpoint's `model_type` -> the architecture of its FBT
FBT_ARCHITECTURE_OF = {
    "llama": "FBTLlamaForCausalLM",
    "qwen2": "FBTQwen2ForCausalLM",
    "qwen3": "FBTQwen3ForCausalLM",
    "mistral": "FBTMistralForCausalLM",
}


def stock_backbone(config: dict) -> str | None:
    """The backbone `model_type` of a stock checkpoint's config.json that `convert_to_fbt` supports; None for an FBT
    checkpoint or an unsupported model."""
    arch = (config.get("architectures") or [""])[0]
    kind = config.get("model_type", "")
    return kind if kind in FBT_ARCHITECTURE_OF and not arch.startswith("FBT") else None


# the files of a saved tokenizer, whichever of them a tokenizer writes
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
