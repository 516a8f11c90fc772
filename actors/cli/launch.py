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
import sys
import threading
import time
from pathlib import Path

from rl.errors import InputError


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
    """(config label, Config, the --resume run dir or None) from the command line: CONFIG (or the embedded default,
    or the resumed run's own config.yaml), overrides, flags. Creates nothing."""
    config, overrides = args.config, list(args.overrides)
    if config and "=" in config and not Path(config).exists():  # `fbrl train key=value`
        overrides.insert(0, config)
        config = None
    # `run_dir=PATH` is the documented shorthand for `train.run_dir=PATH`
    overrides = [f"train.{o}" if o.startswith("run_dir=") else o for o in overrides]
    if getattr(args, "verbose", False):
        overrides.append("logging.verbose=true")
    return job_config(config, overrides, args.resume)


def job_config(config=None, overrides=(), resume=None):
    """(config label, Config, the resumed run's directory or None): `config` (a YAML path, a mapping of sections,
    a `Config`; None: the embedded default, or with `resume` the run's own config.yaml) with `overrides`, and
    with `resume` the run it continues. Creates nothing."""
    from rl.config import load_config
    from rl.config.loading import DEFAULT_CONFIG  # the embedded default job, wherever fbrl is installed
    from rl.train.run_dir import RunDir

    if config is None:  # a resumed run keeps its own config; a new one gets the embedded default
        config = str(Path(resume) / "config.yaml") if resume else str(DEFAULT_CONFIG)
    overrides, run_dir = list(overrides), None
    if resume:
        run_dir = RunDir.existing(resume)  # before anything else: a missing run is not created
        overrides += [f"train.resume={resume}", f"train.run_dir={resume}"]
    label = str(config) if isinstance(config, (str, Path)) else "the given config"
    return label, load_config(config, overrides), run_dir


def prepare(args):
    """`fbrl train ARGV`'s (cfg, config label, run dir, tokenizer, the data as checked): `load_train_config`, then
    `prepare_job`."""
    label, cfg, resumed = load_train_config(args)
    cfg, run_dir, tokenizer, data = prepare_job(
        cfg, resumed, resume=bool(args.resume), overwrite=args.overwrite, in_process=getattr(args, "no_ray", False)
    )
    return cfg, label, run_dir, tokenizer, data


def prepare_job(cfg, run_dir, *, resume: bool, overwrite: bool = False, in_process: bool = False, python_fns=None):
    """(cfg, run dir, tokenizer, the data as checked) with every input checked; raises an `rl.errors.InputError`
    naming the first bad one. `run_dir`: the resumed run's (`resume`), else made here. Starts nothing (no Ray,
    no engine)."""
    from actors.cli.model_source import convert_stock_model, resolve_hub_ids
    from actors.cli.preflight import check_job
    from rl.config import ConfigError
    from rl.config.secrets import REDACTED
    from rl.train.run_dir import RunDir, durable_run_dir

    cfg = resolve_hub_ids(cfg)
    if resume:
        # a learner that cannot load the checkpoint (another world size or ZeRO stage; --no-ray runs one rank)
        run_dir.check_resume_layout(cfg, 1 if in_process else cfg.learner.num_workers)
        run_dir.check_resume_config(cfg)  # refuse a changed experiment, naming the field
        hidden = _redacted_keys(cfg.to_dict(), REDACTED)
        if hidden:
            raise ConfigError(
                f"{', '.join(hidden)}: secret values are never saved with a run; resume with the "
                f"config that holds them: fbrl train CONFIG --resume {run_dir.path}"
            )
    tokenizer, cfg, data = check_job(cfg, in_process=in_process, python_fns=python_fns)
    if not resume:
        # inside `ray job submit` the working dir is Ray's temporary copy: the run goes somewhere that lasts
        durable = durable_run_dir(cfg.train.run_dir, os.getcwd())
        if durable != cfg.train.run_dir:
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, run_dir=durable))
        run_dir = RunDir.new(cfg.train.run_dir, overwrite=overwrite)
        cfg = convert_stock_model(cfg, run_dir.path)
    return cfg, run_dir, tokenizer, data


def _redacted_keys(data, marker: str, prefix: str = "") -> list[str]:
    if isinstance(data, dict):
        return [k for key, v in data.items() for k in _redacted_keys(v, marker, f"{prefix}.{key}" if prefix else key)]
    if isinstance(data, list):
        return [k for i, v in enumerate(data) for k in _redacted_keys(v, marker, f"{prefix}[{i}]")]
    return [prefix] if data == marker else []


def run(args) -> int:
    """`fbrl train ARGV`: argv → Config (`load_train_config`), then `run_job`; the exit code."""
    if args.print_config:
        return print_config(args)
    t_start = time.perf_counter()
    try:
        label, cfg, resumed = load_train_config(args)
    except (InputError, OSError) as e:
        return bad_input(e)
    return run_job(cfg, label, resumed, overwrite=args.overwrite, no_ray=args.no_ray, t_start=t_start)


def run_job(cfg, label: str, resumed=None, *, overwrite=False, no_ray=False, python_fns=None, t_start=None) -> int:
    """One job from its Config (`job_config`'s) to its exit code, as `fbrl train` runs it: the path of
    `actors.api.train`. `resumed`: the run directory it continues, None for a new run. `python_fns`: reward
    functions that `reward.fns` names `python:<name>`. Ray starts while the inputs are checked (the config itself is
    valid by now); a refused input prints its line, then stops that Ray: exit code 2, nothing left running."""
    t_start = t_start if t_start is not None else time.perf_counter()
    ray_start = None
    if not no_ray:
        from actors.placement import RayStart

        _environment(cfg)  # Ray's processes, and so its workers, inherit these
        ray_start = RayStart(cfg)
    try:
        cfg, run_dir, tokenizer, data = prepare_job(
            cfg, resumed, resume=resumed is not None, overwrite=overwrite, in_process=no_ray, python_fns=python_fns
        )
    except BaseException as e:
        code = bad_input(e) if isinstance(e, (InputError, OSError)) else None
        if ray_start is not None:
            ray_start.stop()
        if code is None:
            raise
        return code
    return run_prepared(
        cfg, label, run_dir, tokenizer, data, no_ray=no_ray, python_fns=python_fns, t_start=t_start, ray_start=ray_start
    )


def run_prepared(
    cfg, label, run_dir, tokenizer, data, *, no_ray=False, python_fns=None, t_start=None, ray_start=None
) -> int:
    """A checked job (`prepare_job`'s results) run: session → workers → the loop → summary; the exit code.
    `ray_start`: the Ray being started beside the checks (`actors.placement.RayStart`), None to start it here."""
    try:
        announce(cfg, label, run_dir)
        from actors.cli.session import Session
    except BaseException:
        if ray_start is not None:  # the session, which stops it otherwise, never began
            ray_start.stop()
        raise
    t_start = t_start if t_start is not None else time.perf_counter()
    started_at = time.time() - (time.perf_counter() - t_start)  # the origin of a train.save_before duration
    if not no_ray:
        import_torch_beside_workers()
    with Session(cfg, run_dir, no_ray, t_start, ray_start) as session:
        rollout, learner, rewards = session.start_workers(python_fns)
        from rl.loop import train  # its torch was imported beside the workers' start

        train(
            cfg,
            tokenizer,
            rollout,
            learner,
            rewards,
            run_dir,
            log=session.log,
            progress=session.on_step,
            faults=session.faults,
            stop_requested=session.stop.reason,
            data=data,
            started_at=started_at,
        )
    return session.exit_code()


def import_torch_beside_workers() -> threading.Thread:
    """Import torch in a thread while the workers start. The driver needs it only for the loop; the checks before
    it import none, so Ray's workers start as soon as the checks end, and the driver's ~1.3 CPU-s of torch
    overlaps their start instead of coming before it. `rl.loop`, imported once the workers are up, waits for this
    import if it is still running (Python's import lock). Only torch: the driver's other imports meanwhile are
    Ray's and fbrl's own, which torch's do not touch."""

    def run():
        try:
            import torch  # noqa: F401
        except Exception:  # the same import in the main thread raises it where it is reported
            pass

    thread = threading.Thread(target=run, name="fbrl-import-torch", daemon=True)
    thread.start()
    return thread


def bad_input(error) -> int:
    """Config, data, reward, checkpoint and run-dir problems: one clear line and exit code 2 (any other exception
    is a bug: it keeps its traceback)."""
    from rl.train.faults import EXIT_BAD_INPUT

    print(f"fbrl train: error: {error}", file=sys.stderr, flush=True)
    return EXIT_BAD_INPUT


def print_config(args) -> int:
    from rl.config import ConfigError
    from rl.train.faults import EXIT_BAD_INPUT

    try:
        print(load_train_config(args)[1].to_yaml(), end="")
    except ConfigError as e:
        print(f"fbrl train: error: {e}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    return 0


def announce(cfg, config_path, run_dir) -> None:
    """The console set up for the job, then its first lines: where results land, the engine's and learner's
    precision (and whether this CPU computes bf16 natively), and a decode mode the checkpoint was not trained for."""
    from actors import console
    from actors.resources import cpu_vector_isa, native_bf16_flag, precision_line
    from rl.decode_modes import mode_warning

    console.plain_text_streams()
    console.quiet_third_party(cfg.logging.verbose)
    _environment(cfg)
    print(f"fbrl train: {config_path} -> {run_dir.path.absolute()}", flush=True)  # first: where results land
    print(precision_line(cfg, cpu_vector_isa(), native_bf16_flag()), flush=True)
    for wanted, key in (
        (cfg.rollout.decode_mode, "rollout.decode_mode"),
        (cfg.train.eval_decode_modes, "train.eval_decode_modes"),
    ):
        warning = mode_warning(cfg.model.path, wanted, key)
        if warning:
            print(warning, flush=True)
