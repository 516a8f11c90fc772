"""`fbrl train CONFIG [key=value ...] [--resume RUN_DIR]` — launch a GRPO-style job.

With no `ray.address` a local Ray is started (dashboard off, loopback only); on a cluster submit with
`ray job submit --address ... -- fbrl train configs/<gpu config>.yaml` (docs/CLUSTER.md). `--no-ray` runs the
same loop with in-process workers, for debugging. With no CONFIG the embedded default (configs/tiny.yaml) runs.

Before anything starts, the inputs are checked (actors/preflight.py) and the run directory's rules applied
(rl/run.py): a problem is one line on stderr and exit code 2, in seconds. `--resume RUN_DIR` takes the run's own
config.yaml (or the CONFIG given), plus overrides of fields that do not change the experiment. SIGTERM / SIGINT
end the job after the current step, which is checkpointed, with nothing left running (a second signal ends it at
once); exit code 128 + the signal. A stop rule, a spent restart bound, or a run that trained nothing: exit code 3.
The end of every run prints what trained, what was skipped and every fault (rl/faults.py, docs/RELIABILITY.md).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"


def add_arguments(p) -> None:
    p.add_argument("config", nargs="?", default=None, help="YAML config (default: the embedded tiny job; with "
                                                          "--resume: the run's own config.yaml)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. train.steps=4")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    p.add_argument("--overwrite", action="store_true", help="start a new run in a run_dir that holds an old one "
                                                            "(its files are deleted)")
    p.add_argument("--no-ray", action="store_true", help="in-process workers instead of Ray actors")


def _environment(cfg) -> None:
    # Set before anything imports wandb / vllm / ray: these are read at import or process start.
    os.environ.setdefault("WANDB_MODE", cfg.logging.wandb_mode)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if cfg.ray.address is None:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local, loopback-only Ray


def prepare(args):
    """(cfg, config path, run dir, tokenizer) with every input checked; raises a ValueError naming the first bad
    one. Starts nothing (no Ray, no engine)."""
    from actors.preflight import check_job
    from rl.config import ConfigError, load_config
    from rl.config.secrets import REDACTED
    from rl.run import RunDir

    config_path = args.config
    if args.config and "=" in args.config and not Path(args.config).exists():  # `fbrl train key=value`
        args.overrides.insert(0, args.config)
        config_path = None
    if config_path is None:  # a resumed run keeps its own config; a new one gets the embedded default
        config_path = str(Path(args.resume) / "config.yaml") if args.resume else str(DEFAULT_CONFIG)
    # `run_dir=PATH` is the documented shorthand for `train.run_dir=PATH`
    overrides = [f"train.{o}" if o.startswith("run_dir=") else o for o in args.overrides]
    if args.resume:
        run_dir = RunDir.existing(args.resume)  # before anything else: a missing run is not created
        overrides += [f"train.resume={args.resume}", f"train.run_dir={args.resume}"]
    cfg = load_config(config_path, overrides)
    if args.resume:
        run_dir.check_resume_config(cfg)  # refuse a changed experiment, naming the field
        hidden = _redacted_keys(cfg.to_dict(), REDACTED)
        if hidden:
            raise ConfigError(f"{', '.join(hidden)}: secret values are never saved with a run; resume with the "
                              f"config that holds them: fbrl train CONFIG --resume {args.resume}")
    tokenizer = check_job(cfg)
    if not args.resume:
        run_dir = RunDir.new(cfg.train.run_dir, overwrite=args.overwrite)
    return cfg, config_path, run_dir, tokenizer


def _redacted_keys(data, marker: str, prefix: str = "") -> list[str]:
    if isinstance(data, dict):
        return [k for key, v in data.items() for k in _redacted_keys(v, marker, f"{prefix}.{key}" if prefix else key)]
    if isinstance(data, list):
        return [k for i, v in enumerate(data) for k in _redacted_keys(v, marker, f"{prefix}[{i}]")]
    return [prefix] if data == marker else []


def run(args) -> int:
    from rl.faults import EXIT_BAD_INPUT, EXIT_STOPPED, FaultLog, RunStopped, run_summary
    from rl.loop import train

    t_start = time.perf_counter()
    try:
        cfg, config_path, run_dir, tokenizer = prepare(args)
    except (ValueError, OSError) as e:  # config, data, reward, checkpoint and run-dir problems: one clear line
        print(f"fbrl train: error: {e}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    _environment(cfg)
    print(f"fbrl train: config {config_path}, run dir {run_dir.path}", flush=True)

    from actors.placement import build_workers, init_ray
    faults = FaultLog(print)
    stop = StopSignals()
    steps, stopped, wandb_run, bar = {}, None, None, None  # step -> its metrics (a step run again: the last)
    try:
        stop.install()
        if not args.no_ray:
            init_ray(cfg)
            stop.install()  # ray.init installs its own SIGTERM handler (kill Ray, exit 1): ours goes back on top
        rollout, learner, rewards = build_workers(cfg, use_ray=not args.no_ray, faults=faults)
        wandb_run = _wandb(cfg, run_dir)
        bar = _progress(cfg)

        def on_step(metrics):
            steps[metrics["step"]] = metrics
            if wandb_run is not None:
                wandb_run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))},
                              step=metrics["step"])
            if bar is not None:
                bar.update(1)

        faults.log = log = bar.write if bar is not None else print
        stop.graceful = True
        train(cfg, tokenizer, rollout, learner, rewards, run_dir, log=log, progress=on_step, faults=faults,
              stop_requested=stop.reason)
    except RunStopped as e:
        stopped = e
    except Interrupted as e:  # a second signal, or one during start-up: stop now, the last checkpoint stands
        stopped = RunStopped(f"{e}: stopped at once; the last checkpoint of {run_dir.path} stands", True,
                             e.exit_code)
    finally:
        stop.graceful, stop.shutting_down = False, True
        if bar is not None:
            bar.close()
        if wandb_run is not None:
            wandb_run.finish()
        _shutdown(args.no_ray)
        stop.uninstall()
    plots = run_dir.plot()
    evals = [r for r in run_dir.read_metrics() if r.get("eval_accuracy") is not None]
    print(f"\nfinished in {time.perf_counter() - t_start:.0f}s")
    if len(evals) >= 2:
        first, last = evals[0], evals[-1]
        print(f"held-out greedy accuracy: step {first['step']} {first['eval_accuracy']:.3f} -> "
              f"step {last['step']} {last['eval_accuracy']:.3f} "
              f"({100 * (last['eval_accuracy'] - first['eval_accuracy']):+.1f} points)")
    history = [steps[k] for k in sorted(steps)]
    lines, trained = run_summary(history, faults)
    for line in lines:
        print(line)
    print(f"metrics: {run_dir.path / 'metrics.jsonl'}")
    for p in plots:
        print(f"plot:    {p}")
    if stopped is not None:
        code = stop.exit_code or stopped.exit_code
        print(f"fbrl train: stopped: {stopped}", file=sys.stderr, flush=True)
        return code
    if history and not trained:
        print(f"fbrl train: error: the run trained nothing: all {len(history)} steps were skipped (no reward "
              f"signal, or non-finite loss); see the reward metrics in {run_dir.path / 'metrics.jsonl'}",
              file=sys.stderr, flush=True)
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
            print(f"fbrl train: {self.received} received: stopping after the current step (send it again to stop "
                  f"at once)", file=sys.stderr, flush=True)
            return
        raise Interrupted(signum)

    def reason(self) -> str | None:
        return f"{self.received} received" if self.received else None


def _wandb(cfg, run_dir):
    if cfg.logging.wandb_mode == "disabled":
        return None
    import wandb

    from rl.config.secrets import redacted
    return wandb.init(project=cfg.logging.wandb_project, entity=cfg.logging.wandb_entity,
                      mode=cfg.logging.wandb_mode, dir=str(run_dir.path), config=redacted(cfg.to_dict()),
                      resume="allow" if cfg.train.resume else None, name=run_dir.path.name)


def _progress(cfg):
    if not cfg.logging.progress:
        return None
    from tqdm import tqdm
    return tqdm(total=cfg.train.steps, desc="steps", unit="step", file=sys.stderr, dynamic_ncols=True)


def _shutdown(no_ray: bool) -> None:
    if no_ray:
        return
    import ray
    if ray.is_initialized():
        ray.shutdown()
