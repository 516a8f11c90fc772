"""fbrl from Python — a notebook, a script, a sweep driver: `train` runs exactly the job `fbrl train` runs (the
same checks, workers, loop, run directory and exit rules) and takes reward functions as Python callables.

    from actors import api

    def brevity(prompts, completions, answers, **_):        # fbrl's convention; TRL's and verl's work too
        return [1.0 / (1 + len(c)) for c in completions]

    run_dir = api.train("configs/tiny.yaml", overrides=["train.steps=10"], reward_fns=[brevity])
    # run_dir / "policy" is the trained model, run_dir / "metrics.jsonl" every step

Reward functions handed over this way replace `reward.fns` (as TRL's `reward_funcs` do); the run's config.yaml names
them `python:<name>`, and resuming the run takes them again: `api.train(resume=run_dir, reward_fns=[brevity])`.
On Ray they are pickled by value into the reward actor (cloudpickle), so closures and notebook functions work.
"""

from __future__ import annotations

import datetime
from pathlib import Path


class TrainingStopped(RuntimeError):
    """The job ended without finishing (bad input: exit code 2; a stop rule or bound: 3; a signal: 128 + n). The
    reason is in the job's output; `exit_code` is what `fbrl train` would have exited with."""

    def __init__(self, message: str, exit_code: int, run_dir: Path | None):
        super().__init__(message)
        self.exit_code, self.run_dir = exit_code, run_dir


def train(
    config=None,
    overrides=(),
    *,
    reward_fns=None,
    resume: str | Path | None = None,
    no_ray: bool = False,
    overwrite: bool = False,
) -> Path:
    """Run a training job; returns its run directory.

    `config`: a YAML path, a dict of sections, an `rl.config.Config`, or None (the embedded default job; with
    `resume`, the run's own config). `overrides`: dotted `key=value` strings, as on the command line.
    `reward_fns`: callables, or `(callable, weight)` pairs. `no_ray`: in-process workers (`--no-ray`)."""
    from actors.cli import launch
    from rl.errors import InputError

    overrides = list(overrides)
    python_fns = _python_rewards(reward_fns or (), overrides)
    try:
        label, cfg, resumed = launch.job_config(config, overrides, str(resume) if resume else None)
    except (InputError, OSError) as e:  # as `fbrl train` says it: one line, exit code 2
        raise TrainingStopped(f"fbrl train: error: {e}", launch.bad_input(e), None) from e
    if resumed is None and cfg.train.run_dir is None:
        # the launcher would stamp one to the second; choose it here, to the microsecond, so that it can be returned
        cfg.train.run_dir = f"runs/{datetime.datetime.now().strftime('%Y%m%d-%H%M%S-%f')}"
    run_dir = Path(resumed.path if resumed is not None else cfg.train.run_dir)
    code = launch.run_job(cfg, label, resumed, overwrite=overwrite, no_ray=no_ray, python_fns=python_fns or None)
    if code != 0:
        raise TrainingStopped(f"fbrl train ended with exit code {code} (its output says why)", code, run_dir)
    return run_dir


def _python_rewards(reward_fns, overrides: list[str]) -> dict:
    """{name: callable} of the reward functions given, each named once (`f`, `f_2`, ...); the override that puts
    them in `reward.fns` as `python:<name>` is appended to `overrides`."""
    python_fns, entries = {}, []
    for item in reward_fns:
        fn, weight = item if isinstance(item, tuple) else (item, 1.0)
        base = getattr(fn, "__name__", None) or type(fn).__name__
        name, k = base, 2
        while name in python_fns:
            name, k = f"{base}_{k}", k + 1
        python_fns[name] = fn
        entries.append(f"{{fn: 'python:{name}', weight: {float(weight)}}}")
    if entries:
        overrides.append(f"reward.fns=[{', '.join(entries)}]")
    return python_fns
