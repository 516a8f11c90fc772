"""`fbrl eval` — accuracy / pass@k of a checkpoint per decode mode (CLI glue; the logic is rl/train/evaluator.py).

    fbrl eval --checkpoint checkpoints/tiny-arith --task arith --split test --n 500 \
              --decode-mode standard soft fused --samples 4 --json eval.json
    fbrl eval --checkpoint FBT --decode-mode soft --baseline STANDARD_CKPT --task cups \
              --difficulty 4 8 12 --by-difficulty          # two checkpoints, paired, by chain length

The engine is the pure-torch reference engine (`rollout.torch_engine.TorchEngine`); completions are scored with
the math reward (`rewards.math.MathReward`, math-verify; strict on the arithmetic task, as in training) when it
is importable, else with `rl.train.evaluator.plain_numeric_score`. For the arithmetic task the difficulty levels default
to the ones the checkpoint was trained on (its `pretrain_config.yaml`), so the test split matches the training
distribution. A decode mode the checkpoint was not trained for (rl/decode_modes.py) is warned about before the
evaluation and under the table, and the warning is kept in the JSON's `meta`.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from actors.cli.data_args import add_data_arguments, data_section
from rl.atomic_files import write_text
from rl.config import DataConfig, config_from_dict
from rl.data.tasks import TASKS, generated_tasks, tasks_help
from rl.decode_modes import DECODE_MODES


def add_arguments(p) -> None:
    p.add_argument("--checkpoint", required=True, help="FBT checkpoint directory (save_pretrained + tokenizer)")
    add_data_arguments(
        p,
        TASKS,
        what=f"{tasks_help()} (a file task reads --data-path: rows with a prompt or a chat, and an answer)",
    )
    p.add_argument("--split", default="test", help="generated tasks: train | val | test; hf_disk / hub: a split")
    p.add_argument(
        "--difficulty",
        type=int,
        nargs="+",
        default=None,
        help="arith levels / state-tracking chain lengths (default: the checkpoint's training ones)",
    )
    p.add_argument("--n", type=int, default=500, help="number of problems")
    p.add_argument(
        "--decode-mode",
        nargs="+",
        default=["standard", "soft", "fused"],
        choices=list(DECODE_MODES),
        help="one or more decode modes (paired test if several)",
    )
    p.add_argument("--samples", type=int, default=1, help="sampled completions per problem (pass@k); 0: greedy only")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--max-tokens", type=int, default=48, help="response length cap (tokens)")
    p.add_argument("--batch-size", type=int, default=64, help="prompts per engine call")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled completions")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument(
        "--scorer",
        default="auto",
        choices=["auto", "math", "plain", "task"],
        help="auto: a state-tracking task's own literal scorer; else the math reward if importable, "
        "else the plain numeric comparison",
    )
    p.add_argument(
        "--baseline",
        default=None,
        metavar="CKPT",
        help="a second checkpoint evaluated on the same problems (e.g. a standard model of the same "
        "size and compute), paired with every --decode-mode of --checkpoint",
    )
    p.add_argument("--baseline-mode", default="standard", choices=list(DECODE_MODES), help="decode mode of --baseline")
    p.add_argument(
        "--by-difficulty",
        action="store_true",
        help="evaluate each --difficulty level separately (--n problems each): a table by level",
    )
    p.add_argument("--json", dest="json_out", default=None, help="write the results here")


def _data_config(args) -> DataConfig:
    """The checkpoint's training data section (for its difficulty levels), with this command's choices."""
    saved = Path(args.checkpoint) / "pretrain_config.yaml"
    data = {}
    if saved.is_file():
        data = dict((yaml.safe_load(saved.read_text()) or {}).get("data") or {})
    if data.get("task") != args.task:  # levels, files and fields of another task mean nothing here
        data = {"seed": data["seed"]} if "seed" in data else {}
    data.update(data_section(args, args.split))
    if args.difficulty:
        data["difficulty"] = args.difficulty
    return config_from_dict({"data": data}).data


def _scorer(choice: str, task: str):
    """The correctness check: the task's own scorer when it has one (state tracking), else the math reward (strict
    where the task says so: arithmetic, as in training)."""
    own = TASKS[task].scorer
    if choice == "task" or (choice == "auto" and own is not None):
        if own is None:
            with_one = ", ".join(name for name, t in TASKS.items() if t.scorer is not None)
            raise SystemExit(
                f"fbrl eval: --scorer task: {task!r} has no scorer of its own (tasks with one: {with_one})"
            )
        return own
    strict = TASKS[task].strict_math
    if choice in ("auto", "math"):
        try:
            from rewards.math import MathReward

            return MathReward(strict=strict)
        except ImportError:
            if choice == "math":
                raise
    from rl.train.evaluator import plain_numeric_score

    return plain_numeric_score


def run(args) -> int:
    """Load the checkpoint (and the baseline), then per difficulty level: the rows, every engine's evaluation, one
    table; the levels' table and the JSON at the end."""
    import torch

    from rl.decode_modes import mode_warning
    from rl.report.eval_stats import format_levels

    torch.set_num_threads(args.threads)
    warning = mode_warning(args.checkpoint, args.decode_mode, "--decode-mode")
    if warning:
        print(warning)  # before the minutes of evaluation, and again under the table
    data = _data_config(args)
    if args.by_difficulty and not TASKS[args.task].generated:
        raise SystemExit(f"fbrl eval: --by-difficulty needs a generated task ({', '.join(generated_tasks())})")
    levels = [[d] for d in data.difficulty] if args.by_difficulty else [list(data.difficulty)]
    engines = _engines(args)
    score_fn = _scorer(args.scorer, args.task)
    results = {}
    try:
        for level in levels:
            if args.by_difficulty:
                print(f"-- difficulty {level[0]}")
            results[str(level[0]) if args.by_difficulty else "all"] = _evaluate_level(
                args, data, level, engines, score_fn
            )
    finally:
        if hasattr(score_fn, "close"):
            score_fn.close()
    if args.by_difficulty:
        print(format_levels(results))
        meta = {"checkpoint": str(args.checkpoint), "baseline": args.baseline, "task": args.task, "split": args.split}
        out_json = {"meta": {**meta, "n_per_level": args.n}, "levels": results}
    else:
        out_json = results["all"]
    if warning:
        print(warning)
        out_json["meta"]["warning"] = warning
    if args.json_out:
        out = Path(args.json_out)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text(out, json.dumps(out_json, indent=1))
        print(f"wrote {out}")
    return 0


def _engines(args) -> list[tuple]:
    """(label prefix, torch engine, tokenizer, decode modes) for the checkpoint and the --baseline, if any."""
    from transformers import AutoTokenizer

    from rl.model import as_standard_lm
    from rl.model.files import load_fbt
    from rollout.torch_engine import TorchEngine

    models = [("", args.checkpoint, args.decode_mode)]
    if args.baseline:
        models.append(("baseline:", args.baseline, [args.baseline_mode]))
    engines = []
    for prefix, path, modes in models:
        model = load_fbt(path).eval()
        if not hasattr(model, "fusion"):  # a stock checkpoint (e.g. before `fbrl convert`): standard decoding only
            if set(modes) != {"standard"}:
                raise SystemExit(
                    f"fbrl eval: {path} is not an FBT checkpoint (model_type "
                    f"{model.config.model_type!r}); it decodes only with --decode-mode standard"
                )
            model = as_standard_lm(model)
        engines.append((prefix, TorchEngine(model), AutoTokenizer.from_pretrained(path), modes))
    return engines


def _evaluate_level(args, data, level, engines, score_fn) -> dict:
    """One difficulty level: its rows, every engine's evaluation (the baseline's modes joining the checkpoint's
    table, paired with each of its modes), the printed table."""
    import dataclasses

    from rl.data.jsonl import DataError
    from rl.data.loaders import load_task_split
    from rl.report.eval_stats import format_table, paired_tests
    from rl.train.evaluator import evaluate

    # generated tasks: train / val / test are the task's own hash-disjoint splits; a file task: the one file
    try:
        rows = load_task_split(
            dataclasses.replace(data, difficulty=level),
            args.split if args.split in ("train", "val") else "test",
            n=args.n,
            tokenizer=engines[0][2],
        )
    except DataError as e:
        raise SystemExit(f"fbrl eval: {e}") from None
    result = None
    for prefix, engine, tokenizer, modes in engines:
        res = evaluate(
            engine,
            tokenizer,
            rows,
            modes,
            samples=args.samples,
            temperature=args.temperature,
            max_tokens=args.max_tokens,
            seed=args.seed,
            score_fn=score_fn,
            batch_size=args.batch_size,
            log=lambda line, prefix=prefix: print(prefix + line),
        )
        if result is None:
            result = res
            continue
        for mode in modes:  # the baseline's modes join the table under `baseline:<mode>`
            for mine in list(args.decode_mode):
                result["paired"] += paired_tests(
                    result["per_problem"][mine], res["per_problem"][mode], mine, prefix + mode
                )
            result["modes"][prefix + mode] = res["modes"][mode]
            result["per_problem"][prefix + mode] = res["per_problem"][mode]
    result["meta"].update(
        checkpoint=str(args.checkpoint),
        baseline=args.baseline,
        task=args.task,
        split=args.split,
        difficulty=level if TASKS[args.task].generated else None,
    )
    print(format_table(result))
    return result
