"""Supervision of the Ray workers: an actor's death is noticed, the actor replaced, and its work done again.

The worker objects on Ray (`RolloutFleet`, `LearnerGroup`, `RewardWorkersOnRay`) wait for their actors with
`gather`, which tells an actor's death (its process is gone: SIGKILL, OOM killer, a lost node) apart from an
error its method raised, and hands the death to the worker object's own recovery:

- rollout actor: a new actor on the same placement bundle loads the current weights and version through the
  fleet's own `load_weights` (the last sync is replayed), and the chunk of the request the dead one held is issued
  again with the same seeds, so the step gets the samples it would have had (file and ray weight sync; with vLLM's
  native transfer, nccl / ipc / native_ray, a new engine cannot join the transfer group after the first sync, and
  the job stops with `RunStopped` instead: actors/weight_sync.py `NativeSync`);
- learner rank: every rank is killed (the others are bound to the dead one by collectives) and a new group starts
  at the initial weights; the group raises `rl.train.faults.LearnerRebuilt` and the loop restores the last checkpoint;
- reward actor: restarted, and the batch scored again.

`Supervisor` counts every replacement (`faults/rollout_restarts`, `faults/learner_rebuilds`,
`faults/reward_restarts`), logs it in one line, and past the role's bound (`faults.max_*`) stops the job with
`RunStopped` instead (`fbrl train --resume RUN_DIR` continues from the last checkpoint).

Orphans: an actor made by `actor_class` also exits when its parent process (the node's raylet) is gone, so an
engine or a learner rank busy in native code never outlives its job (`exit_with_parent`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from rl.train.faults import FaultLog, RunStopped

log = logging.getLogger(__name__)

# role -> (fault counter, the config key that bounds it)
ROLES = {
    "rollout": ("rollout_restarts", "max_rollout_restarts"),
    "learner": ("learner_rebuilds", "max_learner_rebuilds"),
    "reward": ("reward_restarts", "max_reward_restarts"),
}


class Supervisor:
    """Counts replacements per role against `faults.max_*` (rl.config.FaultsConfig)."""

    def __init__(self, fcfg, faults: FaultLog | None = None):
        self.cfg, self.faults = fcfg, faults if faults is not None else FaultLog()
        self.restarts: Counter[str] = Counter()

    def watch(self, during: str, name: Callable[[int], str], samples: int = 0) -> Watch:
        """The deadline of a call handling `samples` samples (`faults.call_timeout_s` +
        `faults.call_timeout_per_sample_s` per sample; none when the first is 0), and its waiting lines."""
        base = self.cfg.call_timeout_s
        deadline = base + self.cfg.call_timeout_per_sample_s * samples if base > 0 else None
        return Watch(during, name, deadline, self.faults.log, self.cfg.waiting_log_s)

    def replacing(self, role: str, what: str, during: str, cause: BaseException) -> None:
        """Record that `what` (e.g. "rollout actor 0 (pid 123)") died (or hung: `CallTimeout`) during the call
        `during` and is being replaced; raise `RunStopped` when that would exceed the role's bound."""
        kind, key = ROLES[role]
        limit = getattr(self.cfg, key)
        n = self.restarts[role] + 1
        hung = isinstance(cause, CallTimeout)
        if hung:
            self.faults.add(f"{role}_timeouts")
        died = f"{what} {'hung' if hung else 'died'} during {during} ({describe(cause)})"
        if n > limit:
            raise RunStopped(
                f"{died}, and faults.{key}={limit} replacements are used up: stopping; "
                f"`fbrl train --resume RUN_DIR` continues from the last checkpoint"
            )
        self.restarts[role] = n
        self.faults.record(kind, f"{died}; replacing it ({n} of at most {limit})")


def lost_object(error: BaseException) -> bool:
    """Ray lost an object a call needed (`ObjectLostError`: its owner died, `OwnerDiedError`, or every copy went
    with a node), as the call's own error or as the cause Ray wrapped in a RayTaskError. The call cannot finish,
    and calling again does not bring the object back: a death, not a method's error."""
    from ray.exceptions import ObjectLostError

    return isinstance(error, ObjectLostError) or isinstance(getattr(error, "cause", None), ObjectLostError)


def is_death(error: BaseException) -> bool:
    """What `gather` hands to `on_death`: the actor's process is gone (`RayActorError`), or an object its call
    fetched was lost (`lost_object`)."""
    from ray.exceptions import RayActorError

    return isinstance(error, RayActorError) or lost_object(error)


def describe(cause: BaseException) -> str:
    """The first line of Ray's death notice (it carries the exit detail and the node)."""
    text = str(cause).strip().splitlines()
    return (text[0] if text else type(cause).__name__)[:200]


class CallTimeout(RuntimeError):
    """An actor call that did not return within its deadline (`Watch.deadline_s`). `gather` hands it to
    `on_death` like a death: an actor that hangs but stays alive (an engine stuck in native code, a collective
    waiting for a dead peer, a reward stuck in C) is killed, replaced, and its call issued again."""


@dataclass
class Watch:
    """How long `gather`'s calls may take and how a long wait is reported: `name(k)` says whose call k is (e.g.
    "rollout actor 1"), `during` what it runs; `say(line)` every `say_every_s` seconds while calls are pending."""

    during: str
    name: Callable[[int], str]
    deadline_s: float | None = None  # None: no deadline
    say: Callable[[str], None] | None = None
    say_every_s: float = 0.0  # 0: never


def gather(submit, n: int, on_death, error_grace_s: float = 0.0, watch: Watch | None = None) -> list:
    """Results of `submit(k)` for k in range(n) (each an ObjectRef of one actor call), in order.

    When the actor behind call k died, or an object its call fetched was lost (`is_death`), or the call passed
    `watch.deadline_s` (`CallTimeout`), `on_death(k, error)` replaces it and returns the ObjectRef that stands for
    call k now (or raises). An error raised by a method is re-raised as Ray raises it, after up to `error_grace_s`
    seconds more for the other calls: a collective fails on every rank when one rank dies, and the death, noticed
    a moment later, is what must be handled.
    """
    import ray

    refs: dict = {}
    started: dict[int, float] = {}

    def issue(k: int, ref) -> None:
        refs[ref], started[k] = k, time.monotonic()

    for k in range(n):
        issue(k, submit(k))
    out: list = [None] * n
    error, deadline = None, None
    said = time.monotonic()
    while refs:
        # waits of at most a second, so that a signal to the driver is handled promptly (its handler runs between
        # Python bytecodes, not inside Ray's blocking wait)
        timeout = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=timeout)
        for ref in ready:
            k = refs.pop(ref)
            try:
                out[k] = ray.get(ref)
            except Exception as e:
                if is_death(e):
                    issue(k, on_death(k, e))
                    continue
                if error is None:
                    error, deadline = e, time.monotonic() + error_grace_s
        if not ready and deadline is not None and time.monotonic() >= deadline:
            break  # the grace after a method's error is over
        if watch is not None and refs:
            said = _watch(watch, refs, started, said, lambda k, e: issue(k, on_death(k, e)))
    if error is not None:
        raise error
    return out


def _watch(watch: Watch, refs: dict, started: dict[int, float], said: float, replace) -> float:
    """Calls past their deadline replaced (`CallTimeout`); a line naming the calls still pending when one is
    due. Returns when a line was last said."""
    now = time.monotonic()
    if watch.deadline_s is not None:
        for ref, k in list(refs.items()):
            waited = now - started[k]
            if waited >= watch.deadline_s:
                del refs[ref]
                replace(
                    k,
                    CallTimeout(
                        f"no result after {waited:.0f} s, past the call's deadline of "
                        f"{watch.deadline_s:.0f} s (faults.call_timeout_s); killed"
                    ),
                )
    if watch.say is None or watch.say_every_s <= 0 or now - said < watch.say_every_s or not refs:
        return said
    pending = sorted(refs.values())
    left = "" if watch.deadline_s is None else f"; deadline in {watch.deadline_s - (now - started[pending[0]]):.0f} s"
    names = ", ".join(watch.name(k) for k in pending)
    watch.say(f"still waiting on {names} ({watch.during}) for {now - started[pending[0]]:.0f} s{left}")
    return now


# A new actor's process starts (imports, Ray's worker set-up) before its first call runs: seconds, more on a loaded
# machine, on top of the call's own deadline.
START_GRACE_S = 60.0


def wait_started(refs: list, what: str, watch: Watch | None, actors: list) -> list:
    """`ray.get(refs)`: the first calls of new actors (a replacement engine loading the last weights, a rebuilt
    learner group's setup), with the call deadline and its waiting lines. Actors that never start (no resources
    left, an engine stuck building itself) are killed past the deadline and the job stops, naming `what`: there is
    nothing left to replace them with."""
    import ray

    t0 = said = time.monotonic()
    while True:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=1.0)  # 1-s slices: signals stay handled
        if len(ready) == len(refs):
            return [ray.get(r) for r in refs]
        waited = time.monotonic() - t0
        if watch is None:
            continue
        deadline = None if watch.deadline_s is None else watch.deadline_s + START_GRACE_S
        if deadline is not None and waited >= deadline:
            for a in actors:
                kill(a)
            raise RunStopped(
                f"{what} did not start: no answer after {waited:.0f} s, past the call's deadline of "
                f"{watch.deadline_s:.0f} s (faults.call_timeout_s) plus {START_GRACE_S:.0f} s for a new process "
                f"to start; killed; stopping; `fbrl train --resume RUN_DIR` continues from the last checkpoint"
            )
        if watch.say is not None and watch.say_every_s > 0 and time.monotonic() - said >= watch.say_every_s:
            left = "" if deadline is None else f"; deadline in {deadline - waited:.0f} s"
            watch.say(f"still waiting on {what} to start ({watch.during}) for {waited:.0f} s{left}")
            said = time.monotonic()


def kill(actor) -> None:
    """End an actor's process now (a dead one: no-op); Ray does not restart it."""
    import ray

    try:
        ray.kill(actor, no_restart=True)
    except Exception as e:  # already gone, or Ray shutting down
        log.debug("ray.kill: %s", e)


def exit_with_parent(poll_s: float = 1.0) -> None:
    """Exit this process when its parent is gone (a Ray worker's parent is its node's raylet, which Ray ends with
    the job). A daemon thread polls `getppid()`: it needs no cooperation from a main thread that may be busy in
    native code (a vLLM step, a gloo collective) when the job ends."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="fbrl-exit-with-parent").start()


def actor_class(cls):
    """`cls` as a Ray actor class whose process exits with its parent and reports its pid (`pid()`)."""
    import ray

    class Actor(cls):
        def __init__(self, *args, **kwargs):
            exit_with_parent()
            super().__init__(*args, **kwargs)

        def pid(self) -> int:
            return os.getpid()

    Actor.__name__ = Actor.__qualname__ = cls.__name__
    Actor.__doc__ = cls.__doc__
    return ray.remote(Actor)
