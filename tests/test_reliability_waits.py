"""Every wait at the end of a job has a deadline and a line naming what it waits on: the rewards' close() (a hung
reward actor, a user close() stuck) and a reward actor hung past its call deadline when no restart is left (it is
killed before the stop is raised, so the teardown does not queue behind its call)."""

from __future__ import annotations

import re
import threading
import time
import uuid
from pathlib import Path

import pytest
from fault_harness import fault_record, metrics_of, no_processes_left, output, start_train  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
CKPT = str(ROOT / "checkpoints" / "tiny-arith-mixed")


class HungClose:
    """Rewards whose close() never returns (on Ray: the actor busy with a hung call); `kill` as on Ray."""

    def __init__(self, on_ray: bool):
        self.release, self.killed = threading.Event(), False
        if on_ray:
            self.kill = self._kill

    def close(self):
        self.release.wait(60)

    def _kill(self):
        self.killed = True
        self.release.set()


def test_a_hung_close_is_given_up_at_its_deadline(capsys):
    from actors.cli.session import close_rewards

    rewards = HungClose(on_ray=True)
    t0 = time.monotonic()
    assert close_rewards(rewards, 2.0) is False
    seconds = time.monotonic() - t0
    assert 2.0 <= seconds < 4.0 and rewards.killed, seconds
    out = capsys.readouterr().out
    assert "closing the rewards: the reward actor did not return after 2 s (past its deadline of 2 s); killed" in out


def test_a_signal_during_the_teardown_ends_the_wait(capsys):
    """In-process rewards (no actor to kill): a signal that arrives while the job shuts down cuts the wait short."""
    import os
    import signal

    from actors.cli.session import StopSignals, close_rewards

    stop = StopSignals()
    stop.install()
    try:
        stop.shutting_down = True
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
        t0 = time.monotonic()
        assert close_rewards(HungClose(on_ray=False), 30.0, give_up=lambda: stop.late is not None) is False
        assert time.monotonic() - t0 < 5.0 and stop.late == "SIGTERM" and stop.exit_code == 143
    finally:
        stop.uninstall()
    assert "the rewards' close() did not return after 1 s (a signal arrived); left behind" in capsys.readouterr().out


def test_a_closing_reward_that_raises_is_one_line(capsys):
    from actors.cli.session import close_rewards

    class Raises:
        def close(self):
            raise ConnectionError("the judge's server is gone")

    assert close_rewards(Raises(), 5.0) is False
    assert capsys.readouterr().out == "closing the rewards failed: ConnectionError: the judge's server is gone\n"


def test_a_spent_restart_bound_kills_the_hung_reward_actor_before_the_stop(monkeypatch):
    """The CI check of the order the Ray test below runs for real: the hung actor is killed, then `RunStopped`."""
    import actors.reward_workers
    from actors.reward_workers import RewardWorkersOnRay
    from actors.supervision import CallTimeout, Supervisor
    from rl.config import load_config
    from rl.train.faults import RunStopped

    events = []
    monkeypatch.setattr(actors.reward_workers, "kill", lambda actor: events.append(("killed", actor)))
    supervisor = Supervisor(load_config(None, ["faults.max_reward_restarts=0"]).faults)
    workers = RewardWorkersOnRay("hung actor", make_actor=lambda: "new actor", supervisor=supervisor)
    with pytest.raises(
        RunStopped, match=r"reward actor hung during score \(no result after 12 s.*max_reward_restarts=0"
    ):
        workers.replace(CallTimeout("no result after 12 s, past the call's deadline of 10 s"))
    assert events == [("killed", "hung actor")]
    supervisor = Supervisor(load_config(None, ["faults.max_reward_restarts=1"]).faults)
    workers = RewardWorkersOnRay("hung actor", make_actor=lambda: "new actor", supervisor=supervisor)
    assert workers.replace(CallTimeout("no result")) == "new actor" and workers.actor == "new actor"


@pytest.mark.slow
def test_a_hung_reward_actor_with_no_restart_left_ends_the_job(tmp_path, fault_record):
    """The reward actor hangs in step 2's `score` (`FBRL_INJECT_HANG_SCORE`), `faults.max_reward_restarts=0`: past
    the call's deadline it is killed and the job stops (exit 3) with a line naming it, step 1 checkpointed, within
    the deadline plus a bounded teardown, every process of the job gone."""
    mark, deadline = uuid.uuid4().hex, 10
    run_dir = tmp_path / "run"
    args = [
        str(ROOT / "configs" / "tiny.yaml"),
        f"model.path={CKPT}",
        "rollout.engine=torch",
        "learner.num_workers=1",
        "train.prompts_per_step=4",
        "rollout.n_samples_per_prompt=4",
        "train.eval_every=0",
        "train.steps=3",
        "train.checkpoint_every=0",
        "train.mismatch_parts_frac=0",
        "logging.wandb_mode=disabled",
        "logging.progress=false",
        "faults.max_reward_restarts=0",
        f"faults.call_timeout_s={deadline}",
        "faults.call_timeout_per_sample_s=0",
        f"train.run_dir={run_dir}",
    ]
    from actors.cli.session import REWARDS_CLOSE_S

    marker = tmp_path / "hung"  # created by the actor as its call hangs
    p = start_train(args, tmp_path, mark, "job", FBRL_INJECT_HANG_SCORE=f"2:{marker}")
    try:
        code = p.wait(600)
    finally:
        if p.poll() is None:  # (the old teardown waited on the hung actor for ever)
            p.kill()
    hung_to_exit = time.time() - marker.stat().st_mtime
    out = output(tmp_path, "job")
    assert code == 3, out[-3000:]
    # the deadline, then the teardown: the rewards' close is bounded, Ray's shutdown takes seconds
    assert hung_to_exit < deadline + REWARDS_CLOSE_S + 30, hung_to_exit
    print(f"from the hang to the driver's exit: {hung_to_exit:.1f} s")
    assert re.search(
        r"stopped: reward actor hung during score \(no result after \d+ s, past the call's deadline of "
        rf"{deadline} s \(faults.call_timeout_s\); killed\), and faults.max_reward_restarts=0 replacements are used up",
        out,
    ), out[-3000:]
    assert "closing the rewards failed" not in out and "closing the rewards:" not in out  # the dead actor: nothing
    assert [r["step"] for r in metrics_of(run_dir)] == [1]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000001"
    no_processes_left(mark)
    stop = next(x for x in out.splitlines() if "stopped: reward actor hung" in x)
    fault_record(
        fault=f"the reward actor hangs in step 2's `score` (`FBRL_INJECT_HANG_SCORE`), "
        f"`faults.max_reward_restarts=0`, `faults.call_timeout_s={deadline}`",
        outcome=f"the actor killed, then the stop: “{stop.strip()[:220]} …”; step 1 checkpointed; the driver gone "
        f"{hung_to_exit:.0f} s after the hang; no process left",
        steps_lost="step 2 in flight (not trained; `--resume` runs it)",
        data_lost="none: step 1 in metrics.jsonl once, step 2 never logged",
        run_dir=run_dir,
        exit_code=code,
        detected_s=f"{deadline} s (the call's deadline); exit {hung_to_exit:.0f} s after the hang",
    )
