"""Export an FBT Llama checkpoint as a plain `LlamaForCausalLM` + tokenizer directory (for TRL / stock transformers),
or check that an existing plain Llama directory is that export (`--check`).

Run with fbrl's venv (it imports `rl`, which registers `fbt_llama` with the Auto classes):

    <checkout>/.venv/bin/python export_llama.py SRC OUT                  # export (the tiny job's checkpoint)
    <checkout>/.venv/bin/python export_llama.py SRC --check HF_DIR \
        --config <checkout>/configs/smollm_rl.yaml --rows 8              # check a stock model it was converted from

`--check HF_DIR` writes nothing: it loads the plain Llama in HF_DIR (e.g. runs/smollm2/hf, the stock model that
`fbrl convert --init identity` turned into runs/smollm2/fbt-identity) and runs the same checks against it, plus:
every tensor of SRC except the fusion's is bit-equal to HF_DIR's, and the two tokenizers give the same ids and
special ids. TRL then loads HF_DIR itself.
`--config` takes the check rows from that fbrl config's task (`load_task_split(data, "test")`: for a chat task the
chat-templated prompt + the worked solution, encoded as fbrl encodes a templated prompt, without added special
tokens); without it, arithmetic rows as before. `--rows` (default 64) sets how many.

With latent feedback off (fbrl's `standard` decode mode and `standard` likelihood estimator) an FBT model *is* its
backbone: `FBTMixin.multipass_forward(..., num_passes=1)` and `run_stack(embed(ids))` never call the fusion
(rl/model/fbt.py `_fused_inputs` returns the plain embedding when nothing is fused). So the export is: every tensor but
`fusion.*`, copied bit for bit into a `LlamaForCausalLM` whose config is the FBT config without its `fbt_*` keys.
fbrl has no command for this direction (`fbrl convert` goes stock -> FBT).

Checks before anything is written (any failure exits non-zero):
  * the state dict loads with strict=True (nothing missing, nothing unexpected besides the dropped fusion);
  * the exported model's logits equal the FBT model's standard-mode forward, computed the two ways fbrl does it
    (`run_stack(embed(ids))`, the standard estimator; and `multipass_forward(ids, 1)`), max |diff| must be 0.0,
    on right-padded and left-padded batches of real prompts + worked solutions;
  * the tokenizer round-trips the prompts to the same ids as the checkpoint's tokenizer.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("src", help="FBT checkpoint directory (e.g. <checkout>/checkpoints/tiny-arith-mixed)")
    ap.add_argument("out", nargs="?", help="output directory (plain Llama); not with --check")
    ap.add_argument(
        "--check",
        metavar="HF_DIR",
        help="check this existing plain Llama directory instead of exporting (writes nothing)",
    )
    ap.add_argument("--config", help="fbrl config whose task gives the check rows (default: arithmetic rows)")
    ap.add_argument("--rows", type=int, default=64, help="check rows (default 64)")
    args = ap.parse_args()
    if (args.out is None) == (args.check is None):
        ap.error("give either OUT (export) or --check HF_DIR (check only)")

    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    import rl  # noqa: F401  (registers FBT classes)
    from rl.data import arith
    from rl.model import positions_from_mask

    src = Path(args.src)
    fbt = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    if not hasattr(fbt, "fusion") or fbt.config.model_type != "fbt_llama":
        print(f"export_llama: {src} is not an FBT Llama checkpoint", file=sys.stderr)
        return 2
    sd = {k: v for k, v in fbt.state_dict().items() if not k.startswith("fusion.")}
    dropped = sorted(k for k in fbt.state_dict() if k.startswith("fusion."))

    if args.check:  # the existing plain Llama: every non-fusion tensor must be SRC's, bit for bit
        plain = AutoModelForCausalLM.from_pretrained(args.check, dtype=torch.float32).eval()
        if type(plain).__name__ != "LlamaForCausalLM":
            print(f"export_llama: {args.check} is a {type(plain).__name__}, not a LlamaForCausalLM", file=sys.stderr)
            return 2
        theirs = plain.state_dict()
        if set(theirs) != set(sd):
            print(
                f"export_llama: tensor names differ: only in FBT {sorted(set(sd) - set(theirs))}, only in "
                f"{args.check} {sorted(set(theirs) - set(sd))}",
                file=sys.stderr,
            )
            return 1
        unequal = [k for k in sd if sd[k].dtype != theirs[k].dtype or not torch.equal(sd[k], theirs[k])]
        print(
            f"export_llama: {args.check}: {len(sd)} tensors, {len(sd) - len(unequal)} bit-equal to {src} "
            f"(fusion tensors not in it: {', '.join(dropped)})"
        )
        if unequal:
            print(f"export_llama: tensors differ: {unequal[:5]}", file=sys.stderr)
            return 1
    else:
        fields = fbt.config.to_dict()
        for k in list(fields):
            if k.startswith("fbt_") or k in ("model_type", "architectures", "transformers_version", "auto_map"):
                fields.pop(k)
        cfg = LlamaConfig(**fields)
        cfg.architectures = ["LlamaForCausalLM"]
        plain = LlamaForCausalLM(cfg).to(torch.float32).eval()
        res = plain.load_state_dict(sd, strict=True)
        assert not res.missing_keys and not res.unexpected_keys, res
        plain.generation_config = fbt.generation_config

    # ---- equality of the standard-mode forward (what fbrl's standard estimator and standard decoding run)
    tok = AutoTokenizer.from_pretrained(src)
    if args.config:  # the config's own task rows, encoded as fbrl encodes them (rl/data/loaders.py encode_prompt)
        from rl.config import load_config
        from rl.data.loaders import load_task_split

        rows = load_task_split(load_config(args.config).data, "test", n=args.rows, tokenizer=tok)
        chat = {bool(r.get("chat_templated")) for r in rows}
        assert len(chat) == 1, "mixed chat-templated and plain rows"
        special = not chat.pop()  # a templated prompt holds its special tokens already
    else:
        rows = arith.generate("test", args.rows, seed=0, difficulties=(1, 2))
        special = True
    texts = [r["prompt"] + r["solution"] for r in rows]
    worst = 0.0
    for side in ("right", "left"):
        tok.padding_side = side
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=special)
        ids, am = enc["input_ids"], enc["attention_mask"]
        pos = positions_from_mask(am)
        with torch.no_grad():
            h_std, _ = fbt.run_stack(fbt.embed(ids), am, pos)  # rl/estimators/likelihood.py `standard`
            ref = fbt.logits_from_hidden(h_std)
            h_mp = fbt.multipass_forward(ids, 1, am).last_hidden  # one pass = no feedback anywhere
            got = plain(input_ids=ids, attention_mask=am, position_ids=pos).logits
        m = am.bool()
        d1 = (got - ref).abs()[m].max().item()
        d2 = (fbt.logits_from_hidden(h_mp) - ref).abs()[m].max().item()
        worst = max(worst, d1, d2)
        print(
            f"export_llama: {side}-padded batch of {len(texts)}: max |logit diff| plain vs FBT standard = {d1:.3g}, "
            f"1-pass multipass vs standard = {d2:.3g}"
        )
    if worst != 0.0:
        print(
            f"export_llama: logits differ (max {worst}); "
            + (f"{args.check} is not the standard-mode model" if args.check else f"refusing to write {args.out}"),
            file=sys.stderr,
        )
        return 1

    tok.padding_side = "right"
    prompts = [r["prompt"] for r in rows]
    if args.check:
        tok2 = AutoTokenizer.from_pretrained(args.check)
        assert (
            tok2(prompts, add_special_tokens=special)["input_ids"]
            == tok(prompts, add_special_tokens=special)["input_ids"]
        ), "tokenizers differ"
        special_ids = lambda t: (t.pad_token_id, t.bos_token_id, t.eos_token_id)  # noqa: E731
        assert special_ids(tok2) == special_ids(tok), f"special ids differ: {special_ids(tok2)} vs {special_ids(tok)}"
        print(
            f"export_llama: checked {args.check} ({type(plain).__name__}, "
            f"{sum(p.numel() for p in plain.parameters()):,} params): standard-mode logits equal, tokenizers "
            f"equal (pad/bos/eos {special_ids(tok2)}); nothing written"
        )
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)  # byte-for-byte: the same char-level tokenizer
    tok2 = AutoTokenizer.from_pretrained(out)
    assert tok2(prompts)["input_ids"] == tok(prompts)["input_ids"], "tokenizer differs after export"
    assert (tok2.pad_token_id, tok2.bos_token_id, tok2.eos_token_id) == (0, 1, 2), "special ids moved"
    reloaded = json.loads((out / "config.json").read_text())
    print(
        f"export_llama: wrote {out} ({reloaded['model_type']}, {reloaded['architectures'][0]}, "
        f"{sum(p.numel() for p in plain.parameters()):,} params; dropped {len(dropped)} fusion tensors: "
        f"{', '.join(dropped)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
