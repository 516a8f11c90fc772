"""Does a task give RL signal at step 0? Sampled and greedy accuracy of a checkpoint on word-problem variants.

    python scripts/smollm_signal.py --checkpoint runs/smollm2/fbt-identity --config configs/smollm_rl.yaml \\
        --greedy-n 300
    python scripts/smollm_signal.py --checkpoint runs/smollm2/fbt-identity \\
        --variant 1,2:small:1 --variant 1,2:standard:2 --temperature 0.7 1.0 --n 64 --samples 4 --greedy-n 300

One vLLM CPU engine (soft mode, the training engine) is loaded once; for each variant (`LEVELS:NUMBERS:SHOTS`,
e.g. `1,2:small:1`: levels, number size, worked examples) and temperature it samples `--samples` completions for
`--n` training problems — what a step of RL sees — and scores them with the math reward (the anchored answer, as
in training) and with the lenient read (the last number in the response). `--greedy-n` held-out (test split)
problems of the first variant are then decoded greedily under both reads. Prompts, chat template, stop token and
response cap are those of `fbrl train`; `--config` takes the variant, temperature, samples per prompt and
response cap from an RL config (what its step 0 samples). Prints one line per measurement and writes them all to
`--json`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_variant(text: str) -> tuple[list[int], str, int]:
    """'1,2:small:1' -> ([1, 2], 'small', 1): levels, number size, worked examples in the prompt (default 2)."""
    levels, numbers, shots = (text.split(":") + ["standard", "2"])[:3]
    try:
        return [int(x) for x in levels.split(",")], numbers or "standard", int(shots)
    except ValueError:
        raise SystemExit(f"--variant: expected LEVELS:NUMBERS:SHOTS such as 1,2:small:1, got {text!r}") from None


def rows_for(levels, numbers, shots, split, n, tokenizer, seed=0):
    from rl.config import config_from_dict
    from rl.data.loaders import load_task_split

    data = config_from_dict(
        {
            "data": {
                "task": "word_problems",
                "difficulty": levels,
                "numbers": numbers,
                "shots": shots,
                "seed": seed,
                "chat_template": "auto",
            }
        }
    ).data
    return load_task_split(data, split, n=n, tokenizer=tokenizer)


def measure(engine, tokenizer, rows, scorer, *, samples, temperature, max_tokens, seed=0, batch=64) -> dict:
    """Accuracy of `samples` completions per row (temperature 0: one greedy completion) under both reads."""
    from rl.data.loaders import encode_prompt
    from rl.samples.request import SamplingParams
    from rl.train.evaluator import last_number_score

    n = 1 if temperature == 0 else samples
    strict, lenient, lengths, truncated, solved = [], [], [], [], []
    t0 = time.time()
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        params = SamplingParams(
            n=n,
            temperature=temperature,
            max_tokens=max_tokens,
            seed=seed + i,
            stop_token_ids=(tokenizer.eos_token_id,),
            decode_mode="soft",
        )
        out = engine.generate([encode_prompt(tokenizer, r) for r in chunk], params)
        texts = [tokenizer.decode(s.response_ids, skip_special_tokens=True) for s in out]
        golds = [r["answer"] for r in chunk for _ in range(n)]
        s = scorer(
            [r["prompt"] for r in chunk for _ in range(n)], texts, golds, finish_reasons=[o.finish_reason for o in out]
        )
        strict += [x > 0.5 for x in s]
        lenient += [x > 0.5 for x in last_number_score([], texts, golds)]
        lengths += [o.response_len for o in out]
        truncated += [o.truncated for o in out]
        solved += [any(x > 0.5 for x in s[j * n : (j + 1) * n]) for j in range(len(chunk))]
    mean = lambda xs: round(sum(xs) / len(xs), 4)  # noqa: E731
    return {
        "strict": mean(strict),
        "lenient": mean(lenient),
        "mean_length": round(sum(lengths) / len(lengths), 1),
        "truncated": mean(truncated),
        "groups_with_a_right_answer": mean(solved),
        "n_rows": len(rows),
        "samples": n,
        "wall_s": round(time.time() - t0, 1),
        "example": texts[0],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True, help="an FBT checkpoint (e.g. the identity-converted model)")
    ap.add_argument(
        "--variant",
        action="append",
        default=None,
        help="LEVELS:NUMBERS:SHOTS, repeatable (1,2:small:1; shots default 2)",
    )
    ap.add_argument("--config", default=None, help="an RL config: its task, temperature, samples and max_tokens")
    ap.add_argument("--temperature", type=float, nargs="+", default=None, help="(default 1.0)")
    ap.add_argument("--n", type=int, default=64, help="training problems per sampled measurement")
    ap.add_argument("--samples", type=int, default=None, help="completions per problem (default 4)")
    ap.add_argument("--max-tokens", type=int, default=None, help="(default 96)")
    ap.add_argument(
        "--greedy-n", type=int, default=0, help="held-out problems decoded greedily, for the first variant (0: skip)"
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    variants = [parse_variant(v) for v in (args.variant or [])]
    if args.config:
        from rl.config import load_config

        cfg = load_config(args.config)
        variants = variants or [(list(cfg.data.difficulty), cfg.data.numbers, cfg.data.shots)]
        args.temperature = args.temperature or [cfg.rollout.temperature]
        args.samples = args.samples or cfg.rollout.n_samples_per_prompt
        args.max_tokens = args.max_tokens or cfg.rollout.max_tokens
    variants = variants or [([1, 2], "standard", 2)]
    args.temperature, args.samples, args.max_tokens = (
        args.temperature or [1.0],
        args.samples or 4,
        args.max_tokens or 96,
    )

    from transformers import AutoTokenizer

    from rewards.math import MathReward
    from rl.data.loaders import encode_prompt
    from rollout.vllm_engine import VLLMEngine

    t0 = time.time()
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    engine = VLLMEngine(
        args.checkpoint, decode_mode="soft", max_model_len=512, kv_cache_gib=2, max_num_seqs=64, dtype="float32"
    )
    scorer = MathReward(in_process=True)
    print(f"engine ready in {time.time() - t0:.0f}s", flush=True)
    results = []
    for k, (levels, numbers, shots) in enumerate(variants):
        runs = [("train", args.n, t) for t in args.temperature] + (
            [("test", args.greedy_n, 0.0)] if args.greedy_n and k == 0 else []
        )
        for split, n, temperature in runs:
            rows = rows_for(levels, numbers, shots, split, n, tokenizer)
            prompt_tokens = sum(len(encode_prompt(tokenizer, r)) for r in rows) / len(rows)
            print(
                f"  measuring levels {levels} numbers {numbers} shots {shots} {split} T={temperature} ...", flush=True
            )
            r = measure(
                engine,
                tokenizer,
                rows,
                scorer,
                samples=args.samples,
                temperature=temperature,
                max_tokens=args.max_tokens,
            )
            r.update(
                levels=levels,
                numbers=numbers,
                shots=shots,
                split=split,
                temperature=temperature,
                prompt_tokens=round(prompt_tokens, 1),
            )
            results.append(r)
            print(
                f"levels {levels} numbers {numbers:<8} shots {shots} ({prompt_tokens:.0f} prompt tokens) "
                f"{split:<5} T={temperature:<3} n={r['n_rows']}x{r['samples']}:"
                f" strict {r['strict']:.3f} lenient {r['lenient']:.3f} | groups with a right answer "
                f"{r['groups_with_a_right_answer']:.2f} | len {r['mean_length']} trunc {r['truncated']:.2f} "
                f"({r['wall_s']}s)",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
