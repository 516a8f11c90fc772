"""One `fbrl train` job from the first line it prints to its exit code: `Session` owns the stop signals, Ray, the
workers' start, the trackers, the live plots, the progress bar, closing the rewards, shutdown and the summary.

    with Session(cfg, run_dir, no_ray, t_start, ray_start) as session:
        rollout, learner, rewards = session.start_workers(python_fns)
        train(..., log=session.log, progress=session.on_step, faults=session.faults, stop_requested=session.stop.reason)
    return session.exit_code()

A stop (a stop rule, a signal) ends the `with` block quietly: teardown runs, the summary is printed and
`exit_code` says how the job ended. Any other exception still tears down, then propagates with its traceback.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path


class Session:
    def __init__(self, cfg, run_dir, no_ray: bool, t_start: float, ray_start=None):
        """`ray_start`: the Ray already being started (`actors.placement.RayStart`, launch.py starts it beside the
        input checks); None: started by `start_workers`."""
        from rl.train.faults import FaultLog

        self.cfg, self.run_dir, self.no_ray, self.t_start = cfg, run_dir, no_ray, t_start
        self.ray_start = ray_start
        self.faults = FaultLog(print)
        self.stop = StopSignals()
        self.steps = {}  # step -> its metrics (a step run again: the last)
        self.stopped = None
        self.trackers = self.bar = self.plots = self.rewards = self.worker_logs = None
        self.in_process = ()  # (rollout, learner) of a --no-ray job, closed at teardown
        self.log = lambda line: print(line, flush=True)

    def __enter__(self):
        self.stop.install()
        return self

    def start_workers(self, python_fns=None):
        """Ray (unless --no-ray), the rollout, learner and reward workers, then the trackers, the plots and the bar."""
        from actors import console
        from actors.placement import RayStart, build_workers
        from actors.trackers import Trackers
        from rl.report.live_plots import LivePlots

        cfg = self.cfg
        t_wait = time.perf_counter()
        ray_s = None
        if not self.no_ray:
            self.ray_start = self.ray_start or RayStart(cfg)
            ray_s = self.ray_start.wait()
            self.stop.install()  # ray.init installs its own SIGTERM handler (kill Ray, exit 1): ours goes back on top
        ray_wait_s = time.perf_counter() - t_wait
        print(workers_line(cfg, not self.no_ray), flush=True)
        t_workers, startup = time.perf_counter(), {}
        workers = build_workers(
            cfg, use_ray=not self.no_ray, faults=self.faults, startup=startup, python_fns=python_fns
        )
        self.rewards = workers[2]
        if self.no_ray:  # in-process engines and ranks end with the job, not whenever they are garbage-collected
            self.in_process = workers[:2]
        now = time.perf_counter()
        print(ready_line(now - t_workers, ray_s, ray_wait_s, startup, now - self.t_start), flush=True)
        self.worker_logs = worker_logs_dir(self.no_ray)
        self.trackers = Trackers(cfg, self.run_dir)
        self.bar = console.progress_bar(cfg.train.steps, cfg.logging.progress)
        if self.bar is not None:
            self.log = lambda line: self.bar.write(line, file=sys.stdout)
        self.faults.log = self.log
        self.plots = LivePlots(self.run_dir, title=plot_title(cfg, self.run_dir), log=self.log)
        self.stop.graceful = True
        return workers

    def on_step(self, metrics: dict) -> None:
        self.steps[metrics["step"]] = metrics
        self.trackers.log(metrics)
        if self.bar is not None:
            self.bar.n = metrics["step"]
            self.bar.refresh()
        self.plots.update(metrics)

    def __exit__(self, kind, error, tb) -> bool:
        from rl.train.faults import RunStopped

        error = interruption(error) or error
        if isinstance(error, RunStopped):
            self.stopped = error
        elif isinstance(error, Interrupted):  # a second signal, or one during start-up: the last checkpoint stands
            self.stopped = RunStopped(
                f"{error}: stopped at once; the last checkpoint of {self.run_dir.path} stands", True, error.exit_code
            )
        written, wandb_dir = self._teardown()
        if error is None or self.stopped is not None:  # a bug keeps its traceback as the last thing printed
            self._summary(written, wandb_dir)
        return self.stopped is not None

    def _teardown(self):
        """Stop everything the session started; (the plots written, wandb's run folder or None)."""
        self.stop.graceful, self.stop.shutting_down = False, True
        if self.bar is not None:
            self.bar.close()
        if self.plots is not None:
            self.plots.finish()  # the final drawing, in its own process, beside the rest of the teardown
        if self.rewards is not None:  # a reward's close() (its client, its pool) runs, within a deadline
            close_rewards(self.rewards, REWARDS_CLOSE_S, give_up=lambda: self.stop.late is not None)
        wandb_dir = self.trackers.close() if self.trackers is not None else None
        for part in self.in_process:  # a vLLM engine collected later would tear down a live engine's groups
            part.close()
        if self.ray_start is not None:
            self.ray_start.stop()
        written = self.plots.wait() if self.plots is not None else self.run_dir.plot()
        self.stop.uninstall()
        return written, str(Path(wandb_dir).parent) if wandb_dir else None  # the run's folder, not its files/

    def _summary(self, written, wandb_dir) -> None:
        from actors import console

        print()
        seconds = time.perf_counter() - self.t_start
        logs = self.worker_logs if not self.cfg.logging.verbose else None
        for line in console.summary_lines(self.run_dir, self.cfg, seconds, written, wandb_dir, logs):
            print(line)

    def exit_code(self) -> int:
        """0; the stop's code (128 + a signal, or 3); 3 when every step was skipped."""
        from rl.train.faults import EXIT_STOPPED

        if self.stopped is not None:
            print(f"fbrl train: stopped: {self.stopped}", file=sys.stderr, flush=True)
            return self.stop.exit_code or self.stopped.exit_code
        # the whole run as metrics.jsonl holds it (a resumed run's earlier steps count: a resume whose few new
        # steps had no signal did not train "nothing"); a step run again after a restore: its last record
        records = self.run_dir.read_metrics() if self.steps else []
        history = list({r["step"]: r for r in records if r.get("step", 0) > 0}.values())
        if history and not any(not m.get("skipped") for m in history):
            print(
                f"fbrl train: error: the run trained nothing: all {len(history)} steps were skipped (no reward "
                f"signal, or non-finite loss); see the reward metrics in {self.run_dir.path / 'metrics.jsonl'}",
                file=sys.stderr,
                flush=True,
            )
            return EXIT_STOPPED
        return 0


def stop_exit_code(signum: int) -> int:
    """128 + the signal; SIGHUP and SIGQUIT end the job as SIGTERM does, and exit as it does (143)."""
    return 128 + (signal.SIGTERM if signum in (signal.SIGHUP, signal.SIGQUIT) else signum)


REWARDS_CLOSE_S = 30.0  # how long the end of a job waits for the rewards' close() (a client, a process pool)


def close_rewards(rewards, deadline_s: float, give_up=lambda: False) -> bool:
    """`rewards.close()`, waited for at most `deadline_s` seconds, in 1-s slices so that a signal is handled and
    `give_up()` (a signal during the teardown) ends the wait. A close that does not return (a hung reward actor, a
    user close() stuck) gets one line naming it and, on Ray, its actor killed (`rewards.kill()`); a close that
    raises gets one line. True when it closed."""
    done, failed = threading.Event(), []

    def close():
        try:
            rewards.close()
        except Exception as e:  # reported below, never raised in this thread
            failed.append(e)
        finally:
            done.set()

    threading.Thread(target=close, daemon=True, name="fbrl-close-rewards").start()
    t0 = time.monotonic()
    while not done.wait(1.0):
        waited = time.monotonic() - t0
        if waited >= deadline_s or give_up():
            why = "a signal arrived" if give_up() else f"past its deadline of {deadline_s:.0f} s"
            on_ray = hasattr(rewards, "kill")
            if on_ray:
                rewards.kill()
            what, done_with = ("the reward actor", "killed") if on_ray else ("the rewards' close()", "left behind")
            print(f"closing the rewards: {what} did not return after {waited:.0f} s ({why}); {done_with}", flush=True)
            return False
    if failed:
        print(f"closing the rewards failed: {type(failed[0]).__name__}: {failed[0]}", flush=True)
    return not failed


class Interrupted(BaseException):
    """A signal that must end the job now (raised from the handler into whatever the main thread runs)."""

    def __init__(self, signum: int):
        super().__init__(f"{signal.Signals(signum).name} received")
        self.exit_code = stop_exit_code(signum)


def interruption(error: BaseException | None) -> Interrupted | None:
    """The `Interrupted` behind `error`, if any: raised inside an extension's wait (Ray's `ray.wait` checks for
    signals in Cython), it comes back wrapped ("SystemError: ... returned a result with an exception set")."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, Interrupted):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


class StopSignals:
    """SIGTERM / SIGINT / SIGHUP (a closed terminal or ssh session) / SIGQUIT: the first one, once the loop runs
    (`graceful`), asks the loop to stop after the current step (`reason()`); before that, or a second one, raises
    `Interrupted` at once. Without SIGHUP and SIGQUIT here, Python's defaults would kill the driver mid-step (no
    checkpoint) or dump core."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)

    def __init__(self):
        self.graceful, self.received, self.exit_code, self._previous = False, None, None, {}
        self.shutting_down = False  # set while the workers are being stopped: a signal then ends waits at once
        self.late = None  # the signal that arrived while shutting down

    def install(self) -> None:
        for sig in self.SIGNALS:
            previous = signal.signal(sig, self._handle)
            self._previous.setdefault(sig, previous)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        self.exit_code = self.exit_code or stop_exit_code(signum)
        if self.shutting_down:  # the teardown is bounded; a signal now cuts its waits short (close_rewards)
            self.late = self.late or signal.Signals(signum).name
            return
        if self.graceful and self.received is None:
            self.received = signal.Signals(signum).name
            print(
                f"fbrl train: {self.received} received: stopping after the current step (send it again to stop "
                f"at once)",
                file=sys.stderr,
                flush=True,
            )
            return
        raise Interrupted(signum)

    def reason(self) -> str | None:
        return f"{self.received} received" if self.received else None


def workers_line(cfg, use_ray: bool) -> str:
    r, learner = cfg.rollout, cfg.learner
    where = "in-process workers" if not use_ray else (f"Ray at {cfg.ray.address}" if cfg.ray.address else "local Ray")
    engines = f"{r.num_engines} {r.engine} engine{'s' if r.num_engines > 1 else ''} ({r.decode_mode} decoding)"
    n = learner.num_workers if use_ray else 1  # in-process: one rank (actors/local.py)
    learners = f"{n} DeepSpeed learner{'s' if n > 1 else ''} (ZeRO-{learner.zero_stage})"
    return (
        f"starting {where}: {engines}, {learners}, {cfg.likelihood.estimator} estimator, rewards "
        f"{', '.join(f.name or f.fn for f in cfg.reward.fns)}"
    )


def ready_line(workers_s: float, ray_s: float | None, ray_wait_s: float, startup: dict, since_start_s: float) -> str:
    """`workers ready in N s (...)`: the start-up broken down: Ray's start (beside the input checks: how much of it
    was left to wait for after them), then when each role's actors were up (they come up at once)."""
    from actors.placement import startup_line

    line = f"workers ready in {workers_s:.0f} s"
    if startup:
        threads = startup.pop("threads", [])
        ray = f"Ray {ray_s:.1f} s, {ray_wait_s:.1f} s of it after the input checks" if ray_s else "Ray up already"
        line += f" ({ray}; {startup_line(startup, threads)}; {since_start_s:.0f} s since start)"
    return line


def plot_title(cfg, run_dir) -> str:
    return (
        f"{run_dir.path.name}: {Path(cfg.model.path or 'model').name}, {cfg.data.task}, "
        f"{cfg.rollout.decode_mode} decoding, {cfg.likelihood.estimator} estimator, "
        f"{cfg.train.prompts_per_step}x{cfg.rollout.n_samples_per_prompt} samples per step"
    )


def worker_logs_dir(no_ray: bool) -> str | None:
    """Ray's log directory on this node (where the quieted workers' output goes), if Ray runs here."""
    if no_ray:
        return None
    try:
        import ray

        return ray._private.worker._global_node.get_logs_dir_path() if ray.is_initialized() else None
    except Exception:  # a private API: the summary line is optional
        return None
