"""`fbrl train` prints fbrl's own input errors as one line (exit code 2) and lets every other exception — a bug —
through with its traceback."""

import argparse
from pathlib import Path

import pytest

from actors.cli import launch
from actors.cli.preflight import BadInput
from rewards.loader import RewardLoadError
from rl.config import ConfigError
from rl.data.jsonl import DataError
from rl.errors import InputError
from rl.train.faults import EXIT_BAD_INPUT
from rl.train.run_dir import RunDirError


def _args():
    return argparse.Namespace(print_config=False, overwrite=False, no_ray=True)


def fail_at(monkeypatch, stage: str, error: BaseException) -> None:
    """`error` raised where `fbrl train` loads its config (`load_train_config`) or checks its inputs
    (`prepare_job`, after the config loaded)."""

    def fail(*args, **kwargs):
        raise error

    if stage == "prepare_job":
        monkeypatch.setattr(launch, "load_train_config", lambda args: ("cfg.yaml", None, None))
    monkeypatch.setattr(launch, stage, fail)


STAGES = ["load_train_config", "prepare_job"]


@pytest.mark.parametrize(
    "error",
    [
        ConfigError("train.steps: must be >= 1, got -1"),
        DataError("a.jsonl:2: bad"),
        RunDirError("runs/x: not empty"),
        RewardLoadError("no function 'f'"),
        BadInput("model.path: checkpoint not found"),
        FileNotFoundError("configs/none.yaml"),
    ],
)
@pytest.mark.parametrize("stage", STAGES)
def test_input_errors_are_one_line(monkeypatch, capsys, error, stage):
    fail_at(monkeypatch, stage, error)
    assert launch.run(_args()) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err == f"fbrl train: error: {error}\n"


@pytest.mark.parametrize("bug", [ValueError("too many values to unpack"), KeyError("rollout"), TypeError("x")])
@pytest.mark.parametrize("stage", STAGES)
def test_other_errors_keep_their_traceback(monkeypatch, capsys, bug, stage):
    fail_at(monkeypatch, stage, bug)
    with pytest.raises(type(bug)) as info:
        launch.run(_args())
    assert info.value is bug
    assert "fbrl train: error" not in capsys.readouterr().err


def test_every_input_error_shares_the_base():
    for cls in (ConfigError, DataError, RunDirError, RewardLoadError, BadInput):
        assert issubclass(cls, InputError) and issubclass(cls, ValueError), cls


def test_every_command_prints_a_config_error_as_one_line(capsys):
    """`fbrl pretrain` (and every other command) reports a bad key or value by name, exit 2, no traceback."""
    from actors.cli import main

    config = Path(__file__).resolve().parent.parent / "configs" / "cups_pretrain.yaml"
    assert main(["pretrain", str(config), "pretrain.eval_every=-1"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("fbrl pretrain: error: pretrain.eval_every: must be >= 0") and "Traceback" not in err
