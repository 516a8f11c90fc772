"""rewards.math — the rule-based math reward (math-verify, gold parsed first, answer anchor required).

Owns: answer extraction (the anchor rules below), the per-item scorer `score_completion` that runs inside a
pool worker (or in-process), `MathReward` (the batch reward used by training, also for the embedded arithmetic
task whose answers are integers and whose completions end with `\\boxed{N}`), `math_reward` (the same as a plain
function with default settings) and `format_reward`.

Anchor rules (a completion without an anchor scores 0, however correct its reasoning):
  * `\\boxed{...}`: the LAST `\\boxed{` in the completion is the answer, like most graders (MATH, Minerva, PRM800K
    tooling): a model that boxes 3, then corrects itself and boxes 5, answered 5. If that last box does not
    close, or its content is longer than `max_answer_chars`, there is no answer (an earlier box is NOT used:
    it would reward a retracted answer). Answers with several parts go in one box (`\\boxed{1, 2}`).
  * "final answer is X" / "final answer: X" (case-insensitive, markdown `**` allowed): X is the rest of that
    line (or the next non-empty line), without a trailing "I hope it is correct." and without `$`/`\\(`
    delimiters.
  * When both appear, the anchor that starts last in the text wins ("...\\boxed{3}. The final answer is 5").
  * Text such as "so x = 5" or "the answer to part one is 5" is not an anchor.

Truncated responses (`finish_reasons[i]` is "length" or "aborted") score 0 before any parsing: a cut-off
response must not be rewarded for an answer it boxed earlier and might have revised.

Gold answers are parsed first and verified as `verify(gold, pred)` (math-verify's comparison is not symmetric).
Gold strings without `$` or `\\boxed` are wrapped as `\\boxed{gold}` so bare LaTeX ("\\frac{1}{2}", "[0,1)",
"\\{1,2\\}") and integers ("42", "-7") parse the same way; answers that are not strings are `str()`-ed.
Gold parses are cached per process (`_parse_gold`), since every sample of a GRPO group shares one gold.
"""

from __future__ import annotations

import functools
import logging
import math as _math
import re
import threading
from typing import Any, Sequence

from rewards.base import RewardResult

log = logging.getLogger(__name__)

# Statuses of one scored item. Only `correct` scores 1.
CORRECT, WRONG, NO_ANSWER, TRUNCATED = "correct", "wrong", "no_answer", "truncated"
GOLD_UNPARSED, TIMEOUT, ERROR = "gold_unparsed", "timeout", "error"
UNFINISHED_REASONS = ("length", "aborted")

_BOX_RE = re.compile(r"\\boxed\s*\{")
# "final answer is X", "Final Answer: X", "**Final Answer:** X" — requires "is" or ":" right after, so that
# "the final answer will follow" is not an anchor.
_FINAL_RE = re.compile(r"final\s+answer\b[*\s]{0,8}(?:is\b[*\s]{0,8}:?|:)[*\s]{0,8}", re.IGNORECASE)
_HOPE_RE = re.compile(r"\s*I hope it is correct\.?\s*$", re.IGNORECASE)
_MATH_ENV_RE = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)


def _box_content(text: str, open_brace: int, max_chars: int) -> str | None:
    """Content of the brace group opening at `open_brace`, or None if it does not close within max_chars.

    The scan is bounded by max_chars, so a 1 MB string of braces costs no more than a short answer.
    `\\{` and `\\}` are LaTeX set braces, not grouping, and are skipped.
    """
    depth, i, end = 0, open_brace, min(len(text), open_brace + max_chars + 2)
    while i < end:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[open_brace + 1 : i]
        i += 1
    return None


def _last_match(pattern: re.Pattern, text: str) -> re.Match | None:
    last = None
    for last in pattern.finditer(text):
        pass
    return last


def _final_answer_span(text: str, start: int, max_chars: int) -> str | None:
    """The answer after a "final answer is/:" anchor ending at `start`, cleaned of delimiters."""
    rest = text[start : start + 4 * max_chars].lstrip()
    line = rest.split("\n", 1)[0].strip()
    line = _HOPE_RE.sub("", line).strip()
    env = _MATH_ENV_RE.search(line)
    if env:
        line = next(g for g in env.groups() if g is not None)
    line = line.strip().strip("*").strip().rstrip(".").strip()
    if not line or len(line) > max_chars:
        return None
    return line


def extract_answer(completion: str, max_answer_chars: int = 512) -> str | None:
    """The anchored answer text of a completion (see the module docstring), or None when there is none."""
    box = _last_match(_BOX_RE, completion)
    final = _last_match(_FINAL_RE, completion)
    if final is not None and (box is None or final.start() > box.start()):
        return _final_answer_span(completion, final.end(), max_answer_chars)
    if box is not None:
        content = _box_content(completion, box.end() - 1, max_answer_chars)
        if content is None:
            return None
        content = content.strip()
        # "{{42}}" is the group "42": drop redundant outer braces (math-verify's parse slows ~0.1 s per level).
        while content.startswith("{") and _box_content(content, 0, max_answer_chars) == content[1:-1]:
            content = content[1:-1].strip()
        return content or None
    return None


def _extraction_config():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    # The answer is already isolated and wrapped in \boxed{}: match the box first, plain expressions as fallback.
    return [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]


def _wrap(answer: str) -> str:
    return answer if ("$" in answer or "\\boxed" in answer) else "\\boxed{" + answer + "}"


@functools.lru_cache(maxsize=8192)
def _parse_gold(gold: str, parse_timeout_s: int) -> tuple:
    from math_verify import parse

    return tuple(parse(_wrap(gold), extraction_config=_extraction_config(), parsing_timeout=parse_timeout_s,
                       raise_on_error=True))


def score_completion(gold: str, completion: str, max_answer_chars: int = 512,
                     mv_timeout_s: int | None = 3) -> tuple[float, str]:
    """Score one completion against its gold answer: (1.0, "correct") or (0.0, reason).

    Runs where math-verify's signal-based timeouts work: a pool worker's main thread, or the main thread of an
    in-process caller. Pass mv_timeout_s=None off the main thread (no soft timeout; the pool's hard timeout is
    the protection there). math-verify timeouts are whole seconds (signal.alarm).
    """
    from math_verify import verify
    from math_verify.errors import TimeoutException

    try:
        answer = extract_answer(completion, max_answer_chars)
        if answer is None:
            return 0.0, NO_ANSWER
        gold_parsed = list(_parse_gold(str(gold).strip(), mv_timeout_s))
        if not gold_parsed:
            return 0.0, GOLD_UNPARSED
        from math_verify import parse

        pred = parse("\\boxed{" + answer + "}", extraction_config=_extraction_config(),
                     parsing_timeout=mv_timeout_s, raise_on_error=True)
        if not pred:
            return 0.0, NO_ANSWER
        # Gold first: verify(gold, pred) is not symmetric. Pair by pair (what verify does over the lists) so a
        # soft timeout is counted as a timeout while an error comparing one pair only fails that pair.
        timed_out = False
        for g in gold_parsed:
            for p in pred:
                try:
                    if verify(g, p, timeout_seconds=mv_timeout_s, raise_on_error=True):
                        return 1.0, CORRECT
                except TimeoutException:
                    timed_out = True
                except Exception:
                    continue
        return (0.0, TIMEOUT) if timed_out else (0.0, WRONG)
    except TimeoutException:
        return 0.0, TIMEOUT
    except Exception as e:  # a parser bug on odd input must cost this item only
        log.debug("math reward error: %s: %s", type(e).__name__, e)
        return 0.0, ERROR


# What a pool worker for the math reward imports before it is ready. With forkserver these are imported in the
# fork server, and `rewards._warm_math` runs `warm_worker` there once, so every worker (and every replacement of
# a killed one) is forked already warm instead of paying ~1 s of imports and first parses.
WORKER_PRELOAD = ("rewards.math", "math_verify", "sympy", "rewards._warm_math")

# One answer of each common kind: the first parse of a kind builds parser tables and sympy caches (~0.1 s each).
_WARM_CASES = (("1", "\\boxed{1}"), ("\\frac{1}{2}", "\\boxed{\\dfrac{2}{4}}"), ("2\\sqrt{3}", "\\boxed{\\sqrt{12}}"),
               ("[-1, 2)", "\\boxed{[-1,2)}"), ("\\{1,2\\}", "\\boxed{\\{2, 1\\}}"),
               ("x^2+3x+2", "\\boxed{(x+1)(x+2)}"), ("0.25", "The final answer is $\\frac{1}{4}$."), ("-7", "\\boxed{-8}"))


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


def _result(scores: list[float], statuses: list[str]) -> RewardResult:
    counts = {s: statuses.count(s) for s in (NO_ANSWER, TRUNCATED, GOLD_UNPARSED, WRONG)}
    return RewardResult(scores, errors=statuses.count(ERROR) + statuses.count(GOLD_UNPARSED),
                        timeouts=statuses.count(TIMEOUT), counts=counts)


class MathReward:
    """`(prompts, completions, answers, finish_reasons=None, **row_fields) -> RewardResult` with math-verify.

    By default items are scored in a `RewardPool` (hard per-item timeout `timeout_s`, `num_workers` processes,
    started on first use), which is safe from any thread, asyncio loop or Ray actor. `in_process=True` scores
    serially in the caller: math-verify's own (signal) timeouts are used on the main thread and turned off on
    other threads — never the silent zero that math-verify's "threaded environment" error gives elsewhere, but
    also no protection against a hang, so in_process is for debugging and the serial benchmark.

    In the pool, identical (gold, completion) pairs are scored once, and items are keyed by gold so that a
    group's samples land on one worker and its gold is parsed once there.
    """

    def __init__(self, pool=None, *, num_workers: int = 2, timeout_s: float = 10.0, in_process: bool = False,
                 max_answer_chars: int = 512, mv_timeout_s: int | None = None):
        self.__name__ = "math"
        self.timeout_s = float(timeout_s)
        self.num_workers = num_workers
        self.in_process = in_process
        self.max_answer_chars = max_answer_chars
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

                self._pool = RewardPool(num_workers=self.num_workers, timeout_s=self.timeout_s,
                                        preload=WORKER_PRELOAD, init=warm_worker)
            return self._pool

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], answers: Sequence[Any],
                 **row_fields) -> RewardResult:
        n = len(completions)
        if len(answers) != n:
            raise ValueError(f"math reward got {n} completions but {len(answers)} answers")
        reasons = _finish_reasons(n, row_fields)
        scores, statuses = [0.0] * n, [TRUNCATED] * n
        todo = []
        for i in range(n):
            if reasons[i] in UNFINISHED_REASONS:
                continue
            if answers[i] is None:  # a row without a gold is a data error, not a wrong answer
                statuses[i] = GOLD_UNPARSED
                continue
            todo.append(i)
        if self.in_process:
            on_main = threading.current_thread() is threading.main_thread()
            for i in todo:
                scores[i], statuses[i] = score_completion(str(answers[i]), completions[i], self.max_answer_chars,
                                                          self.mv_timeout_s if on_main else None)
        else:
            # Identical (gold, completion) pairs are scored once: a small policy often repeats itself in a group.
            unique: dict[tuple[str, str], list[int]] = {}
            for i in todo:
                unique.setdefault((str(answers[i]), completions[i]), []).append(i)
            items = [(g, c, self.max_answer_chars, self.mv_timeout_s) for g, c in unique]
            # Keyed by gold: a group's samples go to one worker, which parses that gold once (a third of the work).
            results = self.pool.map(score_completion, items, keys=[g for g, _ in unique])
            for idx, res in zip(unique.values(), results):
                if res.status == "ok":
                    got = res.value
                else:  # hard timeout, worker crash or an exception escaping the scorer
                    got = (0.0, TIMEOUT if res.status == "timeout" else ERROR)
                for i in idx:
                    scores[i], statuses[i] = got
        out = _result([float(s) if _math.isfinite(s) else 0.0 for s in scores], statuses)
        if out.errors or out.timeouts:
            log.warning("math reward: %d of %d samples scored 0 for an error (%d golds that do not parse) and %d "
                        "for a timeout", out.errors, n, out.counts[GOLD_UNPARSED], out.timeouts)
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


def math_reward(prompts: Sequence[str], completions: Sequence[str], answers: Sequence[Any],
                **row_fields) -> RewardResult:
    """The math reward as a plain function (`rewards.math:math_reward` in config): a process-wide
    `MathReward()` with default settings, whose pool starts on the first call."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = MathReward()
    return _DEFAULT(prompts, completions, answers, **row_fields)


def format_reward(prompts: Sequence[str], completions: Sequence[str], answers: Sequence[Any],
                  **row_fields) -> list[float]:
    """1.0 when a finished completion carries an answer anchor (see the module docstring), else 0.0.

    Cheap (no sympy): runs in-process. Meant as a small-weight shaping term beside `MathReward`.
    """
    reasons = _finish_reasons(len(completions), row_fields)
    return [0.0 if r in UNFINISHED_REASONS else float(extract_answer(c) is not None)
            for c, r in zip(completions, reasons)]
