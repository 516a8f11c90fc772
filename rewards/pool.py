"""rewards.pool — a process pool with a HARD per-item timeout, for per-item reward work that may hang or crash.

Owns: `RewardPool` and its worker processes. Why not concurrent.futures.ProcessPoolExecutor: it cannot stop a
task that hangs (a sympy simplification, a giant integer power computed in C that no signal interrupts), and a
worker that dies breaks the whole executor. Here each worker is a process we own that runs ONE item at a time,
fed over its own pipe; the dispatcher waits on the pipes and the process sentinels until the earliest
deadline, and:

  * an item past `timeout_s` gets its worker SIGKILLed: the item is reported `timeout`, a new worker is started;
  * a worker that dies mid-item (segfault, os._exit, OOM kill) reports the item as `crash`, and is replaced;
  * an exception in the item function is reported as `error` and the worker keeps serving.

So a batch always completes, in about ceil(items / workers) * timeout_s in the worst case. An item's deadline
starts when its worker starts it: at hand-over to an idle worker, or when the result of the item before it
arrives. Workers say "ready" after importing `preload` and running `init`, so start-up is never charged to
an item. Each worker also holds ONE small item queued behind the running one (pickled <= 64 KiB, so it fits
the pipe's buffer and a send never blocks behind a hung item): on a loaded machine the worker then does not sit
idle waiting for the dispatcher to be scheduled between items. When a worker is killed or dies, its queued item
never ran and goes back to the pending list.

Start method: 'forkserver' by default (or 'spawn'), never 'fork': forking a process that runs threads (Ray
actors, vLLM, the training loop) can deadlock the child. With forkserver the `preload` modules (math-verify,
sympy) are imported once in the fork server, so replacing a killed worker takes milliseconds instead of a
fresh interpreter start. Items run in the worker's main thread, so math-verify's signal-based timeouts work
there. `map` may be called from any thread, asyncio (via `amap`) or Ray actor; calls are serialized by a lock.
Scripts that create a pool need an `if __name__ == "__main__":` guard (spawn/forkserver import the main module's
path for their children).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from typing import Any

log = logging.getLogger(__name__)

OK, ERROR, TIMEOUT, CRASH = "ok", "error", "timeout", "crash"
_QUEUE_BYTES = 64 * 1024  # largest pickled item queued behind a running one (pipe buffers are >= 200 KiB)


@dataclass
class ItemResult:
    value: Any  # the function's return value; None unless status == "ok"
    status: str  # ok | error | timeout | crash
    seconds: float  # from hand-over to a worker until the result (or the kill)
    error: str = ""


def _worker_main(conn, preload: tuple[str, ...], init: Callable | None) -> None:
    """Worker loop: import preload, run init, say ready, then run one (fn, args) at a time until the pipe closes."""
    # Ctrl-C belongs to the parent, which kills us; a KeyboardInterrupt here would only print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for name in preload:
            importlib.import_module(name)
        if init is not None:
            init()
    except BaseException:
        conn.send(("failed", traceback.format_exc()))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # parent gone or pool closed
        if msg is None:
            return
        fn, args = msg
        try:
            out = (OK, fn(*args))
        except BaseException as e:  # math-verify's TimeoutException is a BaseException too
            out = (ERROR, f"{type(e).__name__}: {e}"[:2000])
        try:
            conn.send(out)
        except Exception as e:  # an unpicklable result costs this item, not the worker
            conn.send((ERROR, f"result could not be sent: {type(e).__name__}: {e}"[:2000]))


class _Pending:
    """Items not yet handed to a worker, grouped by key, so that items sharing a key (a gold answer) go to the
    same worker and hit its caches. A worker keeps taking from its group; when that is empty it claims the next
    unclaimed group, and when none is left it takes from the back of the largest group (so no worker idles
    while another still has a queue). Without keys every item is its own group: plain first-in, first-out."""

    def __init__(self, keys: Sequence[Any]):
        self.key_of = list(keys)
        self.groups: dict[Any, deque[int]] = {}
        for i, k in enumerate(self.key_of):
            self.groups.setdefault(k, deque()).append(i)
        self.unclaimed: deque = deque(self.groups)
        self.n = len(self.key_of)

    def __bool__(self) -> bool:
        return self.n > 0

    def take(self, w: _Worker) -> int:
        q = self.groups.get(w.key)
        if not q:
            while self.unclaimed and self.unclaimed[0] not in self.groups:
                self.unclaimed.popleft()
            if self.unclaimed:
                w.key = self.unclaimed.popleft()
                q = self.groups[w.key]
            else:
                w.key = max(self.groups, key=lambda k: len(self.groups[k]))
                return self._pop(w.key, q=self.groups[w.key], back=True)
        return self._pop(w.key, q)

    def _pop(self, key: Any, q: deque, back: bool = False) -> int:
        i = q.pop() if back else q.popleft()
        if not q:
            del self.groups[key]  # only non-empty groups stay, so stealing scans few
        self.n -= 1
        return i

    def take_any(self) -> int:
        """Some pending item, for a caller that will not run it."""
        key = next(iter(self.groups))
        return self._pop(key, self.groups[key])

    def put_back(self, i: int) -> None:
        """An item that never ran goes back to the front of its group, which is up for claiming again."""
        k = self.key_of[i]
        self.groups.setdefault(k, deque()).appendleft(i)
        self.unclaimed.appendleft(k)
        self.n += 1


class _Worker:
    def __init__(self, ctx, preload: tuple[str, ...], init: Callable | None):
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(
            target=_worker_main, args=(child, preload, init), daemon=True, name="fbrl-reward-worker"
        )
        self.proc.start()
        child.close()
        self.started = time.monotonic()
        self.ready = False
        self.queue: deque[int] = deque()  # item indices sent, in order; queue[0] is running
        self.key: Any = None  # the item group it is working through (see _Pending)
        self.head_started = 0.0  # when queue[0] started (as seen by the dispatcher)

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.join(5)
        except Exception:
            pass
        self.conn.close()


class RewardPool:
    """`num_workers` processes; `map(fn, items)` runs `fn(*item)` for each item with a hard `timeout_s`.

    `fn` must be a module-level function (it is pickled by reference); items and results must pickle.
    `preload` modules are imported before a worker is ready (in the fork server too, with forkserver) and
    `init`, a module-level function, then runs once in each worker (e.g. a first parse that loads lazy parser
    tables), so neither cost is charged to an item's timeout.
    """

    def __init__(
        self,
        num_workers: int = 2,
        timeout_s: float = 10.0,
        *,
        preload: Sequence[str] = (),
        init: Callable | None = None,
        start_method: str = "forkserver",
        startup_timeout_s: float = 120.0,
    ):
        if start_method not in ("forkserver", "spawn"):
            raise ValueError("start_method must be 'forkserver' or 'spawn' ('fork' is unsafe beside threads)")
        if num_workers < 1 or timeout_s <= 0:
            raise ValueError("need num_workers >= 1 and timeout_s > 0")
        self.num_workers, self.timeout_s = num_workers, float(timeout_s)
        self.preload, self.init = tuple(preload), init
        self.startup_timeout_s = startup_timeout_s
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver" and self.preload:
            # Global to this process's fork server; only takes effect if the server is not running yet.
            self._ctx.set_forkserver_preload(list(dict.fromkeys(("rewards.pool", *self.preload))))
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self.stats = {"items": 0, "errors": 0, "timeouts": 0, "crashes": 0, "restarts": 0}
        self._closed = False
        with self._lock:
            self._workers = [_Worker(self._ctx, self.preload, self.init) for _ in range(num_workers)]

    # -- public -------------------------------------------------------------------------------------------------
    def map(
        self, fn: Callable, items: Sequence[tuple], keys: Sequence[Any] | None = None, budget_s: float | None = None
    ) -> list[ItemResult]:
        """Results in item order. Never raises for an item; raises RuntimeError only if workers cannot start.

        `keys` (hashable, one per item) are an affinity hint: items with one key go to one worker when possible.
        `budget_s` bounds the whole batch: items not started `budget_s` seconds after the call are reported
        `timeout` without running (the running ones keep their own `timeout_s`), so a batch of hanging items
        takes about budget_s + timeout_s instead of ceil(items / workers) * timeout_s.
        """
        items = list(items)
        if keys is not None and len(keys) != len(items):
            raise ValueError(f"{len(keys)} keys for {len(items)} items")
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardPool is closed")
            return self._run(fn, items, keys, budget_s=budget_s)

    async def amap(
        self, fn: Callable, items: Sequence[tuple], keys: Sequence[Any] | None = None, budget_s: float | None = None
    ) -> list[ItemResult]:
        return await asyncio.to_thread(self.map, fn, items, keys, budget_s)

    def warmup(self) -> None:
        """Block until every worker has started (benchmarks use it to keep start-up out of the timing)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardPool is closed")
            self._run(None, [], None, until_ready=True)

    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for w in self._workers:
                try:
                    w.conn.send(None)
                except Exception:
                    pass
            for w in self._workers:
                w.proc.join(2)
                w.kill()
            self._workers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- dispatcher ---------------------------------------------------------------------------------------------
    def _record(self, results: list, i: int, status: str, seconds: float, value: Any = None, error: str = "") -> None:
        results[i] = ItemResult(value, status, seconds, error)
        self.stats["items"] += 1
        if status != OK:
            self.stats[{ERROR: "errors", TIMEOUT: "timeouts", CRASH: "crashes"}[status]] += 1

    def _retire(self, w: _Worker, results: list, pending: _Pending, status: str, error: str) -> None:
        """Kill/reap w, charge its running item with `status`, requeue the items queued behind it, replace it."""
        w.kill()
        if w.queue:
            self._record(results, w.queue.popleft(), status, time.monotonic() - w.head_started, error=error)
            for i in reversed(w.queue):  # never ran: back to the front, in order
                pending.put_back(i)
        self._workers[self._workers.index(w)] = _Worker(self._ctx, self.preload, self.init)
        self.stats["restarts"] += 1

    def _abort(self) -> None:
        """Workers cannot start (a broken preload/init): close the pool rather than retry forever."""
        self._closed = True
        for w in self._workers:
            w.kill()
        self._workers = []

    def _dispatch(self, fn: Callable | None, items: list[tuple], pending: _Pending, results: list) -> None:
        # Idle workers first (depth 1), then one queued item each (depth 2).
        for depth, w in [(d, w) for d in (1, 2) for w in list(self._workers)]:
            if w not in self._workers:
                continue  # replaced during this pass
            while w.ready and pending and len(w.queue) < depth:
                i = pending.take(w)
                try:
                    payload = ForkingPickler.dumps((fn, items[i]))
                except Exception as e:  # an item that cannot be sent fails alone
                    self._record(results, i, ERROR, 0.0, error=f"item could not be sent: {type(e).__name__}: {e}")
                    continue
                if w.queue and len(payload) > _QUEUE_BYTES:
                    pending.put_back(i)  # a big item waits for an idle worker: its send could block behind a hang
                    break
                try:
                    w.conn.send_bytes(payload)
                except (BrokenPipeError, OSError):  # died: the running item crashed, i never ran
                    pending.put_back(i)
                    self._retire(w, results, pending, CRASH, "worker died")
                    break
                if not w.queue:
                    w.head_started = time.monotonic()
                w.queue.append(i)

    def _run(
        self,
        fn: Callable | None,
        items: list[tuple],
        keys: Sequence[Any] | None,
        until_ready: bool = False,
        budget_s: float | None = None,
    ) -> list[ItemResult]:
        results: list[ItemResult | None] = [None] * len(items)
        budget_end = None if budget_s is None else time.monotonic() + budget_s
        pending = _Pending(range(len(items)) if keys is None else keys)
        failed_starts = 0
        for w in list(self._workers):
            w.key = None
            if w.queue:  # left busy by an interrupted call (Ctrl-C in wait): its results would be misfiled
                w.queue.clear()
                self._retire(w, results, pending, CRASH, "")
        while pending or any(w.queue or (until_ready and not w.ready) for w in self._workers):
            if budget_end is not None and time.monotonic() >= budget_end:
                while pending:  # the batch's time is up: what has not started never will
                    note = f"not started within the batch budget of {budget_s:g} s"
                    self._record(results, pending.take_any(), TIMEOUT, 0.0, error=note)
            self._dispatch(fn, items, pending, results)
            now = time.monotonic()
            watched = {}
            deadlines = [budget_end] if budget_end is not None and pending else []  # the batch's, then each item's
            for w in self._workers:
                if w.queue or not w.ready:
                    watched[w.conn] = watched[w.proc.sentinel] = w
                    deadlines.append(w.head_started + self.timeout_s if w.queue else w.started + self.startup_timeout_s)
            ready = set(wait(list(watched), timeout=max(0.0, min(deadlines) - now) if deadlines else 0.0))
            for w in list(self._workers):
                got_msg = False
                while w.conn in ready and w.conn.poll():
                    try:
                        kind, payload = w.conn.recv()
                    except (EOFError, OSError):
                        break
                    got_msg = True
                    now = time.monotonic()
                    if not w.ready:
                        if kind == "failed":
                            self._abort()
                            raise RuntimeError(f"reward worker failed to start (preload {self.preload}):\n{payload}")
                        w.ready, failed_starts = True, 0
                    elif w.queue:
                        i = w.queue.popleft()
                        self._record(
                            results,
                            i,
                            kind,
                            now - w.head_started,
                            payload if kind == OK else None,
                            "" if kind == OK else payload,
                        )
                        w.head_started = now  # the queued item (if any) starts now
                if got_msg:
                    continue
                now = time.monotonic()
                if w.proc.sentinel in ready or w.conn in ready:  # readable without a message: EOF, it died
                    w.proc.join(1)  # the pipe can report EOF a moment before the process is reaped
                    code = w.proc.exitcode
                    if w.queue:
                        log.warning("reward worker %s died (exit code %s); replaced", w.proc.pid, code)
                    else:
                        failed_starts += 1
                    self._retire(w, results, pending, CRASH, f"worker died (exit code {code})")
                elif w.queue and now >= w.head_started + self.timeout_s:
                    self._retire(w, results, pending, TIMEOUT, f"no result within {self.timeout_s:g} s; worker killed")
                elif not w.ready and now >= w.started + self.startup_timeout_s:
                    failed_starts += 1
                    self._retire(w, results, pending, CRASH, "worker did not start")
                if failed_starts > 2 * self.num_workers:
                    self._abort()
                    raise RuntimeError(
                        f"reward workers keep failing to start (start method "
                        f"{self._ctx.get_start_method()}, preload {self.preload})"
                    )
        return results  # type: ignore[return-value]
