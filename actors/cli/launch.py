"""`fbrl train CONFIG [key=value ...] [--resume RUN_DIR]` — launch a GRPO-style job.

With no `ray.address` a private local Ray is started (dashboard off, loopback only, a token per run); on a cluster
submit with `ray job submit --address ... --working-dir . -- fbrl train configs/<config>.yaml` (docs/CLUSTER.md).
`--no-ray` runs the same loop with in-process workers, for debugging. With no CONFIG the embedded default
(configs/tiny.yaml) runs.

Before anything starts, the inputs are checked (actors/cli/preflight.py) and the run directory's rules applied
(rl/train/run_dir.py): a problem is one line on stderr and exit code 2, in seconds. `--resume RUN_DIR` takes the run's
own config.yaml (or the CONFIG given), plus overrides of fields that do not change the experiment. SIGTERM / SIGINT end
the job after the current step, which is checkpointed, with nothing left running (a second signal ends it at once); exit
code 128 + the signal. A stop rule, a spent restart bound, or a run that trained nothing: exit code 3. The end of every
run prints what trained, what was skipped and every fault (rl/train/faults.py, docs/RELIABILITY.md). `--print-config`
prints the resolved config (defaults included) and exits. What the console shows — one line per step, a progress bar on
a terminal, a summary, third-party output quieted unless `--verbose` — is actors/console.py; the plots (written during
the run) are rl/report/plots.py.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument(
        "config",
        nargs="?",
        default=None,
        help="YAML config (default: the embedded tiny job; with --resume: the run's own config.yaml)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        help="dotted key=value overrides, e.g. train.steps=4 (run_dir=PATH is short for train.run_dir=PATH)",
    )
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start a new run in a run_dir that holds an old one (its files are deleted)",
    )
    p.add_argument("--no-ray", action="store_true", help="in-process workers instead of Ray actors (debugging)")
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the fully resolved config (every default included) as YAML and exit",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show vLLM / Ray workers / DeepSpeed / wandb / transformers output (logging.verbose=true)",
    )


def _environment(cfg) -> None:
    # Set before anything imports wandb / vllm / ray: these are read at import or process start.
    os.environ.setdefault("WANDB_MODE", cfg.logging.wandb_mode)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load_train_config(args):
    """(config path, Config, the --resume run dir or None) from the command line: CONFIG (or the embedded default,
    or the resumed run's own config.yaml), overrides, flags. Creates nothing."""
    from rl.config import load_config
    from rl.config.loading import DEFAULT_CONFIG  # the embedded default job, wherever fbrl is installed
    from rl.train.run_dir import RunDir

    config_path = args.config
    if args.config and "=" in args.config and not Path(args.config).exists():  # `fbrl train key=value`
        args.overrides.insert(0, args.config)
        config_path = None
    if config_path is None:  # a resumed run keeps its own config; a new one gets the embedded default
        config_path = str(Path(args.resume) / "config.yaml") if args.resume else str(DEFAULT_CONFIG)
    # `run_dir=PATH` is the documented shorthand for `train.run_dir=PATH`
    overrides = [f"train.{o}" if o.startswith("run_dir=") else o for o in args.overrides]
    run_dir = None
    if args.resume:
        run_dir = RunDir.existing(args.resume)  # before anything else: a missing run is not created
        overrides += [f"train.resume={args.resume}", f"train.run_dir={args.resume}"]
    if getattr(args, "verbose", False):
        overrides.append("logging.verbose=true")
    return config_path, load_config(config_path, overrides), run_dir


def prepare(args):
    """(cfg, config path, run dir, tokenizer) with every input checked; raises an `rl.errors.InputError` naming
    the first bad one. Starts nothing (no Ray, no engine)."""
    from actors.cli.model_source import convert_stock_model, resolve_hub_ids
    from actors.cli.preflight import check_job
    from rl.config import ConfigError
    from rl.config.secrets import REDACTED
    from rl.train.run_dir import RunDir, durable_run_dir

    config_path, cfg, run_dir = load_train_config(args)
    cfg = resolve_hub_ids(cfg)
    if args.resume:
        run_dir.check_resume_config(cfg)  # refuse a changed experiment, naming the field
        hidden = _redacted_keys(cfg.to_dict(), REDACTED)
        if hidden:
            raise ConfigError(
                f"{', '.join(hidden)}: secret values are never saved with a run; resume with the "
                f"config that holds them: fbrl train CONFIG --resume {args.resume}"
            )
    python_fns = getattr(args, "python_fns", None)
    tokenizer, cfg = check_job(cfg, in_process=getattr(args, "no_ray", False), python_fns=python_fns)
    if not args.resume:
        # inside `ray job submit` the working dir is Ray's temporary copy: the run goes somewhere that lasts
        durable = durable_run_dir(cfg.train.run_dir, os.getcwd())
        if durable != cfg.train.run_dir:
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, run_dir=durable))
        run_dir = RunDir.new(cfg.train.run_dir, overwrite=args.overwrite)
        cfg = convert_stock_model(cfg, run_dir.path)
    return cfg, config_path, run_dir, tokenizer


def _redacted_keys(data, marker: str, prefix: str = "") -> list[str]:
    if isinstance(data, dict):
        return [k for key, v in data.items() for k in _redacted_keys(v, marker, f"{prefix}.{key}" if prefix else key)]
    if isinstance(data, list):
        return [k for i, v in enumerate(data) for k in _redacted_keys(v, marker, f"{prefix}[{i}]")]
    return [prefix] if data == marker else []


def _workers_line(cfg, use_ray: bool) -> str:
    r, learner = cfg.rollout, cfg.learner
    where = "in-process workers" if not use_ray else (f"Ray at {cfg.ray.address}" if cfg.ray.address else "local Ray")
    engines = f"{r.num_engines} {r.engine} engine{'s' if r.num_engines > 1 else ''} ({r.decode_mode} decoding)"
    n = learner.num_workers if use_ray else 1  # in-process: one rank (actors/local.py)
    learners = f"{n} DeepSpeed learner{'s' if n > 1 else ''} (ZeRO-{learner.zero_stage})"
    return (
        f"starting {where}: {engines}, {learners}, {cfg.likelihood.estimator} estimator, rewards "
        f"{', '.join(f.name or f.fn for f in cfg.reward.fns)}"
    )


def run(args) -> int:
    from rl.config import ConfigError
    from rl.errors import InputError
    from rl.train.faults import EXIT_BAD_INPUT, EXIT_STOPPED, FaultLog, RunStopped

    if args.print_config:
        try:
            print(load_train_config(args)[1].to_yaml(), end="")
        except ConfigError as e:
            print(f"fbrl train: error: {e}", file=sys.stderr, flush=True)
            return EXIT_BAD_INPUT
        return 0
    t_start = time.perf_counter()
    try:
        cfg, config_path, run_dir, tokenizer = prepare(args)
    except (InputError, OSError) as e:  # config, data, reward, checkpoint and run-dir problems: one clear line
        # (any other exception is a bug: it keeps its traceback)
        print(f"fbrl train: error: {e}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    from actors import console

    console.plain_text_streams()
    console.quiet_third_party(cfg.logging.verbose)
    _environment(cfg)
    from rl.decode_modes import mode_warning
    from rl.loop import train
    from rl.report.plots import LivePlots

    print(f"fbrl train: {config_path} -> {run_dir.path.absolute()}", flush=True)  # first: where results land
    for wanted, key in (
        (cfg.rollout.decode_mode, "rollout.decode_mode"),
        (cfg.train.eval_decode_modes, "train.eval_decode_modes"),
    ):
        warning = mode_warning(cfg.model.path, wanted, key)
        if warning:
            print(warning, flush=True)

    from actors.placement import build_workers, init_ray
    from actors.trackers import Trackers

    faults = FaultLog(print)
    stop = StopSignals()
    steps, stopped, trackers, bar = {}, None, None, None  # step -> its metrics (a step run again: the last)
    plots, rewards, worker_logs = None, None, None
    try:
        stop.install()
        t_ray = time.perf_counter()
        if not args.no_ray:
            init_ray(cfg)
            stop.install()  # ray.init installs its own SIGTERM handler (kill Ray, exit 1): ours goes back on top
        t_ray = time.perf_counter() - t_ray
        print(_workers_line(cfg, not args.no_ray), flush=True)
        t_workers, startup = time.perf_counter(), {}
        python_fns = getattr(args, "python_fns", None)
        rollout, learner, rewards = build_workers(
            cfg, use_ray=not args.no_ray, faults=faults, startup=startup, python_fns=python_fns
        )
        print(_ready_line(time.perf_counter() - t_workers, t_ray, startup, time.perf_counter() - t_start), flush=True)
        worker_logs = _worker_logs_dir(args.no_ray)
        trackers = Trackers(cfg, run_dir)
        bar = console.progress_bar(cfg.train.steps, cfg.logging.progress)

        def on_step(metrics):
            steps[metrics["step"]] = metrics
            trackers.log(metrics)
            if bar is not None:
                bar.n = metrics["step"]
                bar.refresh()
            plots.update(metrics)

        log = (
            (lambda line: bar.write(line, file=sys.stdout))
            if bar is not None
            else (lambda line: print(line, flush=True))
        )
        faults.log = log
        plots = LivePlots(run_dir, title=_plot_title(cfg, run_dir), log=log)
        stop.graceful = True
        train(
            cfg,
            tokenizer,
            rollout,
            learner,
            rewards,
            run_dir,
            log=log,
            progress=on_step,
            faults=faults,
            stop_requested=stop.reason,
        )
    except RunStopped as e:
        stopped = e
    except Interrupted as e:  # a second signal, or one during start-up: stop now, the last checkpoint stands
        stopped = RunStopped(f"{e}: stopped at once; the last checkpoint of {run_dir.path} stands", True, e.exit_code)
    finally:
        stop.graceful, stop.shutting_down = False, True
        if bar is not None:
            bar.close()
        written = plots.close() if plots is not None else run_dir.plot()
        if rewards is not None:
            try:  # a reward's close() (its client, its pool) runs; a dead reward worker has nothing left to close
                rewards.close()
            except Exception as e:
                print(f"closing the rewards failed: {type(e).__name__}: {e}", flush=True)
        wandb_dir = trackers.close() if trackers is not None else None
        _shutdown(args.no_ray)
        stop.uninstall()
    wandb_dir = str(Path(wandb_dir).parent) if wandb_dir else None  # the run's folder, not its files/
    # the whole run as metrics.jsonl holds it (a resumed run's earlier steps count: a resume whose few new steps
    # had no signal did not train "nothing"); a step run again after a restore: its last record
    history = list({r["step"]: r for r in run_dir.read_metrics() if r.get("step", 0) > 0}.values()) if steps else []
    trained = sum(1 for m in history if not m.get("skipped"))
    print()
    for line in console.summary_lines(
        run_dir,
        cfg,
        time.perf_counter() - t_start,
        written,
        wandb_dir,
        worker_logs if not cfg.logging.verbose else None,
    ):
        print(line)
    if stopped is not None:
        code = stop.exit_code or stopped.exit_code
        print(f"fbrl train: stopped: {stopped}", file=sys.stderr, flush=True)
        return code
    if history and not trained:
        print(
            f"fbrl train: error: the run trained nothing: all {len(history)} steps were skipped (no reward "
            f"signal, or non-finite loss); see the reward metrics in {run_dir.path / 'metrics.jsonl'}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_STOPPED
    return 0


class Interrupted(BaseException):
    """A signal that must end the job now (raised from the handler into whatever the main thread runs)."""

    def __init__(self, signum: int):
        super().__init__(f"{signal.Signals(signum).name} received")
        self.exit_code = 128 + signum


class StopSignals:
    """SIGTERM / SIGINT: the first one, once the loop runs (`graceful`), asks the loop to stop after the current
    step (`reason()`); before that, or a second one, raises `Interrupted` at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.graceful, self.received, self.exit_code, self._previous = False, None, None, {}
        self.shutting_down = False  # set while the workers are being stopped: later signals change nothing

    def install(self) -> None:
        for sig in self.SIGNALS:
            previous = signal.signal(sig, self._handle)
            self._previous.setdefault(sig, previous)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        self.exit_code = self.exit_code or 128 + signum
        if self.shutting_down:
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


def _ready_line(workers_s: float, ray_s: float, startup: dict, since_start_s: float) -> str:
    """`workers ready in N s (...)`: the start-up broken down (Ray, then each role's actors, which come up at once)."""
    from actors.placement import startup_line

    line = f"workers ready in {workers_s:.0f} s"
    if startup:
        threads = startup.pop("threads", [])
        line += f" (Ray {ray_s:.1f} s before them; {startup_line(startup, threads)}; {since_start_s:.0f} s since start)"
    return line


def _plot_title(cfg, run_dir) -> str:
    return (
        f"{run_dir.path.name}: {Path(cfg.model.path or 'model').name}, {cfg.data.task}, "
        f"{cfg.rollout.decode_mode} decoding, {cfg.likelihood.estimator} estimator, "
        f"{cfg.train.prompts_per_step}x{cfg.rollout.n_samples_per_prompt} samples per step"
    )


def _worker_logs_dir(no_ray: bool) -> str | None:
    """Ray's log directory on this node (where the quieted workers' output goes), if Ray runs here."""
    if no_ray:
        return None
    try:
        import ray

        return ray._private.worker._global_node.get_logs_dir_path() if ray.is_initialized() else None
    except Exception:  # a private API: the summary line is optional
        return None


def _shutdown(no_ray: bool) -> None:
    if no_ray:
        return
    import ray

    if ray.is_initialized():
        ray.shutdown()
