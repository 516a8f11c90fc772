"""A GGUF checkpoint (llama.cpp's format) → a plain Hugging Face causal LM, dequantized to fp32.

transformers reads GGUF itself (`from_pretrained(dir, gguf_file=name)`, which needs the `gguf` package: the
`gguf` extra) and dequantizes every tensor. The model it returns is still marked as GGUF-quantized, so
transformers refuses to `save_pretrained` it and later loaders would read its `quantization_config`; the plain
model rebuilt here from the same config, without that field, holds exactly the dequantized weights. GGUF holds tensors and metadata only (no pickled
code), so reading one runs nothing from the file.
"""

from __future__ import annotations

from pathlib import Path


def load_gguf(path: str | Path, dtype=None):
    """(model, tokenizer) from one `.gguf` file; the model is a plain (unquantized) `AutoModelForCausalLM`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path).resolve()  # transformers looks for a bare gguf_file name in the working directory first
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ImportError("reading GGUF needs the gguf and accelerate packages: pip install 'fbrl[gguf]'") from None
    dtype = dtype or torch.float32
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=str(path))
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=str(path), dtype=dtype)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config).to(dtype)
    plain.load_state_dict(loaded.state_dict())
    return plain, tokenizer
