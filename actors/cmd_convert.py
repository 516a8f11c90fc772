"""`fbrl convert SRC OUT [--fusion-mode MODE]` — a stock Hugging Face Llama/Qwen2 checkpoint → FBT checkpoint.

The backbone is copied bit for bit (its one-pass logits are unchanged); the fusion weights are freshly
initialized, so the result needs multi-pass training (`fbrl pretrain`) before feedback helps. Weights are read
from safetensors only (`use_safetensors=True`): a pickled checkpoint is refused, never unpickled.
"""
from __future__ import annotations

from pathlib import Path


def add_arguments(p) -> None:
    from rl.model import FUSION_MODES
    p.add_argument("src", help="save_pretrained directory of a Llama / Qwen2 causal LM (safetensors)")
    p.add_argument("out", help="output directory")
    p.add_argument("--fusion-mode", default="gate_product", choices=FUSION_MODES)
    p.add_argument("--seed", type=int, default=0)


def run(args) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl.model import convert_to_fbt
    src = Path(args.src)
    if not (src / "config.json").exists():
        raise SystemExit(f"fbrl convert: {src} is not a save_pretrained directory (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, use_safetensors=True)
    fbt = convert_to_fbt(model, args.fusion_mode, seed=args.seed)
    fbt.save_pretrained(args.out)
    try:
        AutoTokenizer.from_pretrained(src).save_pretrained(args.out)
    except (OSError, ValueError):
        print(f"note: no tokenizer in {src}; copy one into {args.out} before training")
    print(f"wrote FBT checkpoint ({args.fusion_mode}) to {args.out}")
    return 0
