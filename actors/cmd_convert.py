"""`fbrl convert SRC OUT [--fusion-mode MODE] [--init random|identity]` — a stock Hugging Face Llama/Qwen2
checkpoint → FBT checkpoint.

The backbone is copied bit for bit (its one-pass logits are unchanged). `--init random` (default) draws the
paper's fusion init: the result needs multi-pass training (`fbrl pretrain`) before feedback helps.
`--init identity` (linear_addition / concat_projection; `--fusion-mode` then defaults to linear_addition) sets the
fusion to its identity point (`rl.model.identity_init_fusion`): the converted model decodes exactly like its
backbone in every mode, and SFT / RL grow the latent channel from there. Weights are read from safetensors only
(`use_safetensors=True`): a pickled checkpoint is refused, never unpickled. The tokenizer (with its chat template)
and the generation config are copied, so the output loads and decodes on its own.
"""
from __future__ import annotations

from pathlib import Path


def add_arguments(p) -> None:
    from rl.model import FUSION_INITS, FUSION_MODES
    p.add_argument("src", help="save_pretrained directory of a Llama / Qwen2 causal LM (safetensors)")
    p.add_argument("out", help="output directory")
    p.add_argument("--fusion-mode", default=None, choices=FUSION_MODES,
                   help="default: gate_product with --init random, linear_addition with --init identity")
    p.add_argument("--init", default="random", choices=FUSION_INITS,
                   help="identity: start exactly at the backbone (W_U = 0, W_T = I)")
    p.add_argument("--seed", type=int, default=0, help="seed of the new fusion weights (--init random)")


def run(args) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from rl.decode_modes import MODES, record
    from rl.model import convert_to_fbt
    src = Path(args.src)
    if not (src / "config.json").exists():
        raise SystemExit(f"fbrl convert: {src} is not a save_pretrained directory (no config.json)")
    mode = args.fusion_mode or ("linear_addition" if args.init == "identity" else "gate_product")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, use_safetensors=True)
    try:
        fbt = convert_to_fbt(model, mode, seed=args.seed, init=args.init)
    except ValueError as e:
        raise SystemExit(f"fbrl convert: {e}") from None
    if (src / "generation_config.json").is_file():
        fbt.generation_config = GenerationConfig.from_pretrained(src)
    # random fusion weights are untrained: only the backbone's own mode is served; the identity init decodes
    # exactly like the backbone in every mode (W_U = 0: nothing is fed back yet)
    record(fbt.config, MODES if args.init == "identity" else ["standard"])
    fbt.save_pretrained(args.out)
    try:
        AutoTokenizer.from_pretrained(src).save_pretrained(args.out)
    except (OSError, ValueError):
        print(f"note: no tokenizer in {src}; copy one into {args.out} before training")
    print(f"wrote FBT checkpoint ({mode}, init {args.init}) to {args.out}")
    return 0
