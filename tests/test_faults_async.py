"""Faults under asynchronous training (`train.max_staleness` >= 1) and vLLM's native weight transfer, and the
stops and partly-applied steps around them (docs/RELIABILITY.md's fault table is built from these too).

Real stack (tests/fault_harness.py `Job`): a rollout actor SIGKILLed with a batch already made and queued, at
s = 1 and 2, with replay (whose recorded states the dead actor put) and kpass; a learner rank SIGKILLed under
`rollout.weight_sync=native_ray`. In-process workers (torch engine, torch learner): a stop raised in the rollout
producer thread, through `fbrl train` itself (exit code, summary, checkpoint); a non-finite optimizer step after
another optimizer step of the same update was applied (`algo.mini_batches=2`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, TINY_ARITH_MIXED
from fault_harness import (  # noqa: F401
    alive,
    check_checkpoints,
    data_lost,
    expected_digests,
    fault_record,
    job,
    metrics_of,
    quoted,
    same_weights,
    steps_lost,
    wait_for,
)

CKPT = str(TINY_ARITH_MIXED)


# ---- real stack -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "staleness,estimator",
    [
        (1, "replay"),
        pytest.param(1, "kpass", marks=pytest.mark.slow),
        pytest.param(2, "replay", marks=pytest.mark.slow),
        pytest.param(2, "kpass", marks=pytest.mark.slow),
    ],
)
def test_rollout_actor_killed_with_batches_queued(job, staleness, estimator, fault_record):
    """The rollout actor is SIGKILLed once step 2 is logged: batch 3 (and at s = 2 batch 4) is already made by the
    producer and queued, its recorded states made by the killed actor, and the next batch may be mid-generate. The
    states are the actor call's return value, owned by the driver, not the actor, so the queued batches are trained
    as they are; the generation in flight runs again on a replacement. No step lost, no sample trained twice, no
    checkpoint needed (train.checkpoint_every=0: a restore would go back to step 0)."""
    j = job(
        "train.steps=5",
        f"train.max_staleness={staleness}",
        "train.checkpoint_every=0",
        f"likelihood.estimator={estimator}",
    )
    j.kill_after(2, lambda: j.rollout.pids()[0])
    j.train()
    steps = [m["step"] for m in j.seen]
    assert steps == [1, 2, 3, 4, 5]  # none lost, none run again
    want = expected_digests(j.cfg, 5)
    assert [m["prompts_digest"] for m in j.seen] == want  # none repeated or skipped
    per_step = j.cfg.train.prompts_per_step * j.cfg.rollout.n_samples_per_prompt
    assert all(m["samples"] == per_step for m in j.seen)
    last = j.seen[-1]
    assert last["faults/rollout_restarts"] == 1
    assert "faults/learner_rebuilds" not in last and "faults/steps_lost" not in last
    assert max(m["staleness_max"] for m in j.seen) >= 1  # the producer did run ahead
    killed = j.kills[0][2]
    assert not alive(killed) and j.rollout.pids()[0] != killed
    assert j.rollout.versions() == [last["policy_version"]]
    assert j.rollout.weight_checksums() == pytest.approx(j.learner.weight_checksums(), rel=1e-12)
    rows = metrics_of(j.run_dir)
    fault_record(
        fault=f"rollout actor SIGKILLed after step 2 of {j.cfg.train.steps} with the next batch queued, "
        f"`train.max_staleness={staleness}`, `likelihood.estimator={estimator}`, no checkpoints",
        outcome=f"a new actor took over ({len(j.fault_lines())} fault line: "
        f"{quoted(j.fault_lines()[0].removeprefix('fault: '), 120)}); the queued batches trained as made "
        f"(staleness up to {max(m['staleness_max'] for m in j.seen)}), their states owned by the driver, "
        f"not the killed actor; {len(set(steps))}/{j.cfg.train.steps} steps completed, each with "
        f"{min(m['samples'] for m in j.seen)} of {per_step} samples; no learner rebuild; engine weights "
        f"{same_weights(j.rollout, j.learner)} the learner's (version {j.rollout.versions()[0]})",
        steps_lost=steps_lost(steps),
        data_lost=data_lost(rows, want),
        matrix="rollout actor dies",
    )


@pytest.mark.slow  # (~2-3 min: the CI suite keeps the s = 1 rollout kill; the rebuild at s = 0 is in CI under file)
def test_learner_rank_killed_under_native_ray(job, fault_record):
    """Rank 1 dies during step 4's update with `rollout.weight_sync=native_ray` (vLLM's native transfer lifecycle,
    the CPU check of nccl / ipc). The rebuilt group has no transfer engine and the engines' side still points at
    the dead rank 0: the transport sets the transfer up again with the new ranks at the next sync. The job
    completes as under the ray transport: step 3 run again from the step-2 checkpoint, weights equal."""
    j = job("train.steps=5", "train.checkpoint_every=2", "rollout.weight_sync=native_ray")
    j.rollout.transport.log = j.log  # (the transport's lines go to the job's log, as `fbrl train` prints them)
    j.kill_during(j.learner, "update", 4, lambda: j.learner.pids()[1])
    j.train()
    seen = [m["step"] for m in j.seen]
    assert seen == [1, 2, 3, 3, 4, 5]
    last = j.seen[-1]
    assert last["faults/learner_rebuilds"] == 1 and last["faults/steps_lost"] == 1
    again = [x for x in j.lines if "setting up the transfer again" in x]
    assert len(again) == 1 and "native_ray" in again[0], j.lines
    rows = metrics_of(j.run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert j.rollout.versions() == [last["policy_version"]]
    assert j.rollout.weight_checksums() == pytest.approx(j.learner.weight_checksums(), rel=1e-12)
    check_checkpoints(j.run_dir, 5, [2, 4, 5])
    fault_record(
        fault=f"learner rank 1 SIGKILLed mid-`update`, step 4 of {j.cfg.train.steps}, checkpoints every 2, "
        f"`rollout.weight_sync=native_ray`",
        outcome=f"all ranks replaced, the step-2 checkpoint restored; the native transfer set up again with the new "
        f"ranks ({quoted(again[0], 120)}); steps completed in order: {', '.join(map(str, seen))}; engine "
        f"weights {same_weights(j.rollout, j.learner)} the learner's (version {j.rollout.versions()[0]})",
        steps_lost=steps_lost(seen, in_flight=4),
        data_lost=data_lost(rows, expected_digests(j.cfg, 5)),
        matrix="learner rank dies",
    )


# ---- in-process workers ---------------------------------------------------------------------------------------
def local_args(tmp_path, *overrides):
    return [
        "train",
        "--no-ray",
        str(ROOT / "configs" / "tiny.yaml"),
        f"model.path={CKPT}",
        "rollout.engine=torch",
        "learner.num_workers=1",
        "train.prompts_per_step=4",
        "rollout.n_samples_per_prompt=4",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        "train.mismatch_parts_frac=0",
        "logging.wandb_mode=disabled",
        "logging.progress=false",
        f"train.run_dir={tmp_path / 'run'}",
        *overrides,
    ]


class StopsAt:
    """In-process rollout workers whose `n`-th training request raises `RunStopped` (as a restart bound or a lost
    native-transfer engine does inside the fleet); at max_staleness >= 1 that is the producer thread."""

    def __init__(self, inner, n):
        self.inner, self.n, self.requests, self.thread = inner, n, 0, None

    def generate(self, prompts, params, min_version):
        import threading

        from rl.train.faults import RunStopped

        if params.temperature > 0:
            self.requests += 1
            if self.requests == self.n:
                self.thread = threading.current_thread().name
                raise RunStopped(
                    "rollout actor 0 died during generate (injected), and faults.max_rollout_restarts=0 "
                    "replacements are used up: stopping"
                )
        return self.inner.generate(prompts, params, min_version)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_stop_in_the_producer_thread_ends_the_job_as_a_stop(tmp_path, monkeypatch, capsys, fault_record):
    """`fbrl train` at max_staleness=1: the 4th batch's request raises RunStopped in the producer thread while
    step 2 or 3 trains. The job ends as a stop: exit code 3, the end-of-run summary, the last step completed
    checkpointed (no checkpoint was scheduled), and `--resume` continues from it."""
    import actors.placement
    from actors.cli import main

    real = actors.placement.build_workers
    made = {}

    def build(cfg, use_ray, **kwargs):
        rollout, learner, rewards = real(cfg, use_ray, **kwargs)
        made["rollout"] = StopsAt(rollout, 4)
        return made["rollout"], learner, rewards

    monkeypatch.setattr(actors.placement, "build_workers", build)
    code = main(local_args(tmp_path, "train.steps=6", "train.max_staleness=1"))
    out, err = capsys.readouterr()
    run_dir = tmp_path / "run"
    rows = metrics_of(run_dir)
    last = rows[-1]["step"]
    assert code == 3, (out, err)
    assert made["rollout"].thread == "fbrl-rollout-producer"
    assert "Traceback" not in out + err and "rollout producer failed" not in out + err
    assert f"stopped after step {last}, which is checkpointed" in err, err
    assert 2 <= last < 6 and [r["step"] for r in rows] == list(range(1, last + 1))
    check_checkpoints(run_dir, last, [last])
    summary = [x for x in out.splitlines() if x.startswith("done: ")]
    assert summary, out
    monkeypatch.setattr(actors.placement, "build_workers", real)
    assert main(["train", "--no-ray", "--resume", str(run_dir)]) == 0
    resumed = metrics_of(run_dir)
    assert [r["step"] for r in resumed] == list(range(1, 7))
    stop_line = next(x for x in err.splitlines() if "stopped:" in x)
    fault_record(
        fault="a stop (`RunStopped`, e.g. a restart bound) raised in the rollout producer thread, "
        "`train.max_staleness=1`, in-process workers (torch engine)",
        outcome=f"exit code {code}, the summary printed ({quoted(summary[0], 80)}); "
        f"{quoted(stop_line.replace(str(tmp_path), '…'), 200)}; step {last} checkpointed; "
        f"`--resume` completed steps {last + 1}-6",
        steps_lost="0",
        data_lost=data_lost(resumed, expected_digests_local(run_dir, 6)),
        run_dir=run_dir,
        exit_code=f"{code}, then 0 on `--resume`",
        detected_s="at once: the producer's stop reaches the loop at its next batch",
        matrix="rollout actor dies",
    )


def expected_digests_local(run_dir: Path, steps: int) -> list[str]:
    from rl.config import load_config

    cfg = load_config(str(run_dir / "config.yaml"), [])
    return expected_digests(cfg, steps)


class NaNSecondHalf:
    """An in-process learner whose update `at` gets NaN advantages on the second half of its rows: with
    algo.mini_batches=2 its first optimizer step is applied and its second is not (non-finite, skipped)."""

    def __init__(self, inner, at):
        self.inner, self.at, self.updates = inner, at, 0

    def update(self, samples, advantages):
        self.updates += 1
        if self.updates == self.at:
            half = len(advantages) // 2
            advantages = list(advantages[:half]) + [float("nan")] * (len(advantages) - half)
        return self.inner.update(samples, advantages)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_partly_applied_nonfinite_step_is_a_new_version(tmp_path, fault_record):
    """algo.mini_batches=2, and update 2's second optimizer step is non-finite: its first one moved the weights.
    The step counts as a new version (synced, tagged, counted in `faults/partly_nonfinite_steps`): after every
    step the engines hold exactly the learner's weights under the version the loop records (checksums), never new
    weights under the old version."""
    from actors.local import LocalLearner, LocalRewards, LocalRollout
    from rl.config import load_config
    from rl.data.tokenizer import load_tokenizer
    from rl.loop import train
    from rl.train.run_dir import RunDir

    cfg = load_config(
        str(ROOT / "configs" / "tiny.yaml"), local_args(tmp_path, "train.steps=3", "algo.mini_batches=2")[3:]
    )
    rollout, rewards = LocalRollout(cfg), LocalRewards(cfg)
    learner = NaNSecondHalf(LocalLearner(cfg, "torch"), at=2)
    checks = []

    def check(m):
        same = rollout.weight_checksums() == pytest.approx(learner.weight_checksums(), rel=1e-12)
        checks.append((m["step"], m["policy_version"], [h.version() for h in rollout.hosts], same))

    lines = []
    try:
        history = train(
            cfg,
            load_tokenizer(cfg.model.path),
            rollout,
            learner,
            rewards,
            RunDir(cfg.train.run_dir),
            log=lines.append,
            progress=check,
        )
    finally:
        rewards.close()
    partial = [m for m in history if m.get("learner/nonfinite_steps")]
    assert len(partial) == 1 and partial[0]["learner/nonfinite_steps"] == 1
    assert partial[0]["learner/optimizer_steps"] == 2 and not partial[0]["skipped"]
    assert history[-1]["faults/partly_nonfinite_steps"] == 1
    assert all(same and versions == [v] * len(versions) for _, v, versions, same in checks), checks
    versions = [m["policy_version"] for m in history]
    before = history[history.index(partial[0]) - 1]["policy_version"] if history.index(partial[0]) else 1
    assert partial[0]["policy_version"] == before + 1  # the partly-applied step: a new version
    fault_record(
        fault="a non-finite optimizer step after another of the same update was applied (`algo.mini_batches=2`, "
        "NaN advantages on update 2's second half), in-process workers (torch engine)",
        outcome=f"step {partial[0]['step']} counted as a new version (policy versions {versions}), synced and tagged; "
        f"after each of the {len(checks)} steps the engine's weights equal the learner's under the version "
        f"recorded (checksums); `faults/partly_nonfinite_steps` = 1",
        steps_lost="0",
        data_lost="none: the step's first half trained, its second skipped (counted)",
        run_dir=Path(cfg.train.run_dir),
        exit_code=0,
        detected_s="at the update (each optimizer step's gradients are checked)",
        matrix="partly non-finite update",
    )
