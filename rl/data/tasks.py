"""The tasks of `data.task`, one table: `TASKS[name]` says where a task's rows come from, what its difficulty
counts, how its answers are checked and how the CLI describes it. The schema, the loaders, `fbrl eval`,
`fbrl compare-likelihood`, `fbrl pretrain` and the reward workers read it; a new task is one entry here.

A generated task makes its own rows (`make_rows(data, split, n)`, with `data` a `data` config section and
`split` the task's own split name) and takes `data.difficulty` (levels or chain lengths); a file task (`make_rows`
None) reads `data.train_path` / `data.test_path` through rl/data/sources.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from rl.data import arith, track, word_problems


@dataclass(frozen=True)
class Task:
    summary: str  # one phrase for the CLI's help
    make_rows: Callable[[Any, str, int], list[dict]] | None = None  # None: rows from data.*_path
    max_difficulty: int = 0  # generated: `data.difficulty` values lie in 1..max_difficulty
    difficulty_means: str = ""  # generated: what a difficulty value counts ("levels", "chain lengths")
    default_difficulty: tuple[int, ...] = ()  # generated: for a command given no difficulty and no checkpoint record
    strict_math: bool = False  # the math reward reads a literal answer only (arith: the format is part of the task)
    scorer: Callable | None = None  # the task's own correctness check, when it has one (state tracking)

    @property
    def generated(self) -> bool:
        return self.make_rows is not None


def _arith(data, split: str, n: int) -> list[dict]:
    return arith.generate(
        split, n, seed=data.seed, difficulties=tuple(data.difficulty), direct_answer_frac=data.direct_answer_frac
    )


def _word_problems(data, split: str, n: int) -> list[dict]:
    return word_problems.generate(
        split,
        n,
        seed=data.seed,
        difficulties=tuple(data.difficulty),
        numbers=getattr(data, "numbers", "standard"),
        shots=getattr(data, "shots", 2),
        calculator=getattr(data, "calculator", False),
    )


def _tracking_rows(name: str, data, split: str, n: int) -> list[dict]:
    return track.generate(name, split, n, seed=data.seed, lengths=tuple(data.difficulty))


def _tracking(name: str) -> Task:
    return Task(
        f"state tracking ({name})", partial(_tracking_rows, name), 64, "chain lengths", (8,), scorer=track.score
    )


TASKS: dict[str, Task] = {
    "arith": Task("synthetic arithmetic", _arith, 4, "levels", (1, 2, 3), strict_math=True),
    "word_problems": Task("templated chat word problems", _word_problems, 4, "levels", (1, 2)),
    **{name: _tracking(name) for name in ("cups", "cups_moved", "modsum", "parity")},
    "jsonl": Task("a JSONL file"),
    "json": Task("a JSON file (a list of rows)"),
    "parquet": Task("a parquet file"),
    "csv": Task("a CSV file"),
    "hf_disk": Task("a `datasets` save_to_disk directory"),
    "hub": Task("a Hugging Face Hub dataset id (data.hub_config, the splits)"),
}


def generated_tasks() -> tuple[str, ...]:
    return tuple(name for name, t in TASKS.items() if t.generated)


def file_tasks() -> tuple[str, ...]:
    return tuple(name for name, t in TASKS.items() if not t.generated)


def tasks_help() -> str:
    """`name: summary; ...` for the CLI's help."""
    return "; ".join(f"{name}: {t.summary}" for name, t in TASKS.items())
