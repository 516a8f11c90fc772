"""rewards.math — the rule-based math reward (math-verify, gold parsed first, answer anchor required).

Owns: the per-item scorer `score_completion` that runs inside a pool worker (or in-process), `MathReward` (the
batch reward used by training and as the math tasks' correctness check), `math_reward` (the same as a plain
function with default settings) and `format_reward`. Where the answer of a completion is, and how answer text is
normalised, is `rewards.answer` (the anchor rules; docs/REWARDS.md states them for users).

Scoring one completion against its gold:
  * Truncated responses (`finish_reasons[i]` is "length" or "aborted") score 0 before any parsing: a cut-off
    response must not be rewarded for an answer it boxed earlier and might have revised.
  * No anchored answer: 0 (`no_answer`).
  * Gold answers are normalised like predictions, parsed first, and compared as `verify(gold, pred)`
    (math-verify's comparison is not symmetric). A gold without `$` or `\\boxed` is read as bare LaTeX, wrapped
    in `\\boxed{}` ("\\frac{1}{2}", "[0,1)", "\\{1,2\\}", "-7"), except a plain number, which is read the way
    math-verify reads numbers: a comma before exactly three digits groups thousands ("1,000"), any other comma
    is a decimal comma ("1,22" is 1.22, "0,111" is 0.111). Answers that are not strings are `str()`-ed.
  * A gold that parses only to a string (math-verify then compares text), or to a plain number although its text
    names a symbol or constant (e.g. a unit-like `\\mathrm{i}` stripped), is still scored but counted
    (`gold_string_only`, `gold_lost_symbols`) and logged: it usually means the dataset's answer column needs a
    look.
  * `strict=True` (config: `options: {strict: true}`): when the gold is a number written out (integer, decimal,
    fraction), the answer must be a number written out too, of equal value, and an integer gold needs an integer
    (`rewards.answer.literal_value`): `\\boxed{17*23}` or the question copied into the box score 0 (`not_literal`)
    where math-verify would evaluate them. Such items are compared exactly, in-process, without math-verify.
    Golds that are not plain numbers keep math-verify's semantics. The arithmetic task uses strict scoring.

Gold parses are cached per process (`_parse_gold`), since every sample of a GRPO group shares one gold.
"""

from __future__ import annotations

import functools
import logging
import math as _math
import re
import threading
from collections.abc import Sequence
from typing import Any

from rewards.answer import extract_answer, literal_equal, literal_value, normalize, strip_trailing_punctuation
from rewards.base import RewardResult

log = logging.getLogger(__name__)

# Statuses of one scored item. Only `correct` scores 1.
CORRECT, WRONG, NO_ANSWER, TRUNCATED, NOT_LITERAL = "correct", "wrong", "no_answer", "truncated", "not_literal"
GOLD_UNPARSED, TIMEOUT, ERROR = "gold_unparsed", "timeout", "error"
# Notes on a gold (the item is still scored): counted and logged so a bad answer column is seen.
GOLD_STRING_ONLY, GOLD_LOST_SYMBOLS = "gold_string_only", "gold_lost_symbols"
UNFINISHED_REASONS = ("length", "aborted")

_THOUSANDS_GOLD_RE = re.compile(r"[-+]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?")
_DECIMAL_COMMA_GOLD_RE = re.compile(r"[-+]?\d+,\d+")
# For the lost-symbol note: text-like groups and unit words are not symbols; `\mathrm{x}` of one letter may be.
_TEXT_GROUP_RE = re.compile(
    r"\\(?:text\w*|mbox|mathrm|operatorname)\s*\{\s*[A-Za-z]{2,}[^{}]*\}|"
    r"\\(?:text\w*|mbox)\s*\{[^{}]*\}"
)


def plain_number_gold(gold: str) -> str | None:
    """A bare gold that is a plain number, with its comma read as math-verify reads it; None otherwise."""
    if _THOUSANDS_GOLD_RE.fullmatch(gold):
        return gold.replace(",", "")
    if _DECIMAL_COMMA_GOLD_RE.fullmatch(gold):
        return gold.replace(",", ".")
    return None


_GSM8K_FINAL_RE = re.compile(r"^####\s*(.+?)\s*$", re.M)


def gold_text(gold: Any) -> str:
    """The text of a gold answer as it is parsed (see the module docstring). A whole GSM8K solution (worked steps,
    then `#### 72`: the `answer` column of openai/gsm8k as it comes) is read as its final line's answer."""
    g = str(gold).strip()
    final = _GSM8K_FINAL_RE.findall(g)
    if final:
        g = final[-1]
    # Delimited LaTeX (an unescaped `$`) or a whole solution with a box: math-verify finds the answer in it.
    if re.search(r"(?<!\\)\$", g) or "\\boxed" in g:
        return normalize(g, strip_dollars=False)
    g = strip_trailing_punctuation(normalize(g))
    return plain_number_gold(g) or "\\boxed{" + g + "}"


def _gold_note(text: str, parsed: tuple) -> str:
    exprs = [p for p in parsed if not isinstance(p, str)]
    if not exprs:
        return GOLD_STRING_ONLY
    expr = exprs[0]
    if not (getattr(expr, "is_Number", False) and expr.is_finite):
        return ""
    t = _TEXT_GROUP_RE.sub(" ", text.split("=")[-1])
    named = re.search(r"\\(?:pi|infty)\b", t) is not None
    t = re.sub(r"\\[A-Za-z]+", " ", t.replace("\\boxed", " "))
    if named or re.search(r"(?<![A-Za-z])[A-Za-z](?![A-Za-z])", t):
        return GOLD_LOST_SYMBOLS
    return ""


def _extraction_config():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    # The answer is already isolated and wrapped in \boxed{}: match the box first, plain expressions as fallback.
    return [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]


@functools.lru_cache(maxsize=8192)
def _parse_gold(text: str, parse_timeout_s: int) -> tuple:
    from math_verify import parse

    return tuple(
        parse(text, extraction_config=_extraction_config(), parsing_timeout=parse_timeout_s, raise_on_error=True)
    )


def score_literal(gold: Any, completion: str, max_answer_chars: int = 512) -> tuple[float, str, str] | None:
    """Strict scoring without math-verify when the gold is a number written out; None when it is not."""
    g = str(gold).strip()
    if "\\boxed" in g:  # a whole solution, not a number
        return None
    bare = re.search(r"(?<!\\)\$", g) is None  # inside `$...$` a comma separates items, as in the answer
    g = strip_trailing_punctuation(normalize(g))
    g = (plain_number_gold(g) if bare else None) or g
    if literal_value(g) is None:
        return None
    answer = extract_answer(completion, max_answer_chars)
    if answer is None:
        return 0.0, NO_ANSWER, ""
    if literal_equal(g, normalize(answer)):
        return 1.0, CORRECT, ""
    kind = literal_value(normalize(answer))
    right_kind = kind is not None and (kind[0] == "int" or literal_value(g)[0] != "int")
    return 0.0, (WRONG if right_kind else NOT_LITERAL), ""


def score_completion(
    gold: Any, completion: str, max_answer_chars: int = 512, mv_timeout_s: int | None = 3, strict: bool = False
) -> tuple[float, str, str]:
    """Score one completion against its gold answer: (1.0, "correct", note) or (0.0, reason, note).

    `note` is "" or a note on the gold (`gold_string_only`, `gold_lost_symbols`). Runs where math-verify's
    signal-based timeouts work: a pool worker's main thread, or the main thread of an in-process caller. Pass
    mv_timeout_s=None off the main thread (no soft timeout; the pool's hard timeout is the protection there).
    math-verify timeouts are whole seconds (signal.alarm).
    """
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException

    note = ""
    try:
        if strict:
            literal = score_literal(gold, completion, max_answer_chars)
            if literal is not None:
                return literal
        answer = extract_answer(completion, max_answer_chars)
        if answer is None:
            return 0.0, NO_ANSWER, note
        text = gold_text(gold)
        gold_parsed = list(_parse_gold(text, mv_timeout_s))
        if not gold_parsed:
            return 0.0, GOLD_UNPARSED, note
        note = _gold_note(text, tuple(gold_parsed))
        pred = parse(
            "\\boxed{" + normalize(answer) + "}",
            extraction_config=_extraction_config(),
            parsing_timeout=mv_timeout_s,
            raise_on_error=True,
        )
        if not pred:
            return 0.0, NO_ANSWER, note
        # Gold first: verify(gold, pred) is not symmetric. Pair by pair (what verify does over the lists) so a
        # soft timeout is counted as a timeout while an error comparing one pair only fails that pair.
        timed_out = False
        for g in gold_parsed:
            for p in pred:
                try:
                    if verify(g, p, timeout_seconds=mv_timeout_s, raise_on_error=True):
                        return 1.0, CORRECT, note
                except TimeoutException:
                    timed_out = True
                except Exception:
                    continue
        return (0.0, TIMEOUT, note) if timed_out else (0.0, WRONG, note)
    except TimeoutException:
        return 0.0, TIMEOUT, note
    except Exception as e:  # a parser bug on odd input must cost this item only
        log.debug("math reward error: %s: %s", type(e).__name__, e)
        return 0.0, ERROR, note


# What a pool worker for the math reward imports before it is ready. With forkserver these are imported in the
# fork server, and `rewards._warm_math` runs `warm_worker` there once, so every worker (and every replacement of
# a killed one) is forked already warm instead of paying ~1 s of imports and first parses.
WORKER_PRELOAD = ("rewards.math", "math_verify", "sympy", "rewards._warm_math")

# One answer of each common kind: the first parse of a kind builds parser tables and sympy caches (~0.1 s each).
_WARM_CASES = (
    ("1", "\\boxed{1}"),
    ("\\frac{1}{2}", "\\boxed{\\dfrac{2}{4}}"),
    ("2\\sqrt{3}", "\\boxed{\\sqrt{12}}"),
    ("[-1, 2)", "\\boxed{[-1,2)}"),
    ("\\{1,2\\}", "\\boxed{\\{2, 1\\}}"),
    ("x^2+3x+2", "\\boxed{(x+1)(x+2)}"),
    ("0.25", "The final answer is $\\frac{1}{4}$."),
    ("-7", "\\boxed{-8}"),
)


def warm_worker() -> None:
    """Score one answer of each common kind, so first-parse costs are not charged to an item's timeout."""
    for gold, completion in _WARM_CASES:
        score_completion(gold, completion)
    _parse_gold.cache_clear()  # warm tables, not a cache of golds nobody asked for


def _finish_reasons(n: int, row_fields: dict) -> list:
    reasons = row_fields.get("finish_reasons", row_fields.get("finish_reason"))
    if reasons is None:
        return [None] * n
    reasons = list(reasons)
    if len(reasons) != n:
        raise ValueError(f"finish_reasons has {len(reasons)} entries for {n} completions")
    return reasons


def _result(scores: list[float], statuses: list[str], notes: list[str]) -> RewardResult:
    counts = {s: statuses.count(s) for s in (NO_ANSWER, TRUNCATED, GOLD_UNPARSED, WRONG, NOT_LITERAL)}
    counts.update({k: notes.count(k) for k in (GOLD_STRING_ONLY, GOLD_LOST_SYMBOLS)})
    return RewardResult(
        scores,
        errors=statuses.count(ERROR) + statuses.count(GOLD_UNPARSED),
        timeouts=statuses.count(TIMEOUT),
        counts=counts,
    )


class MathReward:
    """`(prompts, completions, answers, finish_reasons=None, **row_fields) -> RewardResult` with math-verify.

    By default items are scored in a `RewardPool` (hard per-item timeout `timeout_s`, `num_workers` processes,
    started on first use), which is safe from any thread, asyncio loop or Ray actor. `in_process=True` scores
    serially in the caller: math-verify's own (signal) timeouts are used on the main thread and turned off on
    other threads — never the silent zero that math-verify's "threaded environment" error gives elsewhere, but
    also no protection against a hang, so in_process is for debugging and the serial benchmark.

    `batch_timeout_s` bounds a whole call in the pool: items not started by then score 0 as timeouts.

    In the pool, identical (gold, completion) pairs are scored once, and items are keyed by gold so that a
    group's samples land on one worker and its gold is parsed once there. With `strict=True`, items whose gold
    is a literal number never reach the pool: they are compared exactly in the caller (regular expressions on
    at most `max_answer_chars` characters, nothing that can hang).
    """

    def __init__(
        self,
        pool=None,
        *,
        num_workers: int = 2,
        timeout_s: float = 10.0,
        in_process: bool = False,
        max_answer_chars: int = 512,
        mv_timeout_s: int | None = None,
        strict: bool = False,
        batch_timeout_s: float | None = 300.0,
    ):
        self.__name__ = "math"
        self.timeout_s = float(timeout_s)
        self.batch_timeout_s = batch_timeout_s
        self.num_workers = num_workers
        self.in_process = in_process
        self.max_answer_chars = max_answer_chars
        self.strict = bool(strict)
        # math-verify's soft timeouts (whole seconds) sit below the hard one, so the usual slow item ends softly
        # (cheap) and the kill is kept for code stuck in C (e.g. a giant integer power).
        self.mv_timeout_s = mv_timeout_s if mv_timeout_s is not None else max(1, int(self.timeout_s // 3))
        self._pool = pool
        self._own_pool = pool is None
        self._lock = threading.Lock()

    @property
    def pool(self):
        with self._lock:
            if self._pool is None:
                from rewards.pool import RewardPool

                self._pool = RewardPool(
                    num_workers=self.num_workers, timeout_s=self.timeout_s, preload=WORKER_PRELOAD, init=warm_worker
                )
            return self._pool

    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], answers: Sequence[Any], **row_fields
    ) -> RewardResult:
        n = len(completions)
        if len(answers) != n:
            raise ValueError(f"math reward got {n} completions but {len(answers)} answers")
        reasons = _finish_reasons(n, row_fields)
        scores, statuses, notes = [0.0] * n, [TRUNCATED] * n, [""] * n
        todo = []
        for i in range(n):
            if reasons[i] in UNFINISHED_REASONS:
                continue
            if answers[i] is None:  # a row without a gold is a data error, not a wrong answer
                statuses[i] = GOLD_UNPARSED
                continue
            literal = score_literal(answers[i], completions[i], self.max_answer_chars) if self.strict else None
            if literal is not None:
                scores[i], statuses[i], notes[i] = literal
                continue
            todo.append(i)
        if self.in_process:
            on_main = threading.current_thread() is threading.main_thread()
            for i in todo:
                scores[i], statuses[i], notes[i] = score_completion(
                    str(answers[i]), completions[i], self.max_answer_chars, self.mv_timeout_s if on_main else None
                )
        elif todo:
            # Identical (gold, completion) pairs are scored once: a small policy often repeats itself in a group.
            unique: dict[tuple[str, str], list[int]] = {}
            for i in todo:
                unique.setdefault((str(answers[i]), completions[i]), []).append(i)
            items = [(g, c, self.max_answer_chars, self.mv_timeout_s) for g, c in unique]
            # Keyed by gold: a group's samples go to one worker, which parses that gold once (a third of the work).
            results = self.pool.map(score_completion, items, keys=[g for g, _ in unique], budget_s=self.batch_timeout_s)
            for idx, res in zip(unique.values(), results):
                if res.status == "ok":
                    got = res.value
                else:  # hard timeout, worker crash or an exception escaping the scorer
                    got = (0.0, TIMEOUT if res.status == "timeout" else ERROR, "")
                for i in idx:
                    scores[i], statuses[i], notes[i] = got
        out = _result([float(s) if _math.isfinite(s) else 0.0 for s in scores], statuses, notes)
        if out.errors or out.timeouts:
            log.warning(
                "math reward: %d of %d samples scored 0 for an error (%d golds that do not parse) and %d for a timeout",
                out.errors,
                n,
                out.counts[GOLD_UNPARSED],
                out.timeouts,
            )
        noted = sorted({str(answers[i]) for i in range(n) if notes[i]})
        if noted:
            log.warning(
                "math reward: %d gold answers parse only to text or to a number without the symbols they "
                "name (scored anyway; check the answer column): %s",
                len(noted),
                ", ".join(repr(g[:60]) for g in noted[:3]) + (" ..." if len(noted) > 3 else ""),
            )
        return out

    def close(self) -> None:
        if self._own_pool and self._pool is not None:
            self._pool.close()
            self._pool = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


_DEFAULT: MathReward | None = None
_DEFAULT_LOCK = threading.Lock()


def math_reward(
    prompts: Sequence[str], completions: Sequence[str], answers: Sequence[Any], **row_fields
) -> RewardResult:
    """The math reward as a plain function (`rewards.math:math_reward` in config): a process-wide
    `MathReward()` with default settings, whose pool starts on the first call."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = MathReward()
    return _DEFAULT(prompts, completions, answers, **row_fields)


def format_reward(
    prompts: Sequence[str], completions: Sequence[str], answers: Sequence[Any], **row_fields
) -> list[float]:
    """1.0 when a finished completion carries an answer anchor (see the module docstring), else 0.0.

    Cheap (no sympy): runs in-process. Meant as a small-weight shaping term beside `MathReward`.
    """
    reasons = _finish_reasons(len(completions), row_fields)
    return [
        0.0 if r in UNFINISHED_REASONS else float(extract_answer(c) is not None) for c, r in zip(completions, reasons)
    ]
