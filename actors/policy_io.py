"""A policy's files: an FBT checkpoint loaded as a torch module, weights written atomically as safetensors, and the
tokenizer files copied beside them so a saved model directory loads on its own."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def load_policy(path: str, dtype=torch.float32):
    """The FBT checkpoint as a torch module (importing `rl.model` registers the FBT classes with the Auto classes)."""
    from transformers import AutoModelForCausalLM

    import rl.model  # noqa: F401

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)


def pad_id_of(model) -> int:
    """Padding id for collate: any id works (padding is masked); the config's pad id when it has one."""
    pid = getattr(model.config, "pad_token_id", None)
    return int(pid) if pid is not None else 0


def write_safetensors_atomic(tensors: dict, path: str) -> str:
    """One safetensors file written under a temporary name and renamed into place (readers never see half)."""
    from safetensors.torch import save_file

    path = str(path)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata={"format": "pt"})
    os.replace(tmp, path)
    return path


def copy_tokenizer_files(src: str, dst: str) -> None:
    """So a checkpoint's model/ directory loads on its own (AutoTokenizer, vLLM)."""
    for name in TOKENIZER_FILES:
        f = Path(src) / name
        if f.is_file():
            shutil.copy2(f, Path(dst) / name)
