"""`fbrl compare-likelihood`: the likelihood estimators against the exact recurrence on fresh rollouts.

Generates N rollouts with the torch engine (recording, in fp32, the states the engine fed back), then reports, for
K = 1..M passes, for replay and for standard (no feedback: what a learner blind to the latent channel would
compute), the log-prob error, KL, top-1 agreement and KV-cache error against the exact recurrence, and time per
token (rl/estimators/comparison.py). Replay is reported as recorded and after storing the states in each format of
`--state-formats` (bf16, fp8: what `rollout.record_states_dtype` costs). Optional JSON (keys `passes`, `replay`,
`replay_formats`, `standard`, ...) and a plot of error against passes with replay and standard as horizontal lines.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from actors.cli.data_args import add_data_arguments, data_section
from rl.data.tasks import TASKS, file_tasks, tasks_help

PROMPT_SOURCES = (*TASKS, "random")  # the data tasks, or random token ids


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="FBT checkpoint directory (save_pretrained + tokenizer)")
    add_data_arguments(
        p,
        PROMPT_SOURCES,
        what=f"prompt source: a task's test split ({tasks_help()}; needs the checkpoint's tokenizer; a file task reads "
        "--data-path, chats rendered with the tokenizer's template), or random: random token ids",
    )
    p.add_argument(
        "--difficulty",
        type=int,
        nargs="+",
        default=None,
        help="arith levels / state-tracking chain lengths (default: the checkpoint's training ones, "
        "else arith 1 2 3 / chain 8)",
    )
    p.add_argument("--n-samples", type=int, default=16, help="rollouts (one per prompt)")
    p.add_argument("--max-passes", type=int, default=6, help="compare kpass for K = 1..M")
    p.add_argument(
        "--decode-mode",
        choices=("soft", "fused"),
        default="soft",
        help="how the rollouts are decoded (standard has no latent channel to compare)",
    )
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--max-tokens", type=int, default=32, help="response length cap")
    p.add_argument("--micro-batch-size", type=int, default=8, help="rows per forward in the comparison")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and the sampling")
    p.add_argument(
        "--state-formats",
        nargs="*",
        default=["bf16", "fp8"],
        choices=("fp32", "bf16", "fp8"),
        help="replay also after storing the recorded states in these formats (rl/samples/states.py)",
    )
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT", help="write the report as JSON")
    p.add_argument("--plot", dest="plot_out", default=None, metavar="OUT.png", help="error-vs-passes figure")


def task_prompts(
    task: str,
    n: int,
    tokenizer=None,
    vocab_size: int | None = None,
    bos_id: int | None = None,
    seed: int = 0,
    difficulty: list[int] | None = None,
    data: dict | None = None,
) -> list[list[int]]:
    """n prompts as token ids: a task's test-split prompts through the tokenizer, or random ids (BOS first).
    `difficulty`: a generated task's levels or chain lengths (None: the task's `default_difficulty`)."""
    if task != "random":
        if tokenizer is None:
            raise ValueError(f"--task {task} needs a tokenizer in the checkpoint directory (or use --task random)")
        if task not in TASKS:
            raise ValueError(f"task: expected one of {PROMPT_SOURCES}, got {task!r}")
        from rl.config import config_from_dict
        from rl.data.loaders import encode_prompt, load_task_split

        section = {**(data or {"task": task}), "seed": seed}
        section["difficulty"] = list(difficulty or TASKS[task].default_difficulty or [1])
        rows = load_task_split(config_from_dict({"data": section}).data, "test", n, tokenizer, answer_needed_by=None)
        return [encode_prompt(tokenizer, r) for r in rows]  # (no scoring here: answers are optional)
    if task == "random":
        rng = random.Random(seed)
        lo = 3 if vocab_size > 8 else 0  # keep clear of the special ids (pad/bos/eos) of small vocabularies
        return [
            ([bos_id] if bos_id is not None else [])
            + [rng.randrange(lo, vocab_size) for _ in range(rng.randint(6, 16))]
            for _ in range(n)
        ]
    raise ValueError(f"task: expected one of {PROMPT_SOURCES}, got {task!r}")


def _trained_difficulty(checkpoint: str, task: str) -> list[int] | None:
    """The levels / chain lengths the checkpoint was trained on, when it was trained on `task`."""
    import yaml

    saved = Path(checkpoint) / "pretrain_config.yaml"
    data = (yaml.safe_load(saved.read_text()) or {}).get("data") or {} if saved.is_file() else {}
    return list(data["difficulty"]) if data.get("task") == task and data.get("difficulty") else None


def generate_rollouts(
    model, prompts: list[list[int]], decode_mode: str, temperature: float, max_tokens: int, seed: int, tokenizer=None
):
    """One sample per prompt from the torch engine (stops at the model's / tokenizer's EOS), states recorded in
    fp32; drops samples that cannot be compared (empty, preempted, aborted)."""
    from rl.samples.request import SamplingParams
    from rollout.torch_engine import TorchEngine

    params = SamplingParams(
        n=1, temperature=temperature, max_tokens=max_tokens, decode_mode=decode_mode, record_states=True, seed=seed
    )
    samples = TorchEngine(model, tokenizer=tokenizer).generate(prompts, params)
    return [s for s in samples if s.response_len > 0 and not s.preempted and s.finish_reason != "aborted"]


def run(args) -> int:
    """Roll out n samples from the checkpoint, compare every estimator against the exact recurrence, print and
    write the report."""
    import torch

    from rl.data.jsonl import DataError
    from rl.decode_modes import mode_warning
    from rl.estimators.comparison import compare_samples, format_comparison

    if args.n_samples < 1 or args.max_passes < 1:
        raise SystemExit("compare-likelihood: --n-samples and --max-passes must be >= 1")
    torch.manual_seed(args.seed)
    warning = mode_warning(args.checkpoint, args.decode_mode, "--decode-mode")
    if warning:
        print(warning)
    model, tokenizer = _load(args.checkpoint)
    difficulty = args.difficulty or _trained_difficulty(args.checkpoint, args.task)
    file_task = args.task in file_tasks()
    try:
        cfg = model.config
        prompts = task_prompts(
            args.task,
            args.n_samples,
            tokenizer,
            cfg.vocab_size,
            cfg.bos_token_id,
            args.seed,
            difficulty,
            data_section(args) if file_task else None,
        )
    except (ValueError, DataError) as e:
        raise SystemExit(f"compare-likelihood: {e}") from None
    samples = generate_rollouts(
        model, prompts, args.decode_mode, args.temperature, args.max_tokens, args.seed, tokenizer
    )
    if not samples:
        raise SystemExit("compare-likelihood: the engine returned no comparable samples")
    pad = tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0
    report = compare_samples(
        model,
        samples,
        pad_id=pad,
        decode_mode=args.decode_mode,
        max_passes=args.max_passes,
        temperature=args.temperature,
        micro_batch_size=args.micro_batch_size,
        state_formats_compared=tuple(args.state_formats),
    )
    report.update(checkpoint=str(args.checkpoint), task=args.task, difficulty=difficulty)
    print(format_comparison(report))
    _write_outputs(report, args.json_out, args.plot_out)
    return 0


def _load(checkpoint: str):
    """(the FBT, its tokenizer or None); exits naming a checkpoint that is not an FBT."""
    from transformers import AutoTokenizer

    from rl.model.files import load_fbt

    model = load_fbt(checkpoint).eval()
    if not hasattr(model, "multipass_forward"):
        raise SystemExit(
            f"compare-likelihood: {checkpoint} is not an FBT checkpoint "
            f"(model_type {model.config.model_type!r}); convert it first (fbrl convert)"
        )
    has_tokenizer = (Path(checkpoint) / "tokenizer_config.json").exists()
    return model, AutoTokenizer.from_pretrained(checkpoint) if has_tokenizer else None


def _write_outputs(report: dict, json_out: str | None, plot_out: str | None) -> None:
    from rl.atomic_files import write_text
    from rl.estimators.comparison import plot_report

    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        write_text(json_out, json.dumps(report, indent=2))
        print(f"wrote {json_out}")
    if plot_out:
        Path(plot_out).parent.mkdir(parents=True, exist_ok=True)
        plot_report(report, plot_out)
        print(f"wrote {plot_out}")
