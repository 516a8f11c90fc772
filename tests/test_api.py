"""`actors.api.train`: the notebook use case — a job from Python with reward functions passed as callables (a
closure here, which no config file could name), returning the run directory; resuming takes them again."""

from __future__ import annotations

import json

import pytest
from test_faults_async import local_args

from actors import api


def test_train_from_python_with_a_closure_as_the_reward(tmp_path):
    calls = []
    target = "1"

    def has_digit(prompts, completions, answers, **_):  # a closure: it reads `target` and records its calls
        calls.append(len(completions))
        return [float(target in c) for c in completions]

    argv = local_args(tmp_path, "train.steps=2", "train.checkpoint_every=2", "reward.accuracy=none")
    config, overrides = argv[2], argv[3:]  # (`fbrl train --no-ray CONFIG OVERRIDES...`)
    run = api.train(config, overrides, reward_fns=[(has_digit, 2.0)], no_ray=True)
    assert run == tmp_path / "run"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and len(calls) == 2
    assert "reward/rewards/has_digit/mean" in rows[0]
    assert "python:has_digit" in (run / "config.yaml").read_text()
    assert (run / "policy" / "model.safetensors").is_file()
    with pytest.raises(api.TrainingStopped) as e:  # the run's reward exists only in that call: said, exit code 2
        api.train(resume=run, overrides=["train.steps=3"], no_ray=True)
    assert e.value.exit_code == 2
    api.train(resume=run, overrides=["train.steps=3"], reward_fns=[(has_digit, 2.0)], no_ray=True)
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3


def test_train_takes_a_config_object_and_builds_no_command_line(tmp_path, monkeypatch):
    """`api.train(cfg)` is the driver itself: a `Config` goes to the job as it is (no argparse namespace, no YAML
    file written to be parsed again), and its run directory comes back."""
    import argparse

    from rl.config import load_config

    argv = local_args(tmp_path, "train.steps=1")
    cfg = load_config(argv[2], argv[3:])

    def no_namespace(*args, **kwargs):
        raise AssertionError("api.train built an argparse.Namespace")

    monkeypatch.setattr(argparse.Namespace, "__init__", no_namespace)
    monkeypatch.setattr("yaml.safe_dump", no_namespace)  # the config is not written out to be read back
    run = api.train(cfg, no_ray=True)
    assert run == tmp_path / "run"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
