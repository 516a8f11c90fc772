"""Synthetic multi-step integer arithmetic: the task of the embedded default.

Owns: problem generation by difficulty and seed, the prompt / worked-solution format, the split rule, and the
task's answer rule (`score`: a literal integer in the last box).

A problem is an expression such as `37+5*3` (its canonical text). Its split (train / val / test) is a function
of a hash of that text, so the splits are disjoint by construction: no test problem can ever be drawn for
train, whatever the seeds or counts. Generation draws random expressions from a seeded stream per split and
keeps those whose hash falls in the requested split.

Text is short on purpose (the tiny model reads characters): prompt `Q: 37+5*3=? Put the answer in \\boxed{}.\\nA:`
and solution ` 5*3=15, 37+15=52. \\boxed{52}`: multiplications first, then left to right, one step each.
"""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path

from rl.data.jsonl import DataError, read_jsonl, write_jsonl

__all__ = [
    "LEVELS",
    "SPLITS",
    "PROMPT_TEMPLATE",
    "split_of",
    "problem_hash",
    "make_problem",
    "generate",
    "extract_boxed",
    "score",
    "write_split",
    "read_jsonl",
    "write_jsonl",
]

PROMPT_TEMPLATE = "Q: {question}=? Put the answer in \\boxed{{}}.\nA:"

# difficulty -> (number of operations, max operand of + and -, max operand next to a *)
LEVELS = {1: (1, 50, 9), 2: (2, 50, 9), 3: (3, 99, 12), 4: (4, 99, 12)}

# hash buckets out of 100: test 10%, val 10%, train the rest
SPLITS = {"test": range(0, 10), "val": range(10, 20), "train": range(20, 100)}


def problem_hash(question: str) -> str:
    """Hex digest of the canonical question text (what the splits and the disjointness tests use)."""
    return hashlib.sha256(("fbrl-arith:" + question).encode()).hexdigest()


def split_of(question: str) -> str:
    bucket = int(problem_hash(question)[:8], 16) % 100
    return next(name for name, r in SPLITS.items() if bucket in r)


def _solve(nums: list[int], ops: list[str]) -> tuple[int, list[str]]:
    """Evaluate with * before +/-, left to right, returning (value, worked steps)."""
    nums, ops, steps = list(nums), list(ops), []
    for pass_ops in ("*", "+-"):
        i = 0
        while i < len(ops):
            if ops[i] in pass_ops:
                a, b, op = nums[i], nums[i + 1], ops[i]
                v = a * b if op == "*" else a + b if op == "+" else a - b
                steps.append(f"{a}{op}{b}={v}")
                nums[i : i + 2] = [v]
                del ops[i]
            else:
                i += 1
    return nums[0], steps


def make_problem(rng: random.Random, difficulty: int) -> dict:
    """One random problem at `difficulty` (1..4) as a row: id, question, prompt, solution, answer, difficulty."""
    n_ops, max_add, max_mul = LEVELS[difficulty]
    ops = [rng.choice("+-*") for _ in range(n_ops)]
    nums = []
    for i in range(n_ops + 1):
        # operands of a product stay small so that values (and the text) stay short
        by_mul = (i > 0 and ops[i - 1] == "*") or (i < n_ops and ops[i] == "*")
        nums.append(rng.randint(1 if by_mul else 0, max_mul if by_mul else max_add))
    question = "".join(f"{n}{op}" for n, op in zip(nums, ops)) + str(nums[-1])
    value, steps = _solve(nums, ops)
    return {
        "id": problem_hash(question)[:16],
        "question": question,
        "prompt": PROMPT_TEMPLATE.format(question=question),
        "solution": f" {', '.join(steps)}. \\boxed{{{value}}}",
        "answer": str(value),
        "difficulty": difficulty,
    }


def generate(
    split: str,
    n: int,
    seed: int = 0,
    difficulties=(1, 2, 3),
    unique: bool | None = None,
    direct_answer_frac: float = 0.0,
) -> list[dict]:
    """`n` problems of `split`, deterministic in (split, n, seed, difficulties, direct_answer_frac).

    `direct_answer_frac` of the rows (chosen by question hash) get the bare answer ` \\boxed{52}` as their
    solution instead of the worked steps: a model trained on that mixture has two behaviours, and the short one
    is much less accurate on multi-step problems: a choice RL can learn to make from the reward alone.

    Each problem's level is drawn uniformly from `difficulties`. `unique` (default: True for val/test, False
    for train) refuses repeated questions; small spaces (level 1 has ~5k problems, ~500 per held-out split)
    are then somewhat under-represented in large held-out splits, and a request beyond a space is an error
    rather than a silently short split.
    """
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {list(SPLITS)}, got {split!r}")
    if any(d not in LEVELS for d in difficulties) or not difficulties:
        raise ValueError(f"difficulties: expected levels in {list(LEVELS)}, got {list(difficulties)}")
    unique = split != "train" if unique is None else unique
    rng = random.Random(f"fbrl-arith:{seed}:{split}")  # str seeds are stable across processes
    rows, seen, misses = [], set(), 0
    while len(rows) < n:
        # 5000 rejections in a row cannot happen by chance (each split takes >= 10% of the hashes): the
        # space of distinct problems is used up
        if misses > 5000:
            raise DataError(
                f"only {len(rows)} distinct {split} problems found at difficulties "
                f"{list(difficulties)} (asked for {n}); add harder levels or ask for fewer"
            )
        row = make_problem(rng, rng.choice(list(difficulties)))
        if split_of(row["question"]) != split or (unique and row["question"] in seen):
            misses += 1
            continue
        misses = 0
        seen.add(row["question"])
        if int(problem_hash(row["question"])[8:16], 16) % 10_000 < direct_answer_frac * 10_000:
            row["solution"] = f" \\boxed{{{row['answer']}}}"
        rows.append(row)
    return rows


_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_INTEGER = re.compile(r"[-+]?[0-9]+")  # ASCII digits only: int() would also take "1_7", " 17 " or "١٧"
# The last box preceded only by separators and another box: a list of answers ("\\boxed{50}, \\boxed{52}").
_BOX_LIST = re.compile(r"\\boxed\{[^{}]*\}(?:\s|[,;&$]|\band\b|\bor\b)*\\boxed\{[^{}]*\}(?!.*\\boxed)", re.DOTALL)


def extract_boxed(text: str) -> str | None:
    """Contents of the last `\\boxed{...}` (no nested braces), or None."""
    found = _BOXED.findall(text)
    return found[-1].strip() if found else None


def score(completion: str, answer: str) -> float:
    """The task's own answer rule (1.0 / 0.0): the last box holds the answer as a literal integer — digits with an
    optional sign and a final period, nothing else — and does not end a list of boxes. `\\boxed{17*23}`, the
    question copied into the box, units or a decimal score 0 even when they evaluate to the answer. The strict
    math reward (rewards/, used for training and held-out accuracy on this task) applies the same rule;
    tests/test_rewards_answer.py checks they agree."""
    got = extract_boxed(completion)
    if got is None or _BOX_LIST.search(completion):
        return 0.0
    if got.endswith(".") and not got.endswith(".."):  # sentence punctuation, not an ellipsis
        got = got[:-1].strip()
    return float(_INTEGER.fullmatch(got) is not None and int(got) == int(answer))


def write_split(path: str | Path, split: str, n: int, seed: int = 0, difficulties=(1, 2, 3)) -> list[dict]:
    """Generate a split and write it as JSONL; returns the rows."""
    rows = generate(split, n, seed, difficulties)
    write_jsonl(rows, path)
    return rows
