"""What the processes of a job import before their workers are ready: the start-up of `fbrl train` is CPU-bound on
a small machine (`python -m tools.startup_cpu`), so a process that never handles a tensor does not import torch."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def modules_after(code: str, *names: str) -> list[str]:
    """Which of `names` a fresh interpreter has imported after running `code`."""
    probe = f"import sys\n{code}\nprint(sorted(m for m in {names!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return eval(out.stdout.strip().splitlines()[-1])


def test_config_loads_without_torch():
    """`fbrl train` starts Ray once its config has loaded: loading it (run-directory rules included) imports no torch,
    whose ~1.5 s would otherwise come before Ray's start instead of beside it."""
    assert modules_after("from actors.cli.launch import job_config; job_config()", "torch") == []


def test_checks_and_first_lines_import_no_torch(tmp_path):
    """The driver's checks (`prepare_job`: checkpoint, tokenizer, rewards, data) and its first lines (`announce`,
    the precision line included) import no torch: the workers start as soon as Ray is up, and the driver's torch
    is imported beside their start (`import_torch_beside_workers`), not before it."""
    code = (
        "from actors.cli.launch import announce, job_config, prepare_job\n"
        f"label, cfg, _ = job_config(None, ['train.run_dir={tmp_path / 'run'}'])\n"
        "cfg, run_dir, tok, data = prepare_job(cfg, None, resume=False)\n"
        "assert len(data.train_rows) > 0\n"
        "announce(cfg, label, run_dir)"
    )
    assert modules_after(code, "torch") == []


def test_reward_actor_builds_its_scorer_without_torch():
    """The reward actor's module and the default job's scorer: no torch, no transformers (~1 CPU-s of its start)."""
    code = (
        "from actors.reward_workers import build_scorer\n"
        "from rl.config import load_config\n"
        "cfg = load_config(None, [])\n"
        "build_scorer(cfg.reward, '.', cfg.data.task, None)"
    )
    assert modules_after(code, "torch", "transformers") == []
