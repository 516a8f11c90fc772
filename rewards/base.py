"""rewards.base — the reward interface and `RewardSet`, which runs several rewards with weights and metrics.

Owns: the `RewardFn` protocol, `RewardResult` (a `list[float]` that can also carry its own error/timeout counts),
result validation, and the guarded call of user functions. The contract a user function meets:

    fn(prompts, completions, answers, **row_fields) -> list[float]      (or an awaitable of that list)

`RewardSet` never lets one reward sink a batch. A function that raises, hangs past its deadline, or returns
the wrong type/length scores 0 for the samples concerned; the failure is counted in the metrics under the
function's name, logged, and listed in `RewardSetResult.errors`. `errors` and `timeouts` count samples whose
score was replaced by 0 (a raising batch function costs n samples), the same unit the math reward uses.

How deadlines work: Python cannot kill a thread, so each call runs in a daemon helper thread that the caller
joins for `timeout_s` seconds; async functions run to completion in a fresh event loop in that thread under
`asyncio.wait_for`, which does cancel them. A sync function that overran keeps its thread until it returns by
itself; while that thread is alive the function is not called again (its batches score 0 as timeouts), so a
hung function costs at most one thread. Per-item work that can hang for real (sympy, user code in C) belongs in
`rewards.pool.RewardPool`, whose workers are processes that are killed. `timeout_s=None` calls the function
inline in the caller's thread (no deadline): use it for rewards that protect themselves, e.g. `MathReward`,
and for a user function that relies on signals (math-verify called directly with its default timeouts raises
"doesn't support threaded environment" in a helper thread; that shows up as a counted, named error).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import threading
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

log = logging.getLogger(__name__)


@runtime_checkable
class RewardFn(Protocol):
    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], answers: Sequence[Any], **row_fields: Any
    ) -> Sequence[float] | Awaitable[Sequence[float]]: ...


class RewardResult(list):
    """Scores (a plain list of floats) plus what the reward counted itself: items it scored 0 because of an
    error or a timeout, and named counters (e.g. the math reward's `no_answer`, `truncated`)."""

    def __init__(
        self,
        scores=(),
        errors: int = 0,
        timeouts: int = 0,
        counts: dict[str, int] | None = None,
        unscored: list[bool] | None = None,
    ):
        super().__init__(scores)
        self.errors = errors
        self.timeouts = timeouts
        self.counts = dict(counts or {})
        self.unscored = unscored  # per item: the reward declined it (TRL's None), its 0 is no judgement


def fn_name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _accepted_kwargs(fn: Any) -> set[str] | None:
    """Row-field names fn can take as keywords; None means all (it has **kwargs or no inspectable signature)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    # The first three positional slots are prompts, completions, answers.
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return {p.name for p in positional[3:] if p.kind is not p.POSITIONAL_ONLY} | {
        p.name for p in params if p.kind is p.KEYWORD_ONLY
    }


# A score beyond this is a bug (a sum that overflowed, an unnormalized count), not a reward: it counts as an error.
ABSURD_SCORE = 1e6


def _scalar(x: Any) -> bool:
    """A number with no length: int, float, bool, a numpy scalar, a 0-d numpy array or torch tensor."""
    return getattr(x, "ndim", None) == 0 or (isinstance(x, (int, float)) and not hasattr(x, "__len__"))


def validate_scores(out: Any, n: int) -> tuple[list[float], int, str]:
    """(scores, bad_items, problem). A wrong container or length fails the whole batch (n bad items, all 0);
    a non-numeric, non-finite or absurd (|score| > ABSURD_SCORE) element fails that item only. One number (a 0-d
    tensor or array, a numpy scalar) for a batch of one is that item's score; never raises."""
    if _scalar(out) and n == 1:
        out = [out]
    try:
        if isinstance(out, (str, bytes, dict, set)) or _scalar(out) or not hasattr(out, "__iter__"):
            raise TypeError
        size = len(out)
    except TypeError:  # (a 0-d tensor or array has __len__, and raises)
        what = f"one number ({type(out).__name__})" if _scalar(out) else type(out).__name__
        return [0.0] * n, n, f"returned {what}, expected a list of {n} floats"
    if size != n:
        return [0.0] * n, n, f"returned {size} scores for a batch of {n}"
    scores, bad, first = [], 0, ""
    for x in out:
        try:
            if isinstance(x, (str, bytes)):
                raise TypeError
            v = float(x.item() if getattr(x, "ndim", None) == 0 else x)  # numpy and 0-d torch scalars as numbers
            if not math.isfinite(v) or abs(v) > ABSURD_SCORE:
                raise ValueError
        except Exception:  # TypeError, ValueError, OverflowError, or whatever a user type's __float__ raises
            bad += 1
            first = first or f"returned a non-finite, absurd (|x| > {ABSURD_SCORE:g}) or non-numeric score {x!r:.80}"
            v = 0.0
        scores.append(v)
    return scores, bad, first


@dataclass
class RewardEntry:
    fn: Any
    weight: float = 1.0
    name: str = ""
    timeout_s: float | None = 60.0
    kwargs: set[str] | None = field(default=None, repr=False)
    running: threading.Thread | None = field(default=None, repr=False)


@dataclass
class RewardSetResult:
    rewards: list[float]  # weighted sum per sample
    per_reward: dict[str, list[float]]  # each reward's (unweighted) scores
    metrics: dict[str, float]  # rewards/<name>/{mean,errors,timeouts,latency_s,...}, rewards/total/mean
    errors: list[str]  # one readable line per failed call, naming the function
    # per sample: every weighted reward declined it (TRL's None from each): it has no reward to learn from
    unscored: list[bool] = field(default_factory=list)


class _Call:
    """One guarded call in a helper thread: result or exception, and whether it finished."""

    def __init__(self, entry: RewardEntry, args: tuple, kwargs: dict):
        self.kwargs = kwargs
        self.out: Any = None
        self.exc: BaseException | None = None
        self.done = threading.Event()
        self.t0 = time.perf_counter()
        self.seconds = 0.0
        self.timed_out = False
        self.thread = threading.Thread(
            target=self._run, args=(entry, args, kwargs), daemon=True, name=f"reward-{entry.name}"
        )

    def _run(self, entry: RewardEntry, args: tuple, kwargs: dict) -> None:
        self.t0 = time.perf_counter()  # latency of this call alone (inline calls run one after another)
        try:
            out = entry.fn(*args, **kwargs)
            if inspect.isawaitable(out):
                out = asyncio.run(self._bounded(out, entry.timeout_s))
            self.out = out
        except BaseException as e:  # reported to the caller, never raised in this thread
            self.exc = e
        finally:
            self.seconds = time.perf_counter() - self.t0
            self.done.set()

    async def _bounded(self, aw: Awaitable, timeout_s: float | None):
        # asyncio.wait (not wait_for) so a deadline is told apart from a TimeoutError the function raised itself.
        task = asyncio.ensure_future(aw)
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if done:
            return task.result()
        self.timed_out = True
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)  # let it unwind; one that ignores cancel is left behind
        return None


class RewardSet:
    """Several rewards with weights: `rs(prompts, completions, answers, **row_fields) -> RewardSetResult`.

    `rewards` items are a reward function, a `(fn, weight)` pair or a `RewardEntry`. Functions get the row
    fields their signature names (all of them if it has **kwargs). Calls with a deadline run concurrently, each
    in its own helper thread.
    """

    def __init__(self, rewards: Sequence[Any], timeout_s: float | None = 60.0):
        self.entries: list[RewardEntry] = []
        seen: set[str] = set()
        for r in rewards:
            e = (
                r
                if isinstance(r, RewardEntry)
                else (
                    RewardEntry(r[0], float(r[1]), timeout_s=timeout_s)
                    if isinstance(r, tuple)
                    else RewardEntry(r, timeout_s=timeout_s)
                )
            )
            base = e.name or fn_name(e.fn)
            name, k = base, 2
            while name in seen:  # two rewards of one name keep separate metrics
                name, k = f"{base}_{k}", k + 1
            seen.add(name)
            e.name = name
            e.kwargs = _accepted_kwargs(e.fn)
            self.entries.append(e)
        if not self.entries:
            raise ValueError("RewardSet needs at least one reward")

    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], answers: Sequence[Any], **row_fields
    ) -> RewardSetResult:
        n = len(completions)
        if len(prompts) != n or len(answers) != n:
            raise ValueError(f"batch sizes differ: {len(prompts)} prompts, {n} completions, {len(answers)} answers")
        args = (list(prompts), list(completions), list(answers))
        calls: dict[str, _Call | None] = {}
        skipped: set[str] = set()
        for e in self.entries:
            kw = row_fields if e.kwargs is None else {k: v for k, v in row_fields.items() if k in e.kwargs}
            if e.running is not None and e.running.is_alive():
                skipped.add(e.name)
                calls[e.name] = None
                continue
            calls[e.name] = c = _Call(e, args, kw)
            if e.timeout_s is not None:
                c.thread.start()
        for e in self.entries:  # inline ones (no deadline) in the caller's thread, while the others run
            c = calls[e.name]
            if c is not None and e.timeout_s is None:
                c._run(e, args, c.kwargs)
        total, per_reward, metrics, errors = [0.0] * n, {}, {}, []
        unscored = [any(e.weight != 0 for e in self.entries)] * n
        for e in self.entries:
            c = calls[e.name]
            scores, n_err, n_to, counts, problem, seconds = self._collect(e, c, n, e.name in skipped)
            declined = getattr(c.out, "unscored", None) if c is not None and not problem else None
            if e.weight != 0:
                unscored = [u and bool(declined and declined[i]) for i, u in enumerate(unscored)]
            if problem:
                msg = f"reward {e.name!r} {problem}"
                errors.append(msg)
                log.warning(msg)
            per_reward[e.name] = scores
            total = [t + e.weight * s for t, s in zip(total, scores)]
            pre = f"rewards/{e.name}/"
            metrics.update(
                {
                    pre + "mean": sum(scores) / n if n else 0.0,
                    pre + "errors": float(n_err),
                    pre + "timeouts": float(n_to),
                    pre + "latency_s": seconds,
                }
            )
            metrics.update({pre + k: float(v) for k, v in counts.items()})
        metrics["rewards/total/mean"] = sum(total) / n if n else 0.0
        metrics["rewards/unscored"] = float(sum(unscored))
        return RewardSetResult(total, per_reward, metrics, errors, unscored)

    def _collect(self, e: RewardEntry, c: _Call | None, n: int, skipped: bool):
        """(scores, errors, timeouts, counts, problem, seconds) for one reward's call."""
        if skipped or c is None:
            return [0.0] * n, 0, n, {}, "is still running from an earlier batch (hung); scored 0", 0.0
        if e.timeout_s is not None:
            c.done.wait(max(0.0, e.timeout_s - (time.perf_counter() - c.t0)))
        seconds = time.perf_counter() - c.t0
        if not c.done.is_set():
            e.running = c.thread  # not called again until this thread ends
            return [0.0] * n, 0, n, {}, f"timed out after {e.timeout_s:g} s; scored 0", seconds
        if c.timed_out:
            return [0.0] * n, 0, n, {}, f"timed out after {e.timeout_s:g} s; scored 0", c.seconds
        if c.exc is not None:
            return [0.0] * n, n, 0, {}, f"raised {type(c.exc).__name__}: {str(c.exc)[:300]}; scored 0", c.seconds
        scores, bad, problem = validate_scores(c.out, n)
        if problem and bad == n:  # the whole batch is unusable: ignore whatever the result says about itself
            return scores, n, 0, {}, problem + "; scored 0", c.seconds
        n_err = bad + int(getattr(c.out, "errors", 0))
        n_to = int(getattr(c.out, "timeouts", 0))
        counts = dict(getattr(c.out, "counts", {}))
        return scores, n_err, n_to, counts, (problem + "; scored 0") if problem else "", c.seconds

    async def acall(self, prompts, completions, answers, **row_fields) -> RewardSetResult:
        """For async callers (an async Ray actor, an asyncio rollout loop): runs the set off the event loop."""
        return await asyncio.to_thread(self.__call__, prompts, completions, answers, **row_fields)

    def close(self) -> None:
        for e in self.entries:
            close = getattr(e.fn, "close", None)
            if callable(close):
                close()
