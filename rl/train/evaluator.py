"""Accuracy / pass@k per decode mode, written against any engine with `.generate(prompts, params)`.

Owns: the evaluator. `decode_and_score` generates and scores completions a chunk at a time under both reads;
training's held-out eval (`rl.train.heldout`, through the rollout and reward workers) and `fbrl eval` (`evaluate` below,
through one engine; the CLI glue is `actors/cli/evaluate.py`) both use it. `evaluate` adds greedy and sampled
accuracy, the unbiased pass@k estimator, mean response length, truncation rate, the paired comparison of
decode modes (McNemar's exact test), the printed table, and the JSON layout.

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

import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

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


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k) (Chen et al., 2021)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for discordant counts b (A right, B wrong) and c (A wrong, B right).

    Under H0 each discordant pair goes either way with probability 1/2: p = 2 * P(Binom(b+c, 1/2) <= min(b, c)),
    capped at 1.
    """
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def _ks(samples: int) -> list[int]:
    ks = [1]
    while ks[-1] * 2 <= samples:
        ks.append(ks[-1] * 2)
    return ks + ([samples] if ks[-1] != samples else [])


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
        greedy = _run(
            engine,
            prompt_ids,
            rows,
            tokenizer,
            score_fn,
            batch_size,
            n=1,
            temperature=0.0,
            seed=None,
            **common,
        )
        # samples=0: greedy only (the sampled figures are None, and there is no pass@k)
        sampled = (
            _run(
                engine,
                prompt_ids,
                rows,
                tokenizer,
                score_fn,
                batch_size,
                n=samples,
                temperature=temperature,
                seed=seed,
                **common,
            )
            if samples > 0
            else None
        )
        g = [grp[0] for grp in greedy]
        flat = [s for grp in sampled for s in grp] if sampled else []
        correct_counts = [sum(s.correct for s in grp) for grp in sampled] if sampled else []
        mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
        result["modes"][mode] = {
            "accuracy": {"greedy": mean([s.correct for s in g]), "sampled": mean([s.correct for s in flat])},
            "lenient_accuracy": {"greedy": mean([s.lenient for s in g]), "sampled": mean([s.lenient for s in flat])},
            "pass_at_k": {
                str(k): mean([pass_at_k(samples, c, k) for c in correct_counts])
                for k in (_ks(samples) if samples > 0 else [])
            },
            "mean_length": {"greedy": mean([s.length for s in g]), "sampled": mean([s.length for s in flat])},
            "truncation_rate": {"greedy": mean([s.truncated for s in g]), "sampled": mean([s.truncated for s in flat])},
            "wall_s": round(time.time() - t0, 1),
        }
        per_mode[mode] = {"greedy": [int(s.correct) for s in g], "greedy_lenient": [int(s.lenient) for s in g]}
        if sampled:
            per_mode[mode]["sampled"] = [int(grp[0].correct) for grp in sampled]
            per_mode[mode]["sampled_lenient"] = [int(grp[0].lenient) for grp in sampled]
        if log:
            acc, len_acc = result["modes"][mode]["accuracy"], result["modes"][mode]["lenient_accuracy"]
            log(
                f"{mode}: greedy {acc['greedy']:.3f} sampled {_f(acc['sampled'])} | lenient: greedy "
                f"{len_acc['greedy']:.3f} sampled {_f(len_acc['sampled'])} ({result['modes'][mode]['wall_s']}s)"
            )
    result["per_problem"] = per_mode
    modes = list(modes)
    for i, a in enumerate(modes):
        for b in modes[i + 1 :]:
            result["paired"] += paired_tests(per_mode[a], per_mode[b], a, b)
    return result


def _f(x, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def paired_tests(a: dict, b: dict, name_a: str, name_b: str) -> list[dict]:
    """McNemar's exact test of two evaluations of the same problems, greedy and (when both sampled) first sample.

    `a` / `b` are `result["per_problem"][mode]` ({"greedy": [0/1 per problem], "sampled": [...]}), from one
    checkpoint's modes or from two checkpoints evaluated on the same rows (`fbrl eval --baseline`)."""
    out = []
    for which in [w for w in ("greedy", "sampled", "greedy_lenient", "sampled_lenient") if w in a and w in b]:
        xa, xb = a[which], b[which]
        if len(xa) != len(xb):
            raise ValueError(
                f"paired test {name_a} vs {name_b}: {len(xa)} and {len(xb)} problems; "
                f"a paired test needs the same problems"
            )
        a_only = sum(p and not q for p, q in zip(xa, xb))
        b_only = sum(q and not p for p, q in zip(xa, xb))
        out.append(
            {
                "a": name_a,
                "b": name_b,
                "which": which,
                "a_only": a_only,
                "b_only": b_only,
                "p_value": mcnemar_exact(a_only, b_only),
            }
        )
    return out


def format_table(result: dict) -> str:
    """The printed summary: one row per decode mode, then the paired comparisons."""
    meta = result["meta"]
    ks = list(next(iter(result["modes"].values()))["pass_at_k"]) if result["modes"] else []
    head = (
        f"{'mode':<9} {'greedy':>7} {'sampled':>8} {'greedy~':>7} {'sampled~':>8} "
        + " ".join(f"{'pass@' + k:>8}" for k in ks)
        + f" {'len(g)':>7} {'len(s)':>7} {'trunc(g)':>8} {'trunc(s)':>8}"
    )
    lines = [
        f"n={meta['n']} samples={meta['samples']} T={meta['temperature']} scorer={meta['scorer']} "
        f"(~: lenient read, the last number in the response)",
        head,
        "-" * len(head),
    ]
    for mode, m in result["modes"].items():
        lenient = m.get("lenient_accuracy", {"greedy": None, "sampled": None})
        lines.append(
            f"{mode:<9} {m['accuracy']['greedy']:>7.3f} {_f(m['accuracy']['sampled']):>8} "
            f"{_f(lenient['greedy']):>7} {_f(lenient['sampled']):>8} "
            + " ".join(f"{m['pass_at_k'][k]:>8.3f}" for k in ks)
            + f" {m['mean_length']['greedy']:>7.1f} {_f(m['mean_length']['sampled'], '.1f'):>7}"
            + f" {m['truncation_rate']['greedy']:>8.3f} {_f(m['truncation_rate']['sampled']):>8}"
        )
    if result["paired"]:
        lines.append("paired (McNemar exact): a_only = problems only a solves, b_only = only b")
        for p in result["paired"]:
            lines.append(
                f"  {p['a']} vs {p['b']} ({p['which']}): a_only={p['a_only']} b_only={p['b_only']} p={p['p_value']:.4g}"
            )
    return "\n".join(lines)


def format_levels(results: dict[str, dict], which: str = "greedy") -> str:
    """One line per difficulty level: accuracy per mode (and baseline mode), then each paired test's
    difference in points and McNemar p (`fbrl eval --by-difficulty`)."""
    if not results:
        return ""
    first = next(iter(results.values()))
    modes = list(first["modes"])
    pairs = [(p["a"], p["b"]) for p in first["paired"] if p["which"] == which]
    head = "| level | n | " + " | ".join(modes + [f"{a} − {b} (points, p)" for a, b in pairs]) + " |"
    lines = [f"{which} accuracy by level", head, "|" + "---|" * (2 + len(modes) + len(pairs))]
    for level, res in results.items():
        accs = [f"{res['modes'][m]['accuracy'][which]:.3f}" for m in modes]
        diffs = []
        for p in res["paired"]:
            if p["which"] == which:
                d = 100 * (res["modes"][p["a"]]["accuracy"][which] - res["modes"][p["b"]]["accuracy"][which])
                diffs.append(f"{d:+.1f}, p={p['p_value']:.2g}")
        lines.append(f"| {level} | {res['meta']['n']} | " + " | ".join(accs + diffs) + " |")
    return "\n".join(lines)
