"""Templated grade-school word problems with integer answers, written as chat rows (no downloads).

Owns: the problem templates (quantities, units, rates, money; 1-4 arithmetic operations), generation by
difficulty (= number of operations), number size and seed, the hash split rule, and the chat row format.

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

NAMES = [
    "Lena",
    "Tom",
    "Maria",
    "Sam",
    "Aisha",
    "Ben",
    "Chen",
    "Nora",
    "Omar",
    "Priya",
    "Leo",
    "Mia",
    "Ivan",
    "Zoe",
    "Raj",
    "Emma",
    "Kofi",
    "Sara",
    "Luis",
    "Hana",
]
THINGS = ["apples", "marbles", "stickers", "pencils", "cookies", "stamps", "books", "shells", "cards", "eggs"]
CONTAINERS = ["bags", "boxes", "packs", "jars", "baskets", "crates"]
ITEMS = [
    ("notebook", "notebooks"),
    ("pen", "pens"),
    ("sandwich", "sandwiches"),
    ("ticket", "tickets"),
    ("toy car", "toy cars"),
    ("mug", "mugs"),
    ("plant", "plants"),
]


def problem_hash(question: str) -> str:
    return hashlib.sha256(("fbrl-words:" + question).encode()).hexdigest()


def split_of(question: str) -> str:
    bucket = int(problem_hash(question)[:8], 16) % 100
    return next(name for name, r in SPLITS.items() if bucket in r)


# ---- templates: each returns (question, worked steps, answer) and uses exactly its number of operations ---------
class _Ctx:
    def __init__(self, rng: random.Random, numbers: str = "standard"):
        self.rng, self.small = rng, numbers == "small"
        self.name, self.friend = rng.sample(NAMES, 2)
        self.thing = rng.choice(THINGS)
        self.box = rng.choice(CONTAINERS)
        self.item, self.items = rng.choice(ITEMS)

    def n(self, lo: int, hi: int) -> int:
        # small: the lowest quarter of the range (every template's constraints only need lo <= n <= hi)
        return self.rng.randint(lo, lo + (hi - lo) // 4 if self.small else hi)


def _gain(c: _Ctx):
    a, b = c.n(5, 60), c.n(2, 40)
    return (
        f"{c.name} has {a} {c.thing}. {c.name} finds {b} more {c.thing}. How many {c.thing} does {c.name} have now?",
        [f"{a} + {b} = {a + b}"],
        a + b,
    )


def _lose(c: _Ctx):
    a = c.n(20, 90)
    b = c.n(2, a - 1)
    return (
        f"{c.name} had {a} {c.thing} and gave {b} of them to {c.friend}. How many {c.thing} does {c.name} have left?",
        [f"{a} - {b} = {a - b}"],
        a - b,
    )


def _groups(c: _Ctx):
    k, m = c.n(2, 9), c.n(2, 12)
    return (
        f"There are {k} {c.box} with {m} {c.thing} in each. How many {c.thing} are there in all?",
        [f"{k} * {m} = {k * m}"],
        k * m,
    )


def _share(c: _Ctx):
    k, q = c.n(2, 9), c.n(2, 12)
    return (
        f"{c.name} shares {k * q} {c.thing} equally among {k} friends. How many {c.thing} does each friend get?",
        [f"{k * q} / {k} = {q}"],
        q,
    )


def _price(c: _Ctx):
    p, k = c.n(2, 15), c.n(2, 9)
    return (f"One {c.item} costs ${p}. How much do {k} {c.items} cost?", [f"{k} * {p} = {k * p}"], k * p)


def _speed(c: _Ctx):
    s, t = c.n(3, 12) * 5, c.n(2, 6)
    return (
        f"A car drives at {s} km per hour for {t} hours. How many km does it drive?",
        [f"{s} * {t} = {s * t}"],
        s * t,
    )


def _meters(c: _Ctx):
    m = c.n(2, 9)
    return (f"A rope is {m} meters long. How long is it in centimeters?", [f"{m} * 100 = {m * 100}"], m * 100)


def _change(c: _Ctx):
    p, k = c.n(2, 12), c.n(2, 6)
    bill = next(b for b in (10, 20, 50, 100) if b >= p * k)
    return (
        f"{c.name} buys {k} {c.items} at ${p} each and pays with a ${bill} bill. How much change does {c.name} get?",
        [f"{k} * {p} = {k * p}", f"{bill} - {k * p} = {bill - k * p}"],
        bill - k * p,
    )


def _packs_then_give(c: _Ctx):
    k, m = c.n(2, 8), c.n(3, 12)
    g = c.n(1, k * m - 1)
    return (
        f"{c.name} buys {k} {c.box} of {c.thing} with {m} in each and gives {g} {c.thing} to {c.friend}. "
        f"How many {c.thing} does {c.name} have now?",
        [f"{k} * {m} = {k * m}", f"{k * m} - {g} = {k * m - g}"],
        k * m - g,
    )


def _wage(c: _Ctx):
    w, h1, h2 = c.n(8, 20), c.n(2, 8), c.n(2, 8)
    return (
        f"{c.name} earns ${w} per hour. {c.name} works {h1} hours on Monday and {h2} hours on Tuesday. How "
        f"much does {c.name} earn in the two days?",
        [f"{h1} + {h2} = {h1 + h2}", f"{w} * {h1 + h2} = {w * (h1 + h2)}"],
        w * (h1 + h2),
    )


def _cut_rope(c: _Ctx):
    m = c.n(2, 9)
    cut = c.n(10, m * 100 - 10)
    return (
        f"A ribbon is {m} meters long. {c.name} cuts off {cut} centimeters. How many centimeters of ribbon are left?",
        [f"{m} * 100 = {m * 100}", f"{m * 100} - {cut} = {m * 100 - cut}"],
        m * 100 - cut,
    )


def _tank(c: _Ctx):
    r, t, have = c.n(2, 9) * 5, c.n(2, 8), c.n(5, 40)
    return (
        f"A tank holds {have} liters of water. A tap adds {r} liters per minute for {t} minutes. How many "
        f"liters are in the tank then?",
        [f"{r} * {t} = {r * t}", f"{have} + {r * t} = {have + r * t}"],
        have + r * t,
    )


def _shop_day(c: _Ctx):
    a = c.n(60, 150)
    s1, s2 = c.n(5, 30), c.n(5, 30)
    k, m = c.n(2, 5), c.n(4, 12)
    left = a - s1 - s2
    return (
        f"A shop has {a} {c.thing}. It sells {s1} in the morning and {s2} in the afternoon, then gets {k} "
        f"{c.box} with {m} {c.thing} each. How many {c.thing} does the shop have now?",
        [
            f"{a} - {s1} = {a - s1}",
            f"{a - s1} - {s2} = {left}",
            f"{k} * {m} = {k * m}",
            f"{left} + {k * m} = {left + k * m}",
        ],
        left + k * m,
    )


def _trip(c: _Ctx):
    s1, t1, s2, t2 = c.n(4, 12) * 5, c.n(1, 4), c.n(4, 12) * 5, c.n(1, 4)
    return (
        f"A train runs at {s1} km per hour for {t1} hours, then at {s2} km per hour for {t2} hours. How "
        f"many km does it travel in total?",
        [f"{s1} * {t1} = {s1 * t1}", f"{s2} * {t2} = {s2 * t2}", f"{s1 * t1} + {s2 * t2} = {s1 * t1 + s2 * t2}"],
        s1 * t1 + s2 * t2,
    )


def _budget(c: _Ctx):
    money = c.n(5, 20) * 10
    p1, k1, p2, k2 = c.n(2, 9), c.n(2, 5), c.n(2, 9), c.n(2, 5)
    spent = p1 * k1 + p2 * k2
    if spent > money:
        money = spent + c.n(0, 30)
    return (
        f"{c.name} has ${money}. {c.name} buys {k1} {c.items} at ${p1} each and {k2} books at ${p2} each. "
        f"How much money does {c.name} have left?",
        [
            f"{k1} * {p1} = {p1 * k1}",
            f"{k2} * {p2} = {p2 * k2}",
            f"{p1 * k1} + {p2 * k2} = {spent}",
            f"{money} - {spent} = {money - spent}",
        ],
        money - spent,
    )


def _share_after(c: _Ctx):
    k, q = c.n(2, 6), c.n(2, 10)
    extra = c.n(1, 20)
    total = k * q + extra
    return (
        f"{c.name} has {total} {c.thing} and eats {extra}. {c.name} shares the rest equally among {k} "
        f"friends. How many {c.thing} does each friend get?",
        [f"{total} - {extra} = {k * q}", f"{k * q} / {k} = {q}"],
        q,
    )


def _class_trip(c: _Ctx):
    parents, share = c.n(2, 6), c.n(10, 40)
    total = parents * share
    fee = c.n(2, 6)
    kids = c.n(3, max(3, (total - 1) // fee))
    kids = min(kids, (total - 1) // fee)
    bus = total - kids * fee
    return (
        f"{kids} children go on a trip. Each ticket costs ${fee} and the bus costs ${bus}. {parents} parents "
        f"split the total cost equally. How much does each parent pay?",
        [f"{kids} * {fee} = {kids * fee}", f"{kids * fee} + {bus} = {total}", f"{total} / {parents} = {share}"],
        share,
    )


def _savings(c: _Ctx):
    start, weekly, weeks = c.n(5, 40), c.n(3, 12), c.n(2, 8)
    saved = start + weekly * weeks
    spend = c.n(2, min(20, saved))
    return (
        f"{c.name} has ${start} saved and adds ${weekly} every week for {weeks} weeks, then spends "
        f"${spend} on a game. How much money is left?",
        [
            f"{weekly} * {weeks} = {weekly * weeks}",
            f"{start} + {weekly * weeks} = {saved}",
            f"{saved} - {spend} = {saved - spend}",
        ],
        saved - spend,
    )


def _halves(c: _Ctx):
    start, weekly, weeks = c.n(5, 40), c.n(3, 12), c.n(2, 8)
    saved = start + weekly * weeks
    spend = c.n(1, saved - 2)
    spend += (saved - spend) % 2  # what is left splits into two whole halves
    left = saved - spend
    return (
        f"{c.name} has ${start} and saves ${weekly} a week for {weeks} weeks. Then {c.name} spends ${spend} "
        f"and gives half of the rest to {c.friend}. How much money does {c.friend} get?",
        [
            f"{weekly} * {weeks} = {weekly * weeks}",
            f"{start} + {weekly * weeks} = {saved}",
            f"{saved} - {spend} = {left}",
            f"{left} / 2 = {left // 2}",
        ],
        left // 2,
    )


TEMPLATES = {
    1: [_gain, _lose, _groups, _share, _price, _speed, _meters],
    2: [_change, _packs_then_give, _wage, _cut_rope, _tank, _share_after],
    3: [_trip, _savings, _class_trip],
    4: [_shop_day, _budget, _halves],
}

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
    question, steps, answer = rng.choice(TEMPLATES[difficulty])(_Ctx(rng, numbers))
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
