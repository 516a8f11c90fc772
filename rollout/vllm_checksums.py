"""Per-tensor checksums of the weights a vLLM FBT model really computes with, under Hugging Face names.

The weight-sync check compares them with the learner's (`rl.train.workers.tensor_checksums`, float64 sum + 1e-3 x sum
of squares per tensor). Two things stand between vLLM's parameters and the checkpoint's names and values:

- **Stacked layers.** vLLM fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj`
  (`model.packed_modules_mapping`); the stacked matrix is split back by the layer's `output_sizes`.
- **CPU weight repacking.** On CPU, vLLM hands each linear layer's weight to a oneDNN / sgl kernel in a packed
  layout and replaces `layer.weight` by an empty tensor (`dispatch_cpu_unquantized_gemm(remove_weight=True)`).
  The live weights are then read back through the layer's own kernel: `layer.cpu_linear(I, ...)` with an identity
  input returns W^T exactly (each output is one product by 1.0 plus zeros), in row blocks to bound memory.
Vocabulary-padded embeddings / LM heads are cut to `config.vocab_size` rows. Tied weights are counted once, like
`named_parameters()` on the Hugging Face side.
"""

from __future__ import annotations

import torch

BLOCK = 1024  # identity rows per probe


def _acc(out: dict, name: str, t: torch.Tensor) -> None:
    t = t.detach().double()
    out[name] = out.get(name, 0.0) + float(t.sum()) + 1e-3 * float((t * t).sum())


def _split_names(module_name: str, packed: dict, n_parts: int) -> list[str]:
    """HF module names of a (possibly stacked) vLLM module: `...qkv_proj` -> `...q_proj`, `...k_proj`, ..."""
    head, _, last = module_name.rpartition(".")
    parts = packed.get(last)
    if not parts or len(parts) != n_parts:
        return [module_name] if n_parts == 1 else [f"{module_name}.{i}" for i in range(n_parts)]
    return [f"{head}.{p}" if head else p for p in parts]


def _output_sizes(module) -> list[int]:
    sizes = getattr(module, "output_partition_sizes", None) or getattr(module, "output_sizes", None)
    return [int(s) for s in sizes] if sizes else []


def _linear_weight_sums(out: dict, module_name: str, module, packed: dict) -> None:
    """Checksums of a linear layer's weight, split into its stacked parts."""
    w = module.weight
    sizes = _output_sizes(module) or [int(getattr(module, "output_size_per_partition", 0) or w.shape[0])]
    names = [f"{n}.weight" for n in _split_names(module_name, packed, len(sizes))]
    bounds = [0]
    for s in sizes:
        bounds.append(bounds[-1] + s)
    if w.numel() > 0:  # weight still in place (GPU, or the torch fallback kernel)
        for n, a, b in zip(names, bounds, bounds[1:]):
            _acc(out, n, w[a:b])
        return
    # repacked on CPU: W^T block by block through the layer's own kernel
    k = int(getattr(module, "input_size_per_partition", 0) or module.input_size)
    dtype = getattr(module, "params_dtype", torch.float32)
    for n in names:
        out.setdefault(n, 0.0)
    for start in range(0, k, BLOCK):
        rows = min(BLOCK, k - start)
        eye = torch.zeros(rows, k, dtype=dtype)
        eye[torch.arange(rows), start + torch.arange(rows)] = 1.0
        wt = module.cpu_linear(eye, w, None)  # [rows, out] = W^T[start:start+rows]
        for n, a, b in zip(names, bounds, bounds[1:]):
            _acc(out, n, wt[:, a:b])


@torch.no_grad()
def live_weight_checksums(model) -> dict[str, float]:
    """{HF tensor name: checksum} of `model` (a vLLM model instance)."""
    from vllm.model_executor.layers.linear import LinearBase

    packed = dict(getattr(model, "packed_modules_mapping", None) or {})
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    out: dict[str, float] = {}
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            full = f"{module_name}.{pname}" if module_name else pname
            if isinstance(module, LinearBase) and pname == "weight":
                _linear_weight_sums(out, module_name, module, packed)
            elif isinstance(module, LinearBase) and pname == "bias" and len(_output_sizes(module)) > 1:
                a = 0
                for n, size in zip(
                    _split_names(module_name, packed, len(_output_sizes(module))), _output_sizes(module)
                ):
                    _acc(out, f"{n}.bias", p[a : a + size])
                    a += size
            elif p.dim() == 2 and vocab and p.shape[0] > vocab and ("embed" in module_name or "lm_head" in module_name):
                _acc(out, full, p[:vocab])  # vocabulary padding rows are not part of the checkpoint
            else:
                _acc(out, full, p)
    return out
