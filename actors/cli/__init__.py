"""`fbrl` — the command line: `train` (launch.py, with the input checks of preflight.py), `eval` (evaluate.py),
`compare-likelihood` (compare.py), `convert` (convert.py), `pretrain` (pretraining.py).

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`; a module is
imported only when its command runs or shows its help (so `fbrl pretrain` never starts Ray). The text users read
— one line per command in `fbrl --help`, and a description with examples in `fbrl COMMAND --help` — lives in
`COMMANDS` below. `fbrl` with no arguments prints the help.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys
import threading

DESCRIPTION = """\
fbrl: online reinforcement-learning post-training (GRPO family) for full-bandwidth transformers,
decoder LMs that feed the previous token's top-layer state back into the next input."""
EPILOG = """\
`fbrl COMMAND --help` shows a command's description, examples and options.
First run: `make demo` (= fbrl train configs/tiny.yaml: the embedded RL job, about 4 minutes on 2 CPU cores)."""

COMMANDS = {
    "train": (
        "actors.cli.launch",
        "run an RL job (local Ray unless ray.address names a cluster)",
        """\
Run an online RL job: rollout engines decoding with latent feedback (vLLM with fbrl's plugin, or the pure-torch
engine), DeepSpeed learners, rule-based or your own reward functions (docs/REWARDS.md), the likelihood estimator
of your choice, on Ray. Without ray.address a private local Ray is started (loopback only, dashboard off).
Without CONFIG the embedded default runs (configs/tiny.yaml: the tiny checkpoint on synthetic arithmetic).

The console shows one line per step and a summary at the end; everything else is in RUN_DIR: config.yaml,
metrics.jsonl (one JSON object per step), checkpoints/, plots/summary.png, wandb/.

examples:
  fbrl train configs/tiny.yaml train.steps=10 run_dir=runs/try
  fbrl train configs/tiny.yaml --print-config        # every setting, defaults included, as YAML
  fbrl train --resume runs/try train.steps=20        # continue from the run's latest checkpoint
  ray job submit --address ADDR -- fbrl train configs/gpu_1b.yaml   (docs/CLUSTER.md)""",
    ),
    "pretrain": (
        "actors.cli.pretraining",
        "multi-pass pretraining / SFT that makes an FBT checkpoint",
        """\
Multi-pass pretraining or supervised fine-tuning of an FBT checkpoint: pass 1 is the ordinary forward, pass k
feeds pass k-1's top-layer states back in, and the loss is L_1 + mean(L_2..L_K). Which decode modes the
result serves depends on the objective (docs/PRETRAINING.md); the checkpoint records them (fbt_decode_modes).

examples:
  fbrl pretrain configs/tiny_pretrain.yaml pretrain.out_dir=runs/my-tiny
  fbrl pretrain configs/tiny_sft_fused.yaml pretrain.steps=100""",
    ),
    "eval": (
        "actors.cli.evaluate",
        "accuracy and pass@k of a checkpoint, per decode mode",
        """\
Accuracy (greedy and sampled) and pass@k of a checkpoint in one or more decode modes, with the paired McNemar test
between modes, on the arithmetic task or a JSONL file. Warns when a mode is not one the checkpoint was trained for.

examples:
  fbrl eval --checkpoint checkpoints/tiny-arith-fused --decode-mode standard soft fused --samples 4
  fbrl eval --checkpoint runs/try/checkpoints/step_000010/learner/model --n 200 --json eval.json""",
    ),
    "compare-likelihood": (
        "actors.cli.compare",
        "likelihood estimators against the exact recurrence",
        """\
The log-prob, KL, top-1 and KV-cache error of each likelihood estimator (K-pass for K = 1..M, replay, standard)
against the exact recurrence, on fresh rollouts of a checkpoint, with time per token.

examples:
  fbrl compare-likelihood --checkpoint checkpoints/tiny-arith --max-passes 6 --plot cmp.png
  fbrl compare-likelihood --checkpoint checkpoints/tiny-arith-fused --decode-mode fused --json cmp.json""",
    ),
    "convert": (
        "actors.cli.convert",
        "a stock Hugging Face Llama / Qwen2 / Qwen3 / Mistral checkpoint (or GGUF) -> an FBT checkpoint",
        """\
Copy a stock Llama, Qwen2, Qwen3 or Mistral checkpoint (safetensors, or one GGUF file, dequantized) into an FBT checkpoint with new
fusion weights. With --init random the result decodes like the original in standard mode and needs multi-pass
training (fbrl pretrain) before feedback helps; with --init identity it decodes like the original in every mode.

examples:
  fbrl convert path/to/SmolLM2-135M-Instruct runs/smollm-fbt --fusion-mode gate_product
  fbrl convert SmolLM2-135M-Instruct.Q4_1.gguf runs/smollm2/hf --to hf     # GGUF -> plain Hugging Face
  fbrl convert runs/smollm2/hf runs/smollm2/fbt-identity --init identity""",
    ),
}


def build_parser(wanted: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `wanted`'s module is imported for its options (None: the command list only)."""
    parser = argparse.ArgumentParser(
        prog="fbrl", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text, description) in COMMANDS.items():
        p = sub.add_parser(
            name, help=help_text, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        if name == wanted:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    wanted = argv[0] if argv and argv[0] in COMMANDS else None
    if wanted not in (None, "train"):  # train quiets per its config (logging.verbose, --verbose)
        from actors.console import QUIET_ENV

        for key, value in QUIET_ENV.items():  # before the command's module imports the libraries
            os.environ.setdefault(key, value)
    parser = build_parser(wanted)
    if not argv:
        parser.print_help()
        return 0
    args, rest = parser.parse_known_args(argv)
    if args.command is None:
        parser.error("choose a COMMAND")
    # argparse stops collecting `overrides` at the first flag; key=value words after a flag land in `rest`.
    stray = [w for w in rest if "=" not in w or w.startswith("-")]
    if stray or (rest and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or rest)}")
    if rest:
        args.overrides = list(args.overrides) + rest
    from rl.config import ConfigError

    try:
        return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)
    except ConfigError as e:  # a bad key or value: the message names it; a traceback would bury it
        print(f"fbrl {args.command}: error: {e}", file=sys.stderr)
        return 2


def entry() -> None:
    """The `fbrl` command (and `python -m actors.cli`): `main()`, then the process exits without finalizing its
    imported modules one by one, which after torch, transformers, DeepSpeed and Ray takes ~1 s of every command.
    Exit handlers still run and the streams are flushed first, as at any exit; every file fbrl writes is closed
    (and fsynced) before `main` returns. With a non-daemon thread still running, or an exception, it exits as usual."""
    code = main()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
