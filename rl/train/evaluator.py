"""Accuracy / pass@k per decode mode, written against any engine with `.generate(prompts, params)`.

Owns: the evaluator. `decode_and_score` generates and scores completions a chunk at a time under both reads;
training's held-out eval (`rl.train.heldout`, through the rollout and reward workers) and `fbrl eval` (`evaluate` below,
through one engine; the CLI glue is `actors/cli/evaluate.py`) both use it. `evaluate` adds greedy and sampled
accuracy, pass@k, mean response length, truncation rate, the paired comparison of decode modes, and the JSON
layout; the statistics and the printed tables are rl/report/eval_stats.py.

The requests are `rl.samples.request.SamplingParams` (n, temperature, max_tokens, stop_token_ids, seed,
decode_mode), which every engine takes. The scorer follows the reward interface `(prompts, completions, answers,
finish_reasons=...) -> list[float]` so `rewards.math.MathReward` drops in; `plain_numeric_score` is the
fallback (last `\\boxed{}` compared numerically with the gold answer; a truncated response scores 0).
Every evaluation is also read leniently (`last_number_score`: the last number written anywhere in the response,
no anchor needed, truncated or not), so a gain that is only the answer format shows as a gap between the reads.

JSON layout: `{"meta": {...}, "modes": {mode: {"accuracy": {"greedy", "sampled"}, "lenient_accuracy": {"greedy",
"sampled"}, "pass_at_k": {"1", ...},
"mean_length": {"greedy", "sampled"}, "truncation_rate": {"greedy", "sampled"}, ...}}, "paired": [...],
"per_problem": {mode: {"greedy": [0/1 per problem], "sampled": [0/1, first sample], "greedy_lenient": [...],
"sampled_lenient": [...]}}}` — the per-problem
outcomes let two checkpoints evaluated on the same rows be paired too (`paired_tests`).
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from rl.report.eval_stats import optional_number, paired_tests, pass_at_k, pass_at_k_values
from rl.samples.request import SamplingParams

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


# A number written out: digits (thousands groups allowed), sign, decimal point; no operators, exponent or "inf".
_NUMBER = re.compile(r"[-+]?(?:(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]*)?|\.[0-9]+)")


def plain_numeric_score(
    prompts: Sequence[str],
    completions: Sequence[str],
    answers: Sequence[Any],
    finish_reasons: Sequence[str] | None = None,
    **_,
) -> list[float]:
    """1.0 when the last `\\boxed{...}` holds a number written out (digits, optional sign and decimal point; no
    expression, exponent or "inf") equal to the gold answer; truncated responses score 0."""
    reasons = finish_reasons or [None] * len(completions)
    out = []
    for text, gold, reason in zip(completions, answers, reasons):
        found = _BOXED.findall(text)
        got = found[-1].strip().rstrip(".").strip() if found else ""
        ok = False
        if _NUMBER.fullmatch(got) and reason not in ("length", "aborted"):
            try:
                ok = math.isclose(float(got.replace(",", "")), float(str(gold).strip()), rel_tol=0, abs_tol=1e-9)
            except ValueError:  # a gold that is not a number
                ok = False
        out.append(float(ok))
    return out


# The lenient read's numbers: digits with optional thousands groups and decimals, a minus sign only when it is not
# an operator between two numbers ("10-3" reads 10 and 3; "-3" alone reads -3).
_LAST_NUMBER = re.compile(r"(?<![\w.])-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?")


def last_number(text: str) -> float | None:
    """The value of the last number written in `text` (see `_LAST_NUMBER`), or None when it has none."""
    found = _LAST_NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def last_number_score(prompts: Sequence[str], completions: Sequence[str], answers: Sequence[Any], **_) -> list[float]:
    """The lenient read: 1.0 when the last number anywhere in the response equals the gold, whatever surrounds
    it — no `\\boxed{}` or "final answer" anchor, and a truncated response counts too."""
    out = []
    for text, gold in zip(completions, answers):
        got = last_number(text)
        try:
            ok = got is not None and math.isclose(
                got, float(str(gold).strip().replace(",", "")), rel_tol=0, abs_tol=1e-9
            )
        except ValueError:  # a gold that is not a number: the lenient read does not apply
            ok = False
        out.append(float(ok))
    return out


class Outcome(NamedTuple):
    """One scored completion."""

    correct: bool
    length: int
    truncated: bool
    lenient: bool  # right under the lenient read (`last_number_score`)
    text: str


def decode_and_score(
    generate: Callable,
    prompt_ids: list[list[int]],
    rows: list[dict],
    tokenizer,
    score: Callable,
    n: int = 1,
    chunk: int = 64,
    log=None,
    label: str = "",
) -> list | None:
    """Every prompt's n completions, generated and scored a chunk of prompts at a time; per prompt a list of
    `Outcome`s. `generate(chunk_ids, first_index) -> samples` (n per prompt, in order); `score(rows, texts,
    samples) -> [bool]` for the rows repeated n times, or None when the scorer has no notion of correct (then
    None is returned). With `log`, one progress line per chunk: a long evaluation is never silent for minutes."""
    out, t0 = [], time.perf_counter()
    for i in range(0, len(prompt_ids), chunk):
        ids = prompt_ids[i : i + chunk]
        samples = generate(ids, i)
        if len(samples) != n * len(ids):
            raise RuntimeError(f"engine returned {len(samples)} samples for {len(ids)} prompts x n={n}")
        texts = [tokenizer.decode(s.response_ids, skip_special_tokens=True) for s in samples]
        chunk_rows = [r for r in rows[i : i + chunk] for _ in range(n)]
        correct = score(chunk_rows, texts, samples)
        if correct is None:
            return None
        lenient = last_number_score([], texts, [r["answer"] for r in chunk_rows])
        for j in range(len(ids)):
            out.append(
                [
                    Outcome(bool(correct[k]), s.response_len, s.truncated, lenient[k] > 0.5, texts[k])
                    for k, s in enumerate(samples[j * n : (j + 1) * n], start=j * n)
                ]
            )
        if log and len(prompt_ids) > chunk:
            log(f"  {label}: {len(out)}/{len(prompt_ids)} problems ({time.perf_counter() - t0:.0f}s)")
    return out


def _run(engine, prompt_ids, rows, tokenizer, score_fn, batch_size, **fields):
    """`decode_and_score` for `evaluate`: the engine's own generate, a seed offset per chunk, scores > 0.5."""

    def generate(ids, first):
        seed = None if fields.get("seed") is None else fields["seed"] + first
        return engine.generate(ids, SamplingParams(**{**fields, "seed": seed}))

    def score(chunk_rows, texts, samples):
        scores = score_fn(
            [r["prompt"] for r in chunk_rows],
            texts,
            [r["answer"] for r in chunk_rows],
            finish_reasons=[s.finish_reason for s in samples],
        )
        return [x > 0.5 for x in scores]

    return decode_and_score(generate, prompt_ids, rows, tokenizer, score, n=fields["n"], chunk=batch_size)


def evaluate(
    engine,
    tokenizer,
    rows: list[dict],
    modes: Sequence[str],
    samples: int = 1,
    temperature: float = 1.0,
    max_tokens: int = 48,
    seed: int = 0,
    score_fn: Callable | None = None,
    batch_size: int = 64,
    log=None,
) -> dict:
    """Greedy (temperature 0) and `samples` sampled completions per problem in every decode mode."""
    score_fn = score_fn or plain_numeric_score
    # a chat-templated prompt already holds its special tokens (rl.data.loaders.encode_prompt)
    prompt_ids = [
        tokenizer(r["prompt"], add_special_tokens=not r.get("chat_templated", False))["input_ids"] for r in rows
    ]
    stop = (tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ()
    result = {
        "meta": {
            "n": len(rows),
            "samples": samples,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "seed": seed,
            "scorer": getattr(score_fn, "__name__", type(score_fn).__name__),
        },
        "modes": {},
        "paired": [],
    }
    per_mode = {}
    for mode in modes:
        t0 = time.time()
        common = dict(max_tokens=max_tokens, stop_token_ids=stop, decode_mode=mode)
        run = functools.partial(_run, engine, prompt_ids, rows, tokenizer, score_fn, batch_size, **common)
        greedy = run(n=1, temperature=0.0, seed=None)
        # samples=0: greedy only (the sampled figures are None, and there is no pass@k)
        sampled = run(n=samples, temperature=temperature, seed=seed) if samples > 0 else None
        result["modes"][mode] = dict(mode_metrics(greedy, sampled, samples), wall_s=round(time.time() - t0, 1))
        g = [grp[0] for grp in greedy]
        per_mode[mode] = {"greedy": [int(s.correct) for s in g], "greedy_lenient": [int(s.lenient) for s in g]}
        if sampled:
            per_mode[mode]["sampled"] = [int(grp[0].correct) for grp in sampled]
            per_mode[mode]["sampled_lenient"] = [int(grp[0].lenient) for grp in sampled]
        if log:
            acc, len_acc = result["modes"][mode]["accuracy"], result["modes"][mode]["lenient_accuracy"]
            log(
                f"{mode}: greedy {acc['greedy']:.3f} sampled {optional_number(acc['sampled'])} | lenient: greedy "
                f"{len_acc['greedy']:.3f} sampled {optional_number(len_acc['sampled'])} ({result['modes'][mode]['wall_s']}s)"
            )
    result["per_problem"] = per_mode
    modes = list(modes)
    for i, a in enumerate(modes):
        for b in modes[i + 1 :]:
            result["paired"] += paired_tests(per_mode[a], per_mode[b], a, b)
    return result


def mode_metrics(greedy: list[list[Outcome]], sampled: list[list[Outcome]] | None, samples: int) -> dict:
    """One decode mode's figures from its scored completions (greedy: one per problem; sampled: `samples` each,
    or None): accuracy under both reads, pass@k, mean length and truncation rate, greedy and sampled."""
    g = [grp[0] for grp in greedy]
    flat = [s for grp in sampled for s in grp] if sampled else []
    correct_counts = [sum(s.correct for s in grp) for grp in sampled] if sampled else []

    def mean(xs):
        return sum(xs) / len(xs) if xs else None

    def both(read):
        return {"greedy": mean([read(s) for s in g]), "sampled": mean([read(s) for s in flat])}

    return {
        "accuracy": both(lambda s: s.correct),
        "lenient_accuracy": both(lambda s: s.lenient),
        "pass_at_k": {
            str(k): mean([pass_at_k(samples, c, k) for c in correct_counts])
            for k in (pass_at_k_values(samples) if samples > 0 else [])
        },
        "mean_length": both(lambda s: s.length),
        "truncation_rate": both(lambda s: s.truncated),
    }
