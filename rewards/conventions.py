"""rewards.conventions — reward functions written for TRL, verl or OpenRLHF, called as those libraries call them.

fbrl's own contract is `fn(prompts, completions, answers, **row_fields) -> list[float]`. A `reward.fns` entry's
`convention` says how the function expects to be called instead; each adapter here turns it into fbrl's contract,
so `RewardSet` keeps its deadlines, error counts and metrics for all of them:

| convention | the call | returns |
|---|---|---|
| `fbrl` | `fn(prompts, completions, answers, **row_fields)` on the batch | a list of floats |
| `trl` | `fn(prompts=, completions=, completion_ids=, **columns)` by keyword on the batch, as TRL's GRPOTrainer calls it: chat rows give `prompts` as their messages and each completion as `[{"role": "assistant", "content": ...}]`; every dataset column but the prompt (the answer included, under `answer`) as a keyword list, and `trainer_state` / `log_metric` where the signature declares them or takes `**kwargs` | floats or `None` (`None` scores 0 in the weighted sum and is counted as `none`) |
| `verl` | `compute_score(data_source=, solution_str=, ground_truth=, extra_info=)` by keyword, once per completion | a float, or a dict whose `score` is the reward and whose other keys are logged (batch means) |
| `openrlhf` | `reward_func(queries, prompts, labels)` on the batch: `queries` are prompt + completion | `{"rewards": ..., "scores": ..., "extra_logs": {...}}` (or the rewards alone); extra logs are logged |

`auto` picks by signature: `solution_str` / `data_source` → verl; `queries` with `labels` → openrlhf; one of TRL's
own keywords (`completion_ids`, `trainer_state`, `log_metric`), or `**kwargs` with fewer than fbrl's three
positional arguments (`def reward(completions, **kwargs)`) → trl; anything else → fbrl. Async functions (a coroutine returned) are awaited in
every convention.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from rewards.base import RewardResult, fn_name

TRL_KEYWORDS = ("completion_ids", "trainer_state", "log_metric")
# fbrl's own keyword columns, not dataset columns: another library's function does not get them
FBRL_ONLY = ("finish_reasons", "completion_ids", "messages")


def _parameters(fn: Any) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None


def detect(fn: Any) -> str:
    """The convention `fn`'s signature says (see the module docstring); fbrl when it says nothing."""
    params = _parameters(fn)
    if params is None:
        return "fbrl"
    names = {p.name for p in params}
    if names & {"solution_str", "data_source"}:
        return "verl"
    if "queries" in names and "labels" in names:
        return "openrlhf"
    if names & set(TRL_KEYWORDS):
        return "trl"
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_any_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    takes_any_positional = any(p.kind is p.VAR_POSITIONAL for p in params)
    if len(positional) < 3 and takes_any_keyword and not takes_any_positional:
        return "trl"  # TRL passes every column by keyword, so its functions take **kwargs
    return "fbrl"


def _declared(fn: Any) -> set[str] | None:
    """Keyword names `fn` takes; None when it takes any (**kwargs, or no signature to read)."""
    params = _parameters(fn)
    if params is None or any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind is not p.POSITIONAL_ONLY}


def _resolve(out: Any) -> Any:
    return asyncio.run(out) if inspect.isawaitable(out) else out


class _Adapter:
    """Common part: the wrapped function's name (for metrics and messages) and its `close`."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.__name__ = fn_name(fn)
        self.keywords = _declared(fn)

    def close(self) -> None:
        close = getattr(self.fn, "close", None)
        if callable(close):
            close()


class TrlReward(_Adapter):
    """A TRL reward function (GRPOTrainer's `reward_funcs`), called as TRL calls it."""

    convention = "trl"

    def __init__(self, fn: Callable):
        super().__init__(fn)
        self.step = 0

    def __call__(self, prompts, completions, answers, **fields) -> RewardResult:
        messages = fields.get("messages")
        chat = messages is not None and all(isinstance(m, list) for m in messages)
        logged: dict[str, list[float]] = {}
        kw = {k: v for k, v in fields.items() if k not in FBRL_ONLY}
        kw["answer"] = list(answers)
        kw.update(
            prompts=list(messages) if chat else list(prompts),
            completions=[[{"role": "assistant", "content": c}] for c in completions] if chat else list(completions),
            completion_ids=fields.get("completion_ids") or [None] * len(completions),
            trainer_state=SimpleNamespace(global_step=self.step),
            log_metric=lambda name, value: logged.setdefault(name, []).append(float(value)),
        )
        if self.keywords is not None:
            kw = {k: v for k, v in kw.items() if k in self.keywords}
        self.step += 1
        out = _resolve(self.fn(**kw))
        if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__iter__"):
            return out  # RewardSet reports the wrong type
        out = list(out)
        none = sum(x is None for x in out)
        counts = {"none": none, **{k: sum(v) / len(v) for k, v in logged.items()}}
        return RewardResult([0.0 if x is None else x for x in out], counts=counts, unscored=[x is None for x in out])


class VerlReward(_Adapter):
    """A verl `compute_score(data_source, solution_str, ground_truth, extra_info)`, once per completion."""

    convention = "verl"

    def __call__(self, prompts, completions, answers, **fields) -> RewardResult:
        columns = {k: v for k, v in fields.items() if k not in FBRL_ONLY}
        n = len(completions)

        def call(i):
            row = {k: v[i] for k, v in columns.items()}
            extra = row.get("extra_info")
            kw = {
                "data_source": row.get("data_source"),
                "solution_str": completions[i],
                "ground_truth": answers[i],
                "extra_info": extra if extra is not None else row,
            }
            if self.keywords is not None:
                kw = {k: v for k, v in kw.items() if k in self.keywords}
            return self.fn(**kw)

        outs = [call(i) for i in range(n)]
        if any(inspect.isawaitable(o) for o in outs):  # an async compute_score: the batch's calls run together

            async def gather():
                return await asyncio.gather(*(o if inspect.isawaitable(o) else _done(o) for o in outs))

            outs = asyncio.run(gather())
        scores, logged = [], {}
        for o in outs:
            if isinstance(o, dict):
                for k, v in o.items():
                    if k != "score" and isinstance(v, (int, float)) and math.isfinite(v):
                        logged.setdefault(k, []).append(float(v))
                o = o.get("score")
            scores.append(o)
        return RewardResult(scores, counts={k: sum(v) / len(v) for k, v in logged.items()})


async def _done(value):
    return value


class OpenRlhfReward(_Adapter):
    """An OpenRLHF `reward_func(queries, prompts, labels)` (its remote reward function file's entry point)."""

    convention = "openrlhf"

    def __call__(self, prompts, completions, answers, **fields) -> RewardResult:
        queries = [p + c for p, c in zip(prompts, completions)]
        out = _resolve(self.fn(queries, list(prompts), list(answers)))
        logged = {}
        if isinstance(out, dict):
            for k, v in (out.get("extra_logs") or {}).items():
                values = _floats(v)
                if values:
                    logged[k] = sum(values) / len(values)
            out = out.get("rewards")
        return RewardResult(_floats(out) if out is not None else [], counts=logged)


def _floats(x: Any) -> list[float]:
    """A tensor, array, list or scalar as a list of floats."""
    if hasattr(x, "tolist"):
        x = x.tolist()
    return [float(v) for v in x] if isinstance(x, (list, tuple)) else [float(x)]


# a convention by name: the adapter that calls a function written for it with fbrl's contract (`reward.fns[].convention`
# offers these names, `auto` and `fbrl`; tests/test_config_choices.py keeps the schema equal to them)
ADAPTERS = {"trl": TrlReward, "verl": VerlReward, "openrlhf": OpenRlhfReward}
CONVENTIONS = ("auto", "fbrl", *ADAPTERS)


def adapt(fn: Callable, convention: str = "auto") -> tuple[Callable, str]:
    """(a function with fbrl's contract, the convention it was resolved to)."""
    known = ("auto", "fbrl", *ADAPTERS)  # (read at the call: an adapter registered later counts)
    if convention not in known:
        raise ValueError(f"convention: expected one of {', '.join(known)}, got {convention!r}")
    resolved = detect(fn) if convention == "auto" else convention
    return (ADAPTERS[resolved](fn) if resolved in ADAPTERS else fn), resolved
