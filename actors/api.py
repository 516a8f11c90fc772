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

import argparse
import datetime
import tempfile
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
    from rl.config import load_config

    overrides = list(overrides)
    python_fns = {}
    if reward_fns:
        entries = []
        for item in reward_fns:
            fn, weight = item if isinstance(item, tuple) else (item, 1.0)
            base = getattr(fn, "__name__", None) or type(fn).__name__
            name, k = base, 2
            while name in python_fns:
                name, k = f"{base}_{k}", k + 1
            python_fns[name] = fn
            entries.append(f"{{fn: 'python:{name}', weight: {float(weight)}}}")
        overrides.append(f"reward.fns=[{', '.join(entries)}]")
    with tempfile.TemporaryDirectory(prefix="fbrl-api-") as tmp:
        path = _config_path(config, Path(tmp))
        if resume is None:
            run_dir = load_config(path, overrides).train.run_dir
            if run_dir is None:  # the launcher would stamp one; choose it here, so that it can be returned
                run_dir = f"runs/{datetime.datetime.now().strftime('%Y%m%d-%H%M%S-%f')}"
                overrides.append(f"train.run_dir={run_dir}")
        else:
            run_dir = str(resume)
        args = argparse.Namespace(
            config=path,
            overrides=overrides,
            resume=str(resume) if resume is not None else None,
            overwrite=overwrite,
            no_ray=no_ray,
            print_config=False,
            verbose=False,
            python_fns=python_fns or None,
        )
        code = launch.run(args)
    if code != 0:
        raise TrainingStopped(f"fbrl train ended with exit code {code} (its output says why)", code, Path(run_dir))
    return Path(run_dir)


def _config_path(config, tmp: Path) -> str | None:
    """A YAML file for `config` (the launcher reads configs from files: origins in errors name the file)."""
    if config is None or isinstance(config, (str, Path)):
        return None if config is None else str(config)
    import yaml

    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)
