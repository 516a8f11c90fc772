"""Templated grade-school word problems with integer answers, written as chat rows (no downloads).

Owns: generation by difficulty (= number of operations), number size and seed, the hash split rule, and the chat
row format; the problem templates (quantities, units, rates, money; 1-4 arithmetic operations) are
rl/data/word_templates.py.

A problem is rendered from a template with random names, objects and numbers; every intermediate value is a
non-negative integer (divisions are exact by construction). `numbers="small"` draws every number from the lowest
quarter of its template's range (e.g. 5-18 apples instead of 5-60, groups of 2-4 instead of 2-12): the same
sentences with easier arithmetic, for models too small to give RL any signal on the standard numbers. Its split
(train / val / test) is a function of a
hash of the question text, so the splits are disjoint by construction whatever the seeds or counts, exactly as
in `rl.data.arith`. Generation is deterministic in (split, n, seed, difficulties): a seeded stream per split
draws problems and keeps those whose hash falls in the split.

Rows: `messages` (a few-shot chat: the instruction as system message, `shots` worked examples (default two) as
user/assistant exchanges, then the problem; fewer shots make a shorter prompt, which every rollout and learner
pass pays for), `prompt`
(the same text without a chat template, for base models), `answer` (the integer as a string), `solution`
(worked steps ending in `\\boxed{N}`), `question`, `difficulty`, `id`. The loader (`rl.data.loaders`) renders
`messages` with the tokenizer's chat template.
"""

from __future__ import annotations

import hashlib
import random
import re

from rl.data.jsonl import DataError
from rl.data.word_templates import TEMPLATES, draw_problem

__all__ = [
    "LEVELS",
    "NUMBERS",
    "SPLITS",
    "INSTRUCTION",
    "make_problem",
    "generate",
    "split_of",
    "problem_hash",
    "chat_row",
]

LEVELS = (1, 2, 3, 4)
NUMBERS = ("standard", "small")
SPLITS = {"test": range(0, 10), "val": range(10, 20), "train": range(20, 100)}
INSTRUCTION = "Solve the problem. Show the calculation briefly, then give the final answer as \\boxed{N}."


def problem_hash(question: str) -> str:
    return hashlib.sha256(("fbrl-words:" + question).encode()).hexdigest()


def split_of(question: str) -> str:
    bucket = int(problem_hash(question)[:8], 16) % 100
    return next(name for name, r in SPLITS.items() if bucket in r)


# The worked examples every prompt opens with (fixed; their wording is never a generated question's).
EXAMPLES = [
    ("Ana picks 14 plums and then 9 more plums. How many plums does Ana have?", "14 + 9 = 23\n\\boxed{23}"),
    (
        "Ana buys 3 boxes with 4 pens in each and gives 2 pens to Raj. How many pens does Ana have now?",
        "3 * 4 = 12\n12 - 2 = 10\n\\boxed{10}",
    ),
]


def make_problem(
    rng: random.Random, difficulty: int, numbers: str = "standard", shots: int = 2, calculator: bool = False
) -> dict:
    """One random problem with `difficulty` operations (1..4) and `numbers` ("standard" / "small") as a row (see
    the module docstring)."""
    if difficulty not in TEMPLATES:
        raise ValueError(f"difficulty: expected one of {list(TEMPLATES)}, got {difficulty!r}")
    if numbers not in NUMBERS:
        raise ValueError(f"numbers: expected one of {list(NUMBERS)}, got {numbers!r}")
    question, steps, answer = draw_problem(rng, difficulty, numbers)
    if answer < 0 or len(steps) != difficulty:  # a template bug, never a user error
        raise AssertionError(f"template produced answer {answer} with {len(steps)} steps: {question}")
    return chat_row(question, steps, answer, difficulty, shots, calculator)


_STEP = re.compile(r"^(.*?)\s*=\s*(-?[\d.]+)$")


def annotate_step(step: str) -> str:
    """A worked step in GSM8K's calculator form: "3 * 4 = 12" -> "3 * 4 = <<3*4=12>>12" (docs/TOOLS.md: the model
    writes up to "=", the calculator appends "12>>"). Steps already annotated, or with no "= N" end, are kept."""
    m = _STEP.match(step)
    if m is None or "<<" in step:
        return step
    expr, result = m.group(1), m.group(2)
    return f"{expr} = <<{expr.replace(' ', '')}={result}>>{result}"


def calculator_segments(solution: str) -> list[tuple[str, bool]]:
    """A solution with calculator annotations as (text, written by the policy) segments: each annotation's result
    and closing `>>` (`12>>`) is the tool's, everything else the policy's. A multi-pass SFT trains on the policy's
    segments only, and feeds nothing back into the tool's, as a multi-turn rollout reads them."""
    out, at = [], 0
    for m in re.finditer(r"<<[^<>=]*=([^<>]*>>)", solution):
        out.append((solution[at : m.start(1)], True))
        out.append((m.group(1), False))
        at = m.end()
    out.append((solution[at:], True))
    return [(text, policy) for text, policy in out if text]


def chat_row(
    question: str, steps: list[str], answer: int, difficulty: int, shots: int = 2, calculator: bool = False
) -> dict:
    """The row of one problem; `shots` worked examples (0-2: the last ones of EXAMPLES) open the chat.
    `calculator`: the examples and the solution write each step as a calculator call (`annotate_step`)."""
    if not 0 <= shots <= len(EXAMPLES):
        raise ValueError(f"shots: expected 0..{len(EXAMPLES)} worked examples, got {shots!r}")
    examples = EXAMPLES[len(EXAMPLES) - shots :]
    if calculator:
        steps = [annotate_step(x) for x in steps]
        examples = [(q, "\n".join(annotate_step(x) for x in a.split("\n"))) for q, a in examples]
    turns = [m for q, a in examples for m in ({"role": "user", "content": q}, {"role": "assistant", "content": a})]
    return {
        "id": problem_hash(question)[:16],
        "question": question,
        # the instruction as the system message (it also replaces a template's default system prompt: shorter)
        "messages": [{"role": "system", "content": INSTRUCTION}, *turns, {"role": "user", "content": question}],
        "prompt": f"{INSTRUCTION}\n\n" + "".join(f"{q}\n{a}\n\n" for q, a in examples) + f"{question}\n",
        "solution": "\n".join(steps) + f"\n\\boxed{{{answer}}}",
        "answer": str(answer),
        "difficulty": difficulty,
    }


def generate(
    split: str,
    n: int,
    seed: int = 0,
    difficulties=(1, 2),
    numbers: str = "standard",
    shots: int = 2,
    calculator: bool = False,
) -> list[dict]:
    """`n` distinct problems of `split`, deterministic in (split, n, seed, difficulties, numbers); levels drawn
    uniformly; `shots` worked examples open each chat (the problems do not depend on it)."""
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {list(SPLITS)}, got {split!r}")
    if not difficulties or any(d not in TEMPLATES for d in difficulties):
        raise ValueError(f"difficulties: expected levels in {list(TEMPLATES)}, got {list(difficulties)}")
    if numbers not in NUMBERS:
        raise ValueError(f"numbers: expected one of {list(NUMBERS)}, got {numbers!r}")
    # the standard stream's name is unchanged, so its problems stay what they were before `numbers` existed
    rng = random.Random(f"fbrl-words:{seed}:{split}" + ("" if numbers == "standard" else f":{numbers}"))
    rows, seen, misses = [], set(), 0
    while len(rows) < n:
        if misses > 5000:  # cannot happen by chance (each split owns >= 10% of the hashes): the space is used up
            raise DataError(
                f"only {len(rows)} distinct {split} word problems at difficulties {list(difficulties)} (asked for {n})"
            )
        row = make_problem(rng, rng.choice(list(difficulties)), numbers, shots, calculator)
        if split_of(row["question"]) != split or row["question"] in seen:
            misses += 1
            continue
        misses = 0
        seen.add(row["question"])
        rows.append(row)
    return rows
