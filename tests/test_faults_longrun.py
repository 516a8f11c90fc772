"""What a job that runs for days meets, injected into real jobs (local Ray, a vLLM CPU engine, 2 DeepSpeed ranks,
the math-verify reward actor; configs/tiny.yaml shortened), as tests/test_faults.py does for kills: a stop after the
learner's update at staleness 2, an engine that hangs but stays alive, bounded checkpoints with a torn metrics
tail and an empty trainer state in the latest one, and a second driver on a run directory in use. Each records its
row of docs/RELIABILITY.md's fault table (`fault_record`; tools/reliability_table.py)."""

from __future__ import annotations

import signal
import time

import pytest
from fault_harness import (  # noqa: F401
    CONFIG,
    SMALL,
    check_checkpoints,
    data_lost,
    expected_digests,
    fault_record,
    job,
    metrics_of,
    no_processes_left,
    output,
    quoted,
    same_weights,
    start_train,
    steps_logged,
    wait_for,
)


@pytest.mark.slow
def test_a_stop_after_the_update_at_staleness_2_checkpoints_the_step(job, fault_record):
    """The rollout actor is killed after step 4 with no replacements allowed and no checkpoints scheduled: the
    stop surfaces after step 5's update (the weight sync or the queued batch), and that step is checkpointed, so
    `--resume` continues from it instead of pointing at a checkpoint that does not exist."""
    from rl.train.faults import RunStopped

    overrides = ("train.steps=7", "train.max_staleness=2", "train.checkpoint_every=0", "faults.max_rollout_restarts=0")
    j = job(*overrides)
    j.kill_after(4, lambda: j.rollout.pids()[0])
    with pytest.raises(RunStopped, match=r"max_rollout_restarts=0 .*stopped after step \d, which is checkpointed") as e:
        j.train()
    last = j.seen[-1]["step"]
    assert 4 <= last < 7 and [m["step"] for m in j.seen] == list(range(1, last + 1))
    check_checkpoints(j.run_dir, last, [last])
    import ray

    ray.shutdown()
    again = job(*overrides, f"train.resume={j.run_dir}", name="run")
    again.train()
    rows = metrics_of(j.run_dir)
    assert [r["step"] for r in rows] == list(range(1, 8))
    fault_record(
        fault="rollout actor SIGKILLed after step 4 of 7 with `faults.max_rollout_restarts=0`, "
        "`train.max_staleness=2`, `train.checkpoint_every=0`",
        outcome=f"stopped after step {last} ({quoted(str(e.value), 200)}); step {last} checkpointed although no "
        f"checkpoint was scheduled; `--resume` completed steps {last + 1}-7",
        steps_lost="0",
        data_lost=data_lost(rows, expected_digests(j.cfg, 7)),
        exit_code="3, then 0 on `--resume`",
        matrix="rollout actor dies",
    )


@pytest.mark.slow
def test_a_hung_engine_is_replaced_after_its_deadline(job, tmp_path, monkeypatch, fault_record):
    """The engine's 3rd `generate` hangs while its process stays alive (FBRL_INJECT_HANG_GENERATE): past
    `faults.call_timeout_s` it is killed and replaced, the chunk runs again with the same seeds, and while the step
    waits a line says what it waits on."""
    monkeypatch.setenv("FBRL_INJECT_HANG_GENERATE", f"3:{tmp_path / 'hung-once'}")
    j = job(
        "train.steps=4", "faults.call_timeout_s=40", "faults.call_timeout_per_sample_s=0", "faults.waiting_log_s=10"
    )
    t0 = time.monotonic()
    j.train()
    wall = time.monotonic() - t0
    assert [m["step"] for m in j.seen] == [1, 2, 3, 4]
    assert j.faults.counts["rollout_timeouts"] == 1 and j.faults.counts["rollout_restarts"] == 1
    waiting = [x for x in j.lines if x.startswith("still waiting on rollout actor 0 (generate)")]
    hung = [x for x in j.fault_lines() if "hung during generate" in x]
    assert waiting and len(hung) == 1, j.lines
    assert all(m["samples"] == 32 for m in j.seen)
    rows = metrics_of(j.run_dir)
    at = dict(zip(j.lines, j.line_times))
    waited = at[hung[0]] - at[waiting[0]] + 10  # the first waiting line comes 10 s into the wait
    fault_record(
        fault="the engine's 3rd `generate` hangs, its process alive (`FBRL_INJECT_HANG_GENERATE`), "
        "`faults.call_timeout_s=40`",
        outcome=f"{len(waiting)} waiting lines ({quoted(waiting[0], 90)}); then {quoted(hung[0], 160)}; "
        f"4/4 steps completed, each with 32 of 32 samples, in {wall:.0f} s; `faults/rollout_timeouts` = 1; "
        f"engine weights {same_weights(j.rollout, j.learner)} the learner's (version {j.rollout.versions()[0]})",
        steps_lost="0 (step 3's batch waited one deadline)",
        data_lost=data_lost(rows, expected_digests(j.cfg, 4)),
        detected_s=f"10 s: the first waiting line; killed and replaced {waited:.0f} s into the wait (deadline 40 s)",
        matrix="an engine hangs",
    )


@pytest.mark.slow
def test_bounded_checkpoints_and_a_torn_tail_still_resume(job, fault_record):
    """`train.keep_checkpoints=2` over 6 checkpointed steps keeps the newest two; then a crash's debris: the last
    metrics row cut short and a zero-byte trainer_state.json in the checkpoint `latest` names. `--resume` falls
    back to the newest valid checkpoint with one warning and completes."""
    j = job("train.steps=6", "train.checkpoint_every=1", "train.keep_checkpoints=2")
    j.train()
    ckpts = j.run_dir / "checkpoints"
    kept = sorted(p.name for p in ckpts.glob("step_*"))
    assert kept == ["step_000005", "step_000006"] and (ckpts / "latest").read_text().strip() == "step_000006"
    metrics = j.run_dir / "metrics.jsonl"
    text = metrics.read_text()
    metrics.write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])  # the last row cut in half
    (ckpts / "step_000006" / "trainer_state.json").write_text("")
    import ray

    ray.shutdown()
    again = job("train.steps=8", "train.checkpoint_every=1", "train.keep_checkpoints=2", f"train.resume={j.run_dir}")
    with pytest.warns(UserWarning) as warned:
        again.train()
    said = list(  # each warning once (the checkpoint lookup runs twice: the resume check, then the restore)
        dict.fromkeys(
            str(w.message).replace(str(j.run_dir), "RUN_DIR")
            for w in warned
            if "latest" in str(w.message) or "cut short" in str(w.message)
        )
    )
    assert [m["step"] for m in again.seen] == [6, 7, 8]
    rows = metrics_of(j.run_dir)
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_000007", "step_000008"]
    fault_record(
        fault="`train.keep_checkpoints=2` over 6 checkpointed steps, then the last metrics row cut in half and a "
        "zero-byte `trainer_state.json` in the checkpoint `latest` names",
        outcome=f"steps 5, 6 kept of 1-6; `--resume` said {'; '.join(quoted(s, 110) for s in said)}, restored step 5 "
        f"and completed steps 6-8; checkpoints 7, 8 kept",
        steps_lost="1 (step 6, whose trainer state was empty)",
        data_lost=data_lost(rows, expected_digests(j.cfg, 8)),
        exit_code="0, then 0 on `--resume`",
        detected_s="at `--resume` (each checkpoint's trainer state parsed, the metrics tail read)",
    )


@pytest.mark.slow
def test_a_second_driver_on_a_run_in_use_is_refused(tmp_path, fault_record):
    """A requeue or a duplicate `--resume` while the job still runs: the second `fbrl train` exits 2 within seconds
    naming the holder, and the first job completes with its checkpoints whole."""
    run_dir = tmp_path / "run"
    args = [str(CONFIG), *SMALL, "train.steps=4", "train.checkpoint_every=1", f"train.run_dir={run_dir}"]
    first = start_train(args, tmp_path, "lock-1", "first")
    try:
        wait_for(lambda: steps_logged(run_dir) >= 1, 600, "the first job's step 1")
        t0 = time.monotonic()
        second = start_train(["--resume", str(run_dir)], tmp_path, "lock-2", "second")
        code = second.wait(120)
        refused_s = time.monotonic() - t0
        assert first.wait(600) == 0, output(tmp_path, "first")
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGKILL)
    said = output(tmp_path, "second")
    assert code == 2 and "is in use by fbrl train (pid" in said, said
    assert [r["step"] for r in metrics_of(run_dir)] == [1, 2, 3, 4]
    check_checkpoints(run_dir, 4, [1, 2, 3, 4])
    line = next(x for x in said.splitlines() if "in use by" in x)
    fault_record(
        fault="a second `fbrl train --resume RUN_DIR` while the first job runs (a requeue, a duplicate resume)",
        outcome=f"the second exited {code} after {refused_s:.0f} s ({quoted(line.replace(str(tmp_path), '…'), 160)}); "
        f"the first completed steps 1-4, exit 0, checkpoints 1-4 intact",
        steps_lost="0",
        data_lost=data_lost(metrics_of(run_dir), expected_digests(_cfg(run_dir), 4)),
        run_dir=run_dir,
        exit_code=f"{code} (the second), 0 (the first)",
        detected_s=refused_s,
    )


def _cfg(run_dir):
    from rl.config import load_config

    return load_config(str(run_dir / "config.yaml"), [])
