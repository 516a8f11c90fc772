"""The word problems' templates (rl/data/word_problems.py makes the rows): the names, objects, containers and shop
items they draw, and per difficulty (= number of arithmetic operations, 1-4) the templates, each a question, its
worked steps and its integer answer. Every intermediate value is a non-negative integer (divisions are exact by
construction); `numbers="small"` draws every number from the lowest quarter of its template's range.
"""

from __future__ import annotations

import random

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


def draw_problem(rng: random.Random, difficulty: int, numbers: str = "standard") -> tuple[str, list[str], int]:
    """(question, worked steps, answer) of a template of `difficulty` drawn with `rng` (`numbers`: "standard" or
    "small")."""
    return rng.choice(TEMPLATES[difficulty])(_Ctx(rng, numbers))
