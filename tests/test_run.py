"""Run directory: checkpoints are atomic (a crash mid-write leaves the last good one), resume restores RNGs and
refuses a changed experiment, naming the field."""

import json
import random
from pathlib import Path

import pytest
import torch

from rl.config import ConfigError, load_config
from rl.train.run_dir import RunDir


class FileLearner:
    """Writes a real file per save, like a learner's save_pretrained; can be told to die half-way."""

    def __init__(self, value=0, crash=False):
        self.value, self.crash = value, crash

    def save_checkpoint(self, directory):
        import os

        os.makedirs(directory)
        with open(f"{directory}/weights.txt", "w") as f:
            f.write(str(self.value))
        if self.crash:
            raise KeyboardInterrupt("killed while writing")

    def load_checkpoint(self, directory):
        self.value = int(open(f"{directory}/weights.txt").read())


def test_checkpoint_roundtrip_restores_state_and_rngs(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    random.seed(3)
    torch.manual_seed(3)
    run.save_checkpoint(2, FileLearner(7), {"version": 3, "sampler": {"epoch": 0, "pos": 32}})
    want = (random.random(), torch.rand(2))
    random.seed(99)
    torch.manual_seed(99)
    learner = FileLearner()
    state = RunDir(str(tmp_path / "run")).load_checkpoint(learner)
    assert learner.value == 7 and state["step"] == 2 and state["version"] == 3
    assert state["sampler"] == {"epoch": 0, "pos": 32}
    assert random.random() == want[0] and torch.equal(torch.rand(2), want[1])


def test_crash_during_checkpoint_keeps_last_good_one(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    run.save_checkpoint(2, FileLearner(2), {"version": 2})
    with pytest.raises(KeyboardInterrupt):
        run.save_checkpoint(4, FileLearner(4, crash=True), {"version": 4})
    learner = FileLearner()
    state = RunDir(str(tmp_path / "run")).load_checkpoint(learner)  # a fresh RunDir also sweeps the debris
    assert state["step"] == 2 and learner.value == 2
    assert not list((tmp_path / "run" / "checkpoints").glob(".tmp-*"))


class TwoNodeLearner(FileLearner):
    """Rank 0 writes on the driver's node; rank 1's files land on another node's disk (reported, not here)."""

    def save_checkpoint(self, directory):
        from rl.train.checkpoints import saved_files

        super().save_checkpoint(directory)
        return [saved_files(directory, 0), {"rank": 1, "host": "node-b", "files": {"ds/rank1_optim.pt": 1234}}]

    def export_weights(self, path):
        return "/elsewhere/on/node-b/weights.safetensors"


def test_a_checkpoint_the_driver_cannot_see_whole_is_refused(tmp_path):
    """Ranks on nodes without shared storage: the driver refuses the checkpoint (exit 2, naming train.run_dir and
    shared storage) instead of renaming half of it into place; the last good checkpoint stays `latest`."""
    from rl.train.faults import EXIT_BAD_INPUT, RunStopped

    run = RunDir(str(tmp_path / "run"))
    run.save_checkpoint(1, FileLearner(1), {"version": 1})
    with pytest.raises(
        RunStopped, match=r"rank 1 on node-b: 1 files, e.g. ds/rank1_optim.pt \(missing here, 1234 wr.*train.run_dir="
    ) as e:
        run.save_checkpoint(2, TwoNodeLearner(2), {"version": 2})
    assert e.value.exit_code == EXIT_BAD_INPUT and "storage every node shares" in str(e.value)
    assert run.latest_checkpoint().name == "step_000001"
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["latest", "step_000001"]


class LaggingStorageLearner(FileLearner):
    """Every file is here, but one with fewer bytes than its rank wrote (shared storage that has not caught up)."""

    def save_checkpoint(self, directory):
        from rl.train.checkpoints import saved_files

        super().save_checkpoint(directory)
        receipt = saved_files(directory, 0)
        name = next(iter(receipt["files"]))
        receipt["files"][name] += 10
        return [receipt]


def test_a_checkpoint_file_of_another_size_is_refused(tmp_path):
    from rl.train.faults import RunStopped

    run = RunDir(str(tmp_path / "run"))
    run.save_checkpoint(1, FileLearner(1), {"version": 1})
    with pytest.raises(RunStopped, match=r"rank 0 on .*: 1 files, e.g. .* \(\d+ here, \d+ written\)"):
        run.save_checkpoint(2, LaggingStorageLearner(2), {"version": 2})
    assert run.latest_checkpoint().name == "step_000001"


def test_a_policy_export_the_driver_cannot_see_fails_loudly(tmp_path):
    from rl.train.faults import RunStopped
    from rl.train.run_dir import save_step

    cfg = load_config(None, ["train.steps=2", "train.checkpoint_every=0"])
    run = RunDir(str(tmp_path / "run"))
    with pytest.raises(RunStopped, match=r"exported the policy's weights to /elsewhere.*cannot see.*train.run_dir="):
        save_step(run, cfg, TwoNodeLearner(), 2, {"version": 2})


def test_resume_refuses_changed_estimator_naming_it(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    run.write_config(load_config(None, ["likelihood.estimator=replay"]))
    run.check_resume_config(load_config(None, ["likelihood.estimator=replay", "train.steps=99"]))
    with pytest.raises(ConfigError, match="likelihood.estimator"):
        run.check_resume_config(load_config(None, ["likelihood.estimator=kpass"]))


def test_metrics_truncated_to_checkpoint_on_resume(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    for step in range(1, 5):
        run.log_metrics({"step": step, "reward_mean": step / 10})
    run.truncate_metrics_after(2)
    assert [r["step"] for r in run.read_metrics()] == [1, 2]
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2


def test_keep_checkpoints_keeps_the_newest_and_survives_a_kill_mid_delete(tmp_path, monkeypatch):
    run = RunDir(str(tmp_path / "run"))
    for step in range(1, 7):
        run.save_checkpoint(step, FileLearner(step), {"version": step}, keep=2)
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["latest", "step_000005", "step_000006"]
    # killed between the rename aside and the delete: a .tmp- directory, which the next start sweeps
    import shutil

    real_rmtree = shutil.rmtree

    def killed_while_pruning(path, *a, **k):
        if "pruned" in str(path):
            raise KeyboardInterrupt("killed while deleting an old checkpoint")
        return real_rmtree(path, *a, **k)

    monkeypatch.setattr("shutil.rmtree", killed_while_pruning)
    with pytest.raises(KeyboardInterrupt):
        run.save_checkpoint(7, FileLearner(7), {"version": 7}, keep=2)
    monkeypatch.undo()
    learner = FileLearner()
    assert RunDir(str(tmp_path / "run")).load_checkpoint(learner)["step"] == 7 and learner.value == 7
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == [
        "latest",
        "step_000006",
        "step_000007",
    ]


def test_a_checkpoint_is_durable_before_latest_names_it(tmp_path, monkeypatch):
    """After a power loss `latest` must not name files the disk never got: every file and directory of the new
    checkpoint is fsynced before it is renamed into place, and the rename is fsynced before `latest` is replaced."""
    import os

    import rl.atomic_files as atomic
    import rl.train.checkpoints as checkpoints

    events, synced = [], set()
    real_fsync, real_open = os.fsync, os.open
    opened = {}

    def tracking_open(path, flags, *a):
        fd = real_open(path, flags, *a)
        opened[fd] = str(path)
        return fd

    def tracking_fsync(fd):
        synced.add(opened.get(fd, fd))
        return real_fsync(fd)

    def recorded(name, fn):
        def call(*args, **kwargs):
            events.append((name, *(str(a) for a in args[:2])))
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(atomic.os, "open", tracking_open)
    monkeypatch.setattr(atomic.os, "fsync", tracking_fsync)
    for name in ("fsync_tree", "fsync_dir", "replace_dir", "write_text"):
        monkeypatch.setattr(checkpoints, name, recorded(name, getattr(checkpoints, name)))
    run = RunDir(str(tmp_path / "run"))
    final = run.save_checkpoint(3, FileLearner(3), {"version": 3})
    kinds = [e[0] for e in events]
    tree, swap = kinds.index("fsync_tree"), kinds.index("replace_dir")
    latest = next(i for i, e in enumerate(events) if e[0] == "write_text" and e[1].endswith("latest"))
    assert tree < swap < latest and "fsync_dir" in kinds[swap:latest] and kinds[latest + 1] == "fsync_dir", events
    tmp = events[tree][1]  # every file and directory of the checkpoint, under its temporary name
    files = [str(p.relative_to(final)) for p in final.rglob("*")]
    assert {str(Path(tmp) / f) for f in files} <= synced and tmp in synced, (files, synced)


def test_resume_falls_back_when_latest_names_an_incomplete_checkpoint(tmp_path):
    """After a power loss `latest` can name a checkpoint whose files are empty: resume takes the newest complete
    one, with a warning, instead of a traceback."""
    run = RunDir(str(tmp_path / "run"))
    run.save_checkpoint(2, FileLearner(2), {"version": 2})
    run.save_checkpoint(4, FileLearner(4), {"version": 4})
    (tmp_path / "run" / "checkpoints" / "step_000004" / "trainer_state.json").write_text("")
    learner = FileLearner()
    with pytest.warns(UserWarning, match="step_000004, which is incomplete; resuming from step_000002"):
        state = RunDir(str(tmp_path / "run")).load_checkpoint(learner)
    assert state["step"] == 2 and learner.value == 2


def test_a_second_driver_on_a_locked_run_dir_is_refused(tmp_path):
    """A driver holds RUN_DIR/.lock while it runs; another one (a requeue, a duplicate --resume) is refused in
    seconds, naming the holder, before it deletes anything; the lock goes with the holder's process."""
    import subprocess
    import sys
    import time

    from rl.train.run_dir import RunDirError

    run = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
from rl.train.run_dir import RunDir
r = RunDir.new({str(run)!r})
(r.path / "config.yaml").write_text("train: {{}}\\n")
(r.ckpt_root / ".tmp-step_000003-1").mkdir()
print("locked", flush=True)
time.sleep(60)
""",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        t = time.monotonic()
        for resume in (False, True):
            with pytest.raises(RunDirError, match=rf"in use by fbrl train \(pid {holder.pid} on "):
                RunDir.existing(str(run)) if resume else RunDir.new(str(run), overwrite=True)
        assert time.monotonic() - t < 5
        assert (run / "checkpoints" / ".tmp-step_000003-1").is_dir()  # the holder's checkpoint in progress
    finally:
        holder.kill()
        holder.wait()
    RunDir.new(str(run), overwrite=True)  # the holder is gone, and its lock with it


def test_a_torn_last_metrics_row_does_not_block_resume(tmp_path):
    """A crash or a full disk mid-append leaves half a row at the end: it is dropped with a warning (the step is
    logged again after the resume); a bad row elsewhere is an error naming file:line."""
    from rl.train.run_dir import RunDirError

    run = RunDir(str(tmp_path / "run"))
    for step in range(1, 4):
        run.log_metrics({"step": step, "reward_mean": step / 10})
    path = tmp_path / "run" / "metrics.jsonl"
    whole = path.read_text()
    path.write_text(whole + '{"step": 4, "rew')
    with pytest.warns(UserWarning, match=r"metrics\.jsonl:4: the last row is cut short"):
        assert [r["step"] for r in run.read_metrics()] == [1, 2, 3]
    with pytest.warns(UserWarning):
        run.truncate_metrics_after(3)
    assert path.read_text() == whole  # the resume rewrites the file without the torn tail
    path.write_text(whole.replace('"step": 2', '"step": 2,,'))
    with pytest.raises(RunDirError, match=r"metrics\.jsonl:2: not a JSON row"):
        run.read_metrics()


def test_nonfinite_metrics_are_written_as_strict_json(tmp_path):
    """A NaN loss or an infinite gradient norm is logged as null: every line parses as strict JSON (Python's
    default writer would emit NaN / Infinity, which jq, pandas and browsers refuse)."""
    run = RunDir(str(tmp_path / "run"))
    run.log_metrics({"step": 1, "learner/grad_norm": float("inf"), "learner/loss": float("nan"), "reward_mean": 0.5})
    line = (tmp_path / "run" / "metrics.jsonl").read_text()

    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    row = json.loads(line, parse_constant=refuse)
    assert row == {"step": 1, "learner/grad_norm": None, "learner/loss": None, "reward_mean": 0.5}
    assert run.read_metrics() == [row]


def test_a_submitted_job_puts_its_run_where_it_lasts(tmp_path):
    """Inside Ray's copy of a job's working dir (`ray job submit --working-dir`), a run without train.run_dir goes
    to $FBRL_RUNS_DIR/<time>, a relative one is refused naming the key, an absolute one stays; elsewhere nothing
    changes."""
    from rl.train.run_dir import RunDirError, durable_run_dir

    copy = tmp_path / "session_x" / "runtime_resources" / "working_dir_files" / "_ray_pkg_abc"
    copy.mkdir(parents=True)
    env = {"FBRL_RUNS_DIR": str(tmp_path / "runs")}
    derived = Path(durable_run_dir(None, copy, env))
    assert derived.is_absolute() and derived.parent == tmp_path / "runs"
    assert durable_run_dir("/data/run1", copy, env) == "/data/run1"
    with pytest.raises(RunDirError, match=r"train.run_dir=runs/x is relative.*Ray's copy"):
        durable_run_dir("runs/x", copy, env)
    assert durable_run_dir(None, tmp_path, env) is None and durable_run_dir("runs/x", tmp_path, env) == "runs/x"
    assert str(Path(durable_run_dir(None, copy, {})).parent) == str(Path.home() / "fbrl-runs")


def test_leftovers_of_dead_writers_are_recovered_or_swept(tmp_path):
    """At start (under the run-directory lock): a directory `replace_dir` renamed aside whose replacement never
    arrived (a crash between its two renames) is renamed back; other old copies and temporaries of processes that
    are gone are deleted; a live process's temporaries are left alone."""
    import subprocess

    from rl.atomic_files import sweep_leftovers

    dead = subprocess.Popen(["true"])
    dead.wait()
    live = subprocess.Popen(["sleep", "60"])
    try:
        run = tmp_path / "run"
        (run / f".policy.old-{dead.pid}").mkdir(parents=True)  # policy/ missing: the old copy is all there is
        (run / f".policy.old-{dead.pid}" / "model.safetensors").write_text("w")
        (run / "policy_adapter").mkdir()
        (run / f".policy_adapter.old-{dead.pid}").mkdir()  # its replacement arrived: the old copy goes
        (run / f".policy.tmp-{dead.pid}").mkdir()
        (run / f".metrics.jsonl.tmp-{dead.pid}").write_text("{")
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / f".tmp-step_000004-{dead.pid}").mkdir()
        (run / "checkpoints" / f".tmp-step_000005-{live.pid}").mkdir()  # another live writer's: kept
        lines = sweep_leftovers(run) + sweep_leftovers(run / "checkpoints")
        assert (run / "policy" / "model.safetensors").read_text() == "w"
        assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "policy", "policy_adapter"]
        assert [p.name for p in (run / "checkpoints").iterdir()] == [f".tmp-step_000005-{live.pid}"]
        assert len(lines) == 5 and sum("restored from" in x for x in lines) == 1
    finally:
        live.kill()


def test_a_killed_engines_scratch_files_are_swept(tmp_path):
    import subprocess

    from rollout.vllm_env import sweep_scratch

    dead = subprocess.Popen(["true"])
    dead.wait()
    mine = tmp_path / f"fbrl_weights_{__import__('os').getpid()}_ab_3.safetensors"
    theirs = tmp_path / f"fbrl_states_{dead.pid}_cd_7.safetensors"
    for p in (mine, theirs, tmp_path / "other.safetensors"):
        p.write_text("x")
    assert sweep_scratch(str(tmp_path)) == [str(theirs)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, "other.safetensors"])


def test_a_relative_run_dir_reaches_the_ranks_as_an_absolute_path(tmp_path, monkeypatch):
    """The ranks and engines run in other processes, on other nodes, in other working directories: the paths the
    run directory hands them (checkpoints, the weights file) are absolute."""
    from rl.train.run_dir import weights_file

    monkeypatch.chdir(tmp_path)
    seen = []

    class Recording(FileLearner):
        def save_checkpoint(self, directory):
            seen.append(directory)
            return super().save_checkpoint(directory)

    run = RunDir("relative/run")
    run.save_checkpoint(1, Recording(1), {"version": 1})
    assert seen and all(Path(d).is_absolute() and Path(d).is_relative_to(tmp_path) for d in seen), seen
    assert Path(weights_file(run)).is_absolute()
