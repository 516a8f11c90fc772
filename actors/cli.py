"""`fbrl` — the command line. Each subcommand lives in its own module exposing `add_arguments(parser)` and
`run(args) -> int`; modules are imported only when their command runs (so `fbrl pretrain` never starts Ray)."""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "train": ("actors.launch", "GRPO-style RL job (local Ray when no cluster address is given)"),
    "pretrain": ("rl.pretrain", "multi-pass pretraining / SFT of an FBT checkpoint"),
    "eval": ("actors.cmd_eval", "accuracy / pass@k per decode mode"),
    "compare-likelihood": ("actors.cmd_compare", "likelihood estimators vs the exact recurrence"),
    "convert": ("actors.cmd_convert", "stock Hugging Face Llama/Qwen2 checkpoint -> FBT checkpoint"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="fbrl", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = argv[0] if argv and argv[0] in COMMANDS else None
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name == wanted:  # import only the module of the command that runs
            importlib.import_module(module).add_arguments(p)
    if not argv:
        argv = ["train"]  # `fbrl` alone runs the embedded default job
        sub.choices["train"].set_defaults()
        importlib.import_module(COMMANDS["train"][0]).add_arguments(sub.choices["train"])
    args, rest = parser.parse_known_args(argv)
    # argparse stops collecting `overrides` at the first flag; key=value words after a flag land in `rest`.
    stray = [w for w in rest if "=" not in w or w.startswith("-")]
    if stray or (rest and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or rest)}")
    if rest:
        args.overrides = list(args.overrides) + rest
    return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
