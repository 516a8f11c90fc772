"""Bad input that used to surface only once the workers ran (a traceback, exit code 1) is refused before any
worker starts: one line naming the problem, exit code 2 (an empty data file, a corrupt parquet file, `--resume` with a
larger `rollout.max_tokens`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_bad_input import ENV, ROOT, prepare


@pytest.fixture
def files(tmp_path):
    from rl.data import arith
    from rl.data.jsonl import write_jsonl

    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    (tmp_path / "corrupt.parquet").write_bytes(b"PAR1 not really a parquet file PAR1")
    rows = [{"prompt": r["prompt"], "answer": r["answer"]} for r in arith.generate("train", 8, seed=0)]
    write_jsonl(rows, tmp_path / "good.jsonl")
    return tmp_path


CASES = [  # (overrides, a piece of the one line); {d} is the files directory
    (
        ["data.task=jsonl", "data.train_path={d}/empty.jsonl", "train.eval_every=0"],
        "data.train_path: {d}/empty.jsonl: no rows (an empty training set)",
    ),
    (
        ["data.task=jsonl", "data.train_path={d}/blank.jsonl", "train.eval_every=0"],
        "data.train_path: {d}/blank.jsonl: no rows",
    ),
    (
        ["data.task=jsonl", "data.train_path={d}/good.jsonl", "data.test_path={d}/empty.jsonl"],
        "data.test_path: {d}/empty.jsonl: no rows (an empty eval set)",
    ),
    (
        ["data.task=parquet", "data.train_path={d}/corrupt.parquet", "train.eval_every=0"],
        "data.train_path: {d}/corrupt.parquet: not a readable parquet file",
    ),
]


@pytest.mark.parametrize("overrides, message", CASES, ids=["empty", "blank", "empty eval", "corrupt parquet"])
def test_bad_data_is_refused_before_anything_starts(files, overrides, message):
    import ray

    from rl.errors import InputError

    with pytest.raises(InputError) as e:
        prepare(*[o.format(d=files) for o in overrides], f"train.run_dir={files / 'run'}")
    assert message.format(d=files) in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not ray.is_initialized() and not (files / "run").exists()


def run_with_a_checkpoint(tmp_path: Path) -> Path:
    """A new run of the default job, with a checkpoint whose sampler drew from the rows that job keeps."""
    run = tmp_path / "run"
    cfg, _, run_dir, _, data = prepare(f"train.run_dir={run}")
    run_dir.write_config(cfg)
    ckpt = run / "checkpoints" / "step_000001"
    (ckpt / "learner").mkdir(parents=True)
    sampler = {"seed": cfg.train.seed, "epoch": 0, "pos": 4, "num_rows": len(data.train_rows), "shuffle": True}
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 1, "version": 2, "sampler": sampler}))
    (run / "checkpoints" / "latest").write_text(ckpt.name)
    return run


def test_resume_with_a_larger_max_tokens_names_the_prompt_limit(tmp_path):
    """`--resume` with `rollout.max_tokens` raised until prompts no longer fit: refused naming the key and the limits
    (it said "sampler state: num_rows ... (data changed)" once the workers had started)."""
    from actors.cli.preflight import BadInput

    run = run_with_a_checkpoint(tmp_path)
    prepare("--resume", str(run), "rollout.max_tokens=48")  # the run's own value: accepted
    with pytest.raises(BadInput) as e:
        prepare("--resume", str(run), "rollout.max_tokens=213")  # a limit of 43 tokens drops the longest prompts
    message = str(e.value)
    assert message.startswith(f"--resume {run}: step_000001 drew its prompts from 20000 training rows, and ")
    assert "the prompt limit changed from 208 to 43 tokens (rollout.max_tokens 48 -> 213" in message, message


@pytest.mark.slow
def test_the_command_refuses_it_in_seconds(tmp_path):
    """Through `fbrl train` itself: exit code 2, one line on stderr, no traceback, no Ray. (Slow: a process of its
    own; in CI the check itself runs above, and tests/test_launch_errors.py prints any such error as one line.)"""
    from rl.train import run_dir

    run = run_with_a_checkpoint(tmp_path)
    os.close(run_dir._LOCKS.pop(run.resolve()))  # this process made it: let the command take the run's lock
    env = dict(os.environ, **ENV, PYTHONPATH=str(ROOT))
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "actors.cli", "train", "--resume", str(run), "rollout.max_tokens=213"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    seconds = time.monotonic() - t0
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("fbrl train: error: --resume"), p.stderr
    assert "prompt limit changed" in lines[0] and "Ray" not in p.stdout
    assert seconds < 60, seconds  # imports and loading the data (8 s on an idle 2-core machine); no Ray, no engine
