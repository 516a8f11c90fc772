"""rewards.pool — a process pool with a HARD per-item timeout, for per-item reward work that may hang or crash.

Owns: `RewardPool` and its worker processes. Why not concurrent.futures.ProcessPoolExecutor: it cannot stop a
task that hangs (a sympy simplification, a giant integer power computed in C that no signal interrupts), and a
worker that dies breaks the whole executor. Here each worker is a process we own, fed ONE item at a time over
its own pipe; the dispatcher waits on the pipes and the process sentinels with the earliest deadline, and:

  * an item past `timeout_s` gets its worker SIGKILLed: the item is reported `timeout`, a new worker is started;
  * a worker that dies mid-item (segfault, os._exit, OOM kill) reports the item as `crash`, and is replaced;
  * an exception in the item function is reported as `error` and the worker keeps serving.

So a batch always completes, in about ceil(items / workers) * timeout_s in the worst case. Worker deadlines
start when the item is handed to a worker that has finished starting (workers say "ready" after importing
`preload`), so slow start-up is never charged to an item.

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
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)

OK, ERROR, TIMEOUT, CRASH = "ok", "error", "timeout", "crash"


@dataclass
class ItemResult:
    value: Any          # the function's return value; None unless status == "ok"
    status: str         # ok | error | timeout | crash
    seconds: float      # from hand-over to a worker until the result (or the kill)
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


class _Worker:
    def __init__(self, ctx, preload: tuple[str, ...], init: Callable | None):
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child, preload, init), daemon=True,
                                name="fbrl-reward-worker")
        self.proc.start()
        child.close()
        self.started = time.monotonic()
        self.ready = False
        self.item: int | None = None
        self.deadline = 0.0
        self.dispatched = 0.0

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

    def __init__(self, num_workers: int = 2, timeout_s: float = 10.0, *, preload: Sequence[str] = (),
                 init: Callable | None = None, start_method: str = "forkserver", startup_timeout_s: float = 120.0):
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
            self._ctx.set_forkserver_preload(sorted({"rewards.pool", *self.preload}))
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self.stats = {"items": 0, "errors": 0, "timeouts": 0, "crashes": 0, "restarts": 0}
        self._closed = False
        with self._lock:
            self._workers = [_Worker(self._ctx, self.preload, self.init) for _ in range(num_workers)]

    # -- public -------------------------------------------------------------------------------------------------
    def map(self, fn: Callable, items: Sequence[tuple]) -> list[ItemResult]:
        """Results in item order. Never raises for an item; raises RuntimeError only if workers cannot start."""
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardPool is closed")
            return self._run(fn, list(items))

    async def amap(self, fn: Callable, items: Sequence[tuple]) -> list[ItemResult]:
        return await asyncio.to_thread(self.map, fn, items)

    def warmup(self) -> None:
        """Block until every worker has started (benchmarks use it to keep start-up out of the timing)."""
        with self._lock:
            self._run(_noop, [() for _ in range(self.num_workers)])

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
    def _replace(self, w: _Worker) -> None:
        w.kill()
        self._workers[self._workers.index(w)] = _Worker(self._ctx, self.preload, self.init)
        self.stats["restarts"] += 1

    def _finish(self, results: list, w: _Worker, status: str, value: Any = None, error: str = "") -> None:
        results[w.item] = ItemResult(value, status, time.monotonic() - w.dispatched, error)
        self.stats["items"] += 1
        if status != OK:
            self.stats[{ERROR: "errors", TIMEOUT: "timeouts", CRASH: "crashes"}[status]] += 1
        w.item = None

    def _run(self, fn: Callable, items: list[tuple]) -> list[ItemResult]:
        results: list[ItemResult | None] = [None] * len(items)
        pending = deque(range(len(items)))
        failed_starts = 0
        while pending or any(w.item is not None for w in self._workers):
            for w in list(self._workers):
                if w.ready and w.item is None and pending:
                    i = pending.popleft()
                    w.item, w.dispatched = i, time.monotonic()
                    w.deadline = w.dispatched + self.timeout_s
                    try:
                        w.conn.send((fn, items[i]))
                    except (BrokenPipeError, OSError):  # died while idle: the item never ran, so requeue it
                        pending.appendleft(i)
                        w.item = None
                        self._replace(w)
            now = time.monotonic()
            deadlines = [w.deadline if w.item is not None else w.started + self.startup_timeout_s
                         for w in self._workers if w.item is not None or not w.ready]
            timeout = max(0.0, min(deadlines) - now) if deadlines else 0.0
            watched = {}
            for w in self._workers:
                if w.item is not None or not w.ready:
                    watched[w.conn] = w
                    watched[w.proc.sentinel] = w
            ready = set(wait(list(watched), timeout=timeout))
            now = time.monotonic()
            for w in list(self._workers):
                got_msg = w.conn in ready
                if got_msg:
                    try:
                        kind, payload = w.conn.recv()
                    except (EOFError, OSError):
                        got_msg = False
                    else:
                        if not w.ready:
                            if kind == "failed":
                                raise RuntimeError(f"reward worker failed to start (preload {self.preload}):\n"
                                                   f"{payload}")
                            w.ready, failed_starts = True, 0
                        else:
                            self._finish(results, w, kind, payload if kind == OK else None,
                                         "" if kind == OK else payload)
                        continue
                dead = w.proc.sentinel in ready or (w.conn in ready and not got_msg)
                if dead:
                    if w.item is not None:
                        w.proc.join(1)  # the pipe can report EOF a moment before the process is reaped
                        code = w.proc.exitcode
                        self._finish(results, w, CRASH, error=f"worker died (exit code {code})")
                        log.warning("reward worker %s died (exit code %s); replaced", w.proc.pid, code)
                    else:
                        failed_starts += 1
                    self._replace(w)
                elif w.item is not None and now >= w.deadline:
                    self._finish(results, w, TIMEOUT, error=f"no result within {self.timeout_s:g} s; worker killed")
                    self._replace(w)
                elif not w.ready and now >= w.started + self.startup_timeout_s:
                    failed_starts += 1
                    self._replace(w)
                if failed_starts > 2 * self.num_workers:
                    raise RuntimeError(f"reward workers keep failing to start (start method "
                                       f"{self._ctx.get_start_method()}, preload {self.preload})")
        return results  # type: ignore[return-value]


def _noop() -> None:
    return None
