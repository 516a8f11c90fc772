"""State-tracking tasks: a running state over a stream of symbols, where difficulty is the chain length.

Owns: the task families (`TRACKING_RULES`), problem generation by chain length and seed, the prompt / response format,
the hash rule that makes the splits disjoint, and the task's own literal scorer (`score`, also usable as an RL
reward: `reward.fns: [{fn: "rl.data.track:reward"}]`).

Why these tasks: the answer is a state updated once per symbol (a finite automaton), and nothing in the text
ever writes the state down. A transformer of fixed depth has to compose the whole chain inside one forward pass
at the answer; an FBT can carry the state from token to token in its fed-back top-layer state. The response
reads the stream back before answering (` 2413=4`), so the recurrence runs along the stream in `soft`
decoding, which feeds back only generated tokens (the prompt stays plain). Both models are trained on the
same text, so the echo helps neither: it gives the standard model more positions, not more depth.

| task     | symbols                                 | state                    | prompt / response                      |
|----------|-----------------------------------------|--------------------------|----------------------------------------|
| `cups`   | d in 1..4: swap cups d and d+1          | the ball's cup (1..5)    | `Q: cup 3, swaps 2413\\nA:` / ` 2413=4`|
| `modsum` | digits 0..9                             | running sum mod 10       | `Q: sum mod 10 of 3827\\nA:` / ` 3827=0`|
| `parity` | bits 0/1                                | number of ones mod 2     | `Q: parity of 10110\\nA:` / ` 10110=1`|

`cups` is the hard one: adjacent transpositions generate S5, a non-solvable group, whose word problem needs
depth growing with the chain length in a transformer (Barrington; Merrill et al. 2024), while an automaton
needs one table look-up per symbol. `modsum` and `parity` are abelian (a transformer can count instead).

Splits: a problem's split is a function of a hash of its canonical text (task, start, stream), as in
`rl/data/arith.py`, so no test problem can be drawn for train whatever the seeds or counts.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rl.data.jsonl import DataError

__all__ = [
    "TRACKING_RULES",
    "SPLITS",
    "MAX_CHAIN",
    "split_of",
    "problem_hash",
    "make_problem",
    "generate",
    "echo",
    "extract_state_answer",
    "score",
    "reward",
]

SPLITS = {"test": range(0, 10), "val": range(10, 20), "train": range(20, 100)}  # hash buckets out of 100
MAX_CHAIN = 64


@dataclass(frozen=True)
class TrackingRule:
    symbols: str  # one character per symbol
    starts: tuple[int, ...]  # initial states drawn uniformly (one value: fixed start)
    update: Callable[[int, str], int]  # state, symbol -> next state
    prompt: Callable[[int, str], str]  # start, stream -> prompt text
    # what the response writes after each echoed symbol, from (state before, symbol): a lossy view of the state,
    # so every step's text depends on the state without writing it down (None: the bare echo)
    mark: Callable[[int, str], str] | None = None


def _swap(cup: int, sym: str) -> int:
    d = int(sym)
    return d + 1 if cup == d else d if cup == d + 1 else cup


TRACKING_RULES: dict[str, TrackingRule] = {
    "cups": TrackingRule("1234", (1, 2, 3, 4, 5), _swap, lambda s, w: f"Q: cup {s}, swaps {w}\nA:"),
    "modsum": TrackingRule(
        "0123456789", (0,), lambda s, c: (s + int(c)) % 10, lambda s, w: f"Q: sum mod 10 of {w}\nA:"
    ),
    "parity": TrackingRule("01", (0,), lambda s, c: s ^ int(c), lambda s, w: f"Q: parity of {w}\nA:"),
    "cups_moved": TrackingRule(
        "1234",
        (1, 2, 3, 4, 5),
        _swap,
        lambda s, w: f"Q: cup {s}, swaps {w}, moved?\nA:",
        lambda cup, sym: "+" if _swap(cup, sym) != cup else "-",
    ),
}


def _task(name: str) -> TrackingRule:
    if name not in TRACKING_RULES:
        raise ValueError(f"state-tracking task: expected one of {sorted(TRACKING_RULES)}, got {name!r}")
    return TRACKING_RULES[name]


def problem_hash(task: str, start: int, stream: str) -> str:
    """Hex digest of the canonical problem (what the splits use)."""
    return hashlib.sha256(f"fbrl-track:{task}:{start}:{stream}".encode()).hexdigest()


def split_of(task: str, start: int, stream: str) -> str:
    bucket = int(problem_hash(task, start, stream)[:8], 16) % 100
    return next(name for name, r in SPLITS.items() if bucket in r)


def solve(task: str, start: int, stream: str) -> int:
    t, state = _task(task), start
    for sym in stream:
        state = t.update(state, sym)
    return state


def make_problem(task: str, rng: random.Random, length: int) -> dict:
    """One random problem of `task` with a chain of `length` symbols, as a row."""
    t = _task(task)
    start = rng.choice(t.starts)
    stream = "".join(rng.choice(t.symbols) for _ in range(length))
    answer = str(solve(task, start, stream))
    return {
        "id": problem_hash(task, start, stream)[:16],
        "task": task,
        "start": start,
        "stream": stream,
        "prompt": t.prompt(start, stream),
        "solution": f" {echo(task, start, stream)}={answer}",
        "answer": answer,
        "difficulty": length,
    }


def echo(task: str, start: int, stream: str) -> str:
    """The response before `=`: the stream read back, each symbol followed by its mark if the task has one."""
    t = _task(task)
    if t.mark is None:
        return stream
    out, state = [], start
    for sym in stream:
        out.append(sym + t.mark(state, sym))
        state = t.update(state, sym)
    return "".join(out)


def generate(
    task: str, split: str, n: int, seed: int = 0, lengths: Sequence[int] = (4, 8), unique: bool | None = None
) -> list[dict]:
    """`n` problems of `split` with chain lengths drawn uniformly from `lengths`; deterministic in the args.

    `unique` (default: True for val/test) refuses repeated problems; asking a held-out split for more problems
    than a short chain has (cups, length 3: 5 * 4^3 = 320 problems, ~32 in test) is an error, not a silently
    short split.
    """
    _task(task)
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {list(SPLITS)}, got {split!r}")
    if not lengths or any(not 1 <= int(k) <= MAX_CHAIN for k in lengths):
        raise ValueError(f"chain lengths: expected values in 1..{MAX_CHAIN}, got {list(lengths)}")
    unique = split != "train" if unique is None else unique
    rng = random.Random(f"fbrl-track:{task}:{seed}:{split}")
    rows, seen, misses = [], set(), 0
    while len(rows) < n:
        if misses > 20000:  # each split holds >= 10% of the hashes: this many misses in a row means used up
            raise DataError(
                f"only {len(rows)} distinct {split} problems of {task} at chain lengths "
                f"{list(lengths)} (asked for {n}); use longer chains or ask for fewer"
            )
        row = make_problem(task, rng, int(rng.choice(list(lengths))))
        key = (row["start"], row["stream"])
        if split_of(task, *key) != split or (unique and key in seen):
            misses += 1
            continue
        misses = 0
        seen.add(key)
        rows.append(row)
    return rows


def extract_state_answer(completion: str) -> str | None:
    """The text after the last `=` (stripped), or None when there is none."""
    if "=" not in completion:
        return None
    return completion.rsplit("=", 1)[1].strip()


def score(
    prompts: Sequence[str], completions: Sequence[str], answers: Sequence, finish_reasons=None, **_
) -> list[float]:
    """The task's own literal scorer: 1.0 when the text after the last `=` equals the answer, else 0.0.

    A truncated or aborted response scores 0 (its answer was never given). No parsing beyond the split at `=`:
    `=04` or `=4.0` are wrong, the format is part of the task."""
    reasons = list(finish_reasons) if finish_reasons is not None else [None] * len(completions)
    if len(reasons) != len(completions):
        raise ValueError(f"finish_reasons has {len(reasons)} entries for {len(completions)} completions")
    return [
        float(r not in ("length", "aborted") and extract_state_answer(c) == str(a).strip())
        for c, a, r in zip(completions, answers, reasons)
    ]


reward = score  # `reward.fns: [{fn: "rl.data.track:reward"}]`: the RL reward is the scorer itself
