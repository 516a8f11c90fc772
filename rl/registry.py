"""Name → function registries (`make_register`, `lookup`): the GRPO family's, the likelihood estimators', the engines' and
the weight transports'."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def make_register(registry: dict[str, Callable], kind: str) -> Callable[[str], Callable[[F], F]]:
    """Build a `@register_x("name")` decorator that adds a function to `registry`; duplicates are an error."""

    def register(name: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            if name in registry and registry[name] is not fn:
                raise ValueError(f"{kind} {name!r} is already registered")
            registry[name] = fn
            return fn

        return deco

    register.__doc__ = f"Decorator: `@register(name)` adds the function to the {kind} registry."
    return register


def lookup(registry: dict[str, Callable], kind: str, name: str) -> Callable:
    """Return `registry[name]`, or raise ValueError naming every valid choice."""
    try:
        return registry[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown {kind} {name!r}; valid choices: {', '.join(sorted(registry))}") from None
