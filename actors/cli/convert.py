"""`fbrl convert SRC OUT [--fusion-mode MODE] [--init random|identity] [--to fbt|hf]` — a stock Hugging Face
Llama / Qwen2 / Qwen3 / Mistral checkpoint (a save_pretrained directory, or one GGUF file) → FBT checkpoint.

The backbone is copied bit for bit (its one-pass logits are unchanged). `--init random` (default) draws the
paper's fusion init: the result needs multi-pass training (`fbrl pretrain`) before feedback helps.
`--init identity` (linear_addition / concat_projection; `--fusion-mode` then defaults to linear_addition) sets the
fusion to its identity point (`rl.model.identity_init_fusion`): the converted model decodes exactly like its
backbone in every mode, and SFT / RL grow the latent channel from there. Weights are read from safetensors only
(`use_safetensors=True`): a pickled checkpoint is refused, never unpickled. The tokenizer (with its chat template)
and the generation config are copied, so the output loads and decodes on its own.

SRC may be a `.gguf` file (llama.cpp's format; needs the `gguf` extra): it is dequantized to fp32 first
(`rl.model.gguf`). `--to hf` writes that dequantized backbone as a plain Hugging Face checkpoint instead of an FBT
(e.g. the stock model to compare against).
"""

from __future__ import annotations

from pathlib import Path


def add_arguments(p) -> None:
    from rl.model import FUSION_INITS, FUSION_MODES

    p.add_argument(
        "src",
        help="a Llama / Qwen2 / Qwen3 / Mistral causal LM: a save_pretrained directory (safetensors), a Hugging Face "
        "Hub id (the local cache first), or a .gguf file",
    )
    p.add_argument("out", help="output directory")
    p.add_argument(
        "--fusion-mode",
        default=None,
        choices=FUSION_MODES,
        help="default: gate_product with --init random, linear_addition with --init identity",
    )
    p.add_argument(
        "--init",
        default="random",
        choices=FUSION_INITS,
        help="identity: start exactly at the backbone (W_U = 0, W_T = I)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the new fusion weights (--init random)")
    p.add_argument(
        "--to",
        default="fbt",
        choices=("fbt", "hf"),
        help="hf: write the backbone as a plain Hugging Face checkpoint (no fusion), e.g. from a GGUF",
    )


def run(args) -> int:
    from rl.errors import InputError
    from rl.hub import local_model_dir
    from rl.model.conversion import convert_checkpoint

    try:
        src = Path(local_model_dir(args.src, key="fbrl convert SRC"))
    except InputError as e:
        raise SystemExit(f"fbrl convert: {e}") from None
    model = tokenizer = None
    if src.suffix.lower() == ".gguf":
        from rl.model.gguf import load_gguf

        try:
            model, tokenizer = load_gguf(src)
        except (OSError, ImportError, ValueError) as e:  # missing file or package, not a GGUF, unknown architecture
            raise SystemExit(f"fbrl convert: {src}: {e}") from None
    elif not (src / "config.json").exists():
        raise SystemExit(
            f"fbrl convert: {src} is neither a save_pretrained directory (no config.json) nor a .gguf file"
        )
    if args.to == "hf":  # the backbone as it is: no fusion, so --fusion-mode, --init and --seed do not apply
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if model is None:
            model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, use_safetensors=True)
        model.save_pretrained(args.out)
        try:
            (tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(src)).save_pretrained(args.out)
        except (OSError, ValueError):
            print(f"note: no tokenizer in {src}; copy one into {args.out} before training")
        print(f"wrote the plain Hugging Face checkpoint of {src} to {args.out}")
        return 0
    try:
        mode = convert_checkpoint(src, args.out, args.fusion_mode, args.init, args.seed, model, tokenizer)
    except ValueError as e:
        raise SystemExit(f"fbrl convert: {e}") from None
    print(f"wrote FBT checkpoint ({mode}, init {args.init}) to {args.out}")
    return 0
