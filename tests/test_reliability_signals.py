"""SIGHUP (a closed terminal or ssh session) and SIGQUIT end `fbrl train` as SIGTERM does: the step in flight
finishes and is checkpointed, nothing is left running, exit code 143 (in-process workers: torch engine, torch
learner). The SIGTERM case on the real stack is tests/test_faults.py's."""

from __future__ import annotations

import os
import signal

import pytest
from fault_harness import check_checkpoints, data_lost, expected_digests, fault_record, metrics_of  # noqa: F401
from test_faults_async import local_args


class SignalsDuring:
    """In-process learner workers whose `n`-th `update` sends this process `signum` (a signal mid-step)."""

    def __init__(self, inner, signum, n):
        self.inner, self.signum, self.n, self.updates = inner, signum, n, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def update(self, *args, **kwargs):
        self.updates += 1
        if self.updates == self.n:
            os.kill(os.getpid(), self.signum)
        return self.inner.update(*args, **kwargs)


def test_sighup_checkpoints_the_step_and_exits_143(tmp_path, monkeypatch, capsys, fault_record):
    """SIGHUP during step 2's update: step 2 finishes, is logged once and checkpointed, exit code 143, and
    `--resume` completes the run."""
    import actors.placement
    from actors.cli import main

    real = actors.placement.build_workers
    before = signal.getsignal(signal.SIGHUP)  # SIG_DFL, or SIG_IGN under nohup

    def build(cfg, use_ray, **kwargs):
        rollout, learner, rewards = real(cfg, use_ray, **kwargs)
        return rollout, SignalsDuring(learner, signal.SIGHUP, 2), rewards

    monkeypatch.setattr(actors.placement, "build_workers", build)
    code = main(local_args(tmp_path, "train.steps=4"))
    out, err = capsys.readouterr()
    run_dir = tmp_path / "run"
    assert code == 143, (out[-2000:], err[-2000:])
    assert "SIGHUP received: stopping after the current step" in err, err
    assert "stopped after step 2, which is checkpointed" in err and "Traceback" not in out + err, err
    assert [r["step"] for r in metrics_of(run_dir)] == [1, 2]
    check_checkpoints(run_dir, 2, [2])
    assert signal.getsignal(signal.SIGHUP) is before  # the handler went with the job
    monkeypatch.setattr(actors.placement, "build_workers", real)
    assert main(["train", "--no-ray", "--resume", str(run_dir)]) == 0
    rows = metrics_of(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    stop = next(x for x in err.splitlines() if "stopped after step" in x)
    fault_record(
        fault="SIGHUP to the driver during step 2's update (a closed terminal or ssh session), in-process workers "
        "(torch engine)",
        outcome=f"step 2 finished, logged once and checkpointed: “{stop.replace(str(tmp_path), '…').strip()}”; "
        f"exit code {code}; the handler removed with the job; `--resume` completed steps 3-4",
        steps_lost="0",
        data_lost=data_lost(rows, expected_digests_of(run_dir, 4)),
        run_dir=run_dir,
        exit_code=f"{code}, then 0 on `--resume`",
        detected_s="at once (the handler asks for a stop after the step)",
    )


def expected_digests_of(run_dir, steps: int) -> list[str]:
    from rl.config import load_config

    return expected_digests(load_config(str(run_dir / "config.yaml"), []), steps)


@pytest.mark.parametrize("signum, code", [(signal.SIGHUP, 143), (signal.SIGQUIT, 143), (signal.SIGINT, 130)])
def test_each_stop_signal_asks_for_a_graceful_stop(signum, code):
    """Once the loop runs, SIGHUP, SIGQUIT (as SIGTERM: 143) and SIGINT (130) ask for a stop after the step; a
    second signal ends the job at once."""
    from actors.cli.session import Interrupted, StopSignals

    stop = StopSignals()
    stop.install()
    try:
        stop.graceful = True
        os.kill(os.getpid(), signum)
        assert stop.reason() == f"{signal.Signals(signum).name} received" and stop.exit_code == code
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signum)
    finally:
        stop.uninstall()
