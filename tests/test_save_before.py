"""`train.save_before`: a wall-clock deadline (a duration from the job's start or an ISO-8601 time with its zone).
The loop checkpoints and stops with exit code 0 when its next step would likely end past it, and `--resume`
continues; a value that cannot be read, or a time already past, is refused at load naming the key."""

import datetime
import time

import pytest
from fault_harness import check_checkpoints, metrics_of
from test_faults_async import local_args

from rl.config import ConfigError, load_config
from rl.config.checkpointing import parse_save_before
from rl.train.deadline import Deadline


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("3h30m", 12600),
        ("90m", 5400),
        ("45s", 45),
        ("1d2h", 93600),
        ("1.5h", 5400),
        ("00:03:35:00", 12900),  # NeMo-RL's DD:HH:MM:SS
        ("02:00:00", 7200),  # Slurm's HH:MM:SS
        ("1:30:00", 5400),  # YAML 1.1 reads it as the number 5400 (sexagesimal): the same seconds
        ("3600", 3600),
    ],
)
def test_durations_are_read_in_every_usual_form(text, seconds):
    value = load_config(None, [f"train.save_before={text}"]).train.save_before
    assert parse_save_before(value).seconds == seconds and parse_save_before(value).at is None


def test_an_iso_time_is_read_with_its_zone():
    for text in ("2031-12-05T20:00:00Z", "2031-12-05T21:00:00+01:00"):
        value = load_config(None, [f"train.save_before={text}"]).train.save_before
        assert parse_save_before(value).at == datetime.datetime(2031, 12, 5, 20, tzinfo=datetime.timezone.utc)
    assert parse_save_before("3h").deadline(1000.0) == 1000.0 + 3 * 3600


@pytest.mark.parametrize(
    "text, message",
    [
        ("soon", "expected a duration from the job's start"),
        ("0s", "expected a duration > 0"),
        ("-5", "expected a duration > 0"),
        ("3x", "expected a duration from the job's start"),
        ("2031-12-05 20:00:00", "has no time zone"),
        ("2031-12-05", "has no time zone"),
        ("true", "expected str or int or null"),
    ],
)
def test_a_bad_value_is_refused_at_load_naming_the_key(text, message):
    with pytest.raises(ConfigError, match="^train.save_before: ") as e:
        load_config(None, [f"train.save_before={text}"])
    assert message in str(e.value)


def test_the_stop_comes_when_one_more_step_would_end_past_the_deadline():
    now = [0.0]
    deadline = Deadline("100s", 100.0, clock=lambda: now[0])
    assert deadline.stop(0, "RUN") is None  # no step timed yet
    for t, step_s, save_s in ((10.0, 10.0, None), (20.0, 10.0, 2.0), (30.0, 10.0, None), (70.0, 40.0, None)):
        now[0] = t
        deadline.step_done(step_s, save_s)
        if t < 70:
            assert deadline.stop(int(t // 10), "RUN") is None, t  # 30 + 10 + 2 <= 100
    assert deadline.estimate() == 42.0  # the longest of the recent steps, plus the last checkpoint
    stop = deadline.stop(4, "RUN")  # 70 + 42 > 100
    assert stop is not None and stop.exit_code == 0 and stop.resumable
    assert "train.save_before=100s" in str(stop) and "step 5 would likely end past it" in str(stop)
    assert "30 s left" in str(stop) and "`fbrl train --resume RUN` continues" in str(stop)
    untimed = Deadline("1m", 60.0, clock=lambda: 30.0)
    untimed.step_done(14.0, None)
    assert untimed.estimate() == 28.0 and untimed.stop(1, "RUN") is None  # a checkpoint not yet timed: a step's


def test_the_job_stops_checkpointed_with_exit_0_and_resume_completes(tmp_path, capsys):
    """In-process workers (torch engine): a deadline 1 s after the start is passed by the first step, which is
    checkpointed although none was scheduled; the job ends with exit 0 saying why, and --resume runs the rest."""
    from actors.cli import main

    run_dir = tmp_path / "run"
    assert main(local_args(tmp_path, "train.steps=3", "train.save_before=1s")) == 0
    out, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.startswith("fbrl train: stopped:")]
    assert len(lines) == 1 and "Traceback" not in out + err, err[-2000:]
    assert "train.save_before=1s" in lines[0] and "step 2 would likely end past it" in lines[0], lines
    assert "stopped after step 1, which is checkpointed" in lines[0] and f"--resume {run_dir}" in lines[0], lines
    check_checkpoints(run_dir, 1, [1])
    assert main(["train", "--no-ray", "--resume", str(run_dir), "train.save_before=null"]) == 0
    assert [r["step"] for r in metrics_of(run_dir)] == [1, 2, 3]


def test_a_time_already_past_is_refused_before_anything_starts(tmp_path, capsys):
    from actors.cli import main

    past = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)).isoformat()
    t0 = time.perf_counter()
    assert main(local_args(tmp_path, f"train.save_before={past}")) == 2
    err = capsys.readouterr().err
    assert err.startswith("fbrl train: error: train.save_before: ") and "has already passed" in err, err
    assert not (tmp_path / "run").exists() and time.perf_counter() - t0 < 60
