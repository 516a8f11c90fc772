"""Bounds on one config field, declared on the field itself and checked by one validator.

A field carries its bound in its annotation, `steps: Annotated[int, ge(1)] = 30`; `load_config` checks every
declared bound of a section (`bound_problems`) before the section's own `validate()`, which holds only the rules
that relate several fields or need more than a range. A null value passes (`int | None` fields say "or null").
"""

from __future__ import annotations

import functools
import typing
from dataclasses import dataclass


@dataclass(frozen=True)
class Bound:
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself is out of bounds
    high_open: bool = False
    note: str = ""  # what a boundary value means, e.g. "(0: off)"
    expected: str = ""  # the allowed values in words, instead of the range

    def admits(self, value) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def problem(self, value, nullable: bool) -> str | None:
        """None when `value` is inside the bound, else the message: the rule and the value given."""
        if value is None or self.admits(value):
            return None
        null = " or null" if nullable else ""
        note = f" {self.note}" if self.note else ""
        if self.expected:
            return f"expected {self.expected}{null}, got {value}"
        if self.high is None:
            return f"must be {'>' if self.low_open else '>='} {self.low}{null}{note}, got {value}"
        lo, hi = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"expected a value in {lo}{self.low}, {self.high}{hi}{null}{note}, got {value}"


def ge(low, note: str = "") -> Bound:
    return Bound(low=low, note=note)


def gt(low, note: str = "") -> Bound:
    return Bound(low=low, low_open=True, note=note)


def within(low, high, *, low_open=False, high_open=False, note: str = "", expected: str = "") -> Bound:
    return Bound(low, high, low_open, high_open, note, expected)


@functools.cache
def declared_bounds(cls) -> dict[str, tuple[Bound, bool]]:
    """{field: (its bound, whether it may be null)} of a config section class (its bases' fields included)."""
    out = {}
    for name, tp in typing.get_type_hints(cls, include_extras=True).items():
        bound = next((m for m in getattr(tp, "__metadata__", ()) if isinstance(m, Bound)), None)
        if bound is not None:
            out[name] = (bound, type(None) in typing.get_args(tp.__origin__))
    return out


def bound_problems(section):
    """(field, message) for every field of `section` outside its declared bound."""
    for name, (bound, nullable) in declared_bounds(type(section)).items():
        message = bound.problem(getattr(section, name), nullable)
        if message:
            yield name, message
