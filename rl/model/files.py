"""An FBT's files: a checkpoint loaded as a torch module (`load_fbt`) or read as a config (`load_fbt_config`), weights
written atomically as safetensors, and the tokenizer files copied beside them so a saved model directory loads on
its own. Importing this module registers the FBT classes with transformers' Auto classes (rl/model/__init__.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from rl.backbones import TOKENIZER_FILES


def load_fbt(path, dtype=torch.float32):
    """The FBT checkpoint at `path` as a torch module."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)


def load_fbt_config(path):
    """The config of the checkpoint at `path` (an FBT's `fbt_*` model type included)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path))


def pad_id_of(model) -> int:
    """Padding id for collate: any id works (padding is masked); the config's pad id when it has one."""
    pid = getattr(model.config, "pad_token_id", None)
    return int(pid) if pid is not None else 0


def write_safetensors_atomic(tensors: dict, path: str) -> str:
    """One safetensors file written under a temporary name and renamed into place (readers never see half)."""
    return stream_safetensors_atomic([(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()], tensors.items(), path)


SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


def stream_safetensors_atomic(meta: list[tuple[str, torch.dtype, tuple]], named_tensors, path: str) -> str:
    """A safetensors file written one tensor at a time: the header from `meta` ((name, dtype, shape) in order), then
    each tensor of `named_tensors` as it comes, so the writer holds one tensor, not the whole state (a LoRA
    learner's merged weights are made one layer at a time). A tensor that differs from its `meta` entry is an
    error (the header would lie). Written under a temporary name and renamed into place."""
    import json
    import math

    header, offset = {}, 0
    for name, dtype, shape in meta:
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    header["__metadata__"] = {"format": "pt"}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned, as safetensors' own writer does
    path = str(path)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    expected = iter(meta)
    try:
        with open(tmp, "wb") as f:
            f.write(len(head).to_bytes(8, "little") + head)
            for name, t in named_tensors:
                want = next(expected, None)
                if want is None or (name, t.dtype, tuple(t.shape)) != (want[0], want[1], tuple(want[2])):
                    raise ValueError(
                        f"{path}: tensor {name} {t.dtype} {tuple(t.shape)} does not match the header {want}"
                    )
                f.write(memoryview(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()))
                del t  # not kept alive while the next one is made
            missing = [m[0] for m in expected]
            if missing:
                raise ValueError(f"{path}: tensors {missing[:5]} of the header were never written")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def copy_tokenizer_files(src: str, dst: str) -> None:
    """So a checkpoint's model/ directory loads on its own (AutoTokenizer, vLLM)."""
    for name in TOKENIZER_FILES:
        f = Path(src) / name
        if f.is_file():
            shutil.copy2(f, Path(dst) / name)
