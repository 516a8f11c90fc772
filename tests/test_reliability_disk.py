"""A full disk while a checkpoint is written stops the job with one line naming the disk and the path (exit code 3),
deletes the half-written checkpoint and leaves `latest` on the last complete one; `--resume` then completes the run
(in-process workers: torch engine, torch learner)."""

from __future__ import annotations

import errno

from fault_harness import check_checkpoints, data_lost, fault_record, metrics_of  # noqa: F401
from test_faults_async import local_args
from test_reliability_signals import expected_digests_of


def test_a_full_disk_mid_checkpoint_stops_cleanly_and_resume_completes(tmp_path, monkeypatch, capsys, fault_record):
    import rl.train.checkpoints
    from actors.cli import main

    real, calls = rl.train.checkpoints.save_file, []

    def full_at_the_second(tensors, path):
        calls.append(path)
        if len(calls) == 2:  # step 2's checkpoint, its learner state already written
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real(tensors, path)

    monkeypatch.setattr(rl.train.checkpoints, "save_file", full_at_the_second)
    code = main(local_args(tmp_path, "train.steps=3", "train.checkpoint_every=1"))
    out, err = capsys.readouterr()
    run_dir = tmp_path / "run"
    assert code == 3, (out[-2000:], err[-2000:])
    line = [x for x in err.splitlines() if x.startswith("fbrl train: stopped:")]
    assert len(line) == 1 and "Traceback" not in out + err, err
    assert "the disk is full (no space left on device) writing " in line[0], line
    assert f"{run_dir}/checkpoints/.tmp-step_000002-" in line[0] and "continues from step_000001" in line[0], line
    assert not list(run_dir.glob("**/.tmp-*")) and not list(run_dir.glob("**/.*.tmp-*"))  # nothing half-written
    check_checkpoints(run_dir, 1, [1])
    assert [r["step"] for r in metrics_of(run_dir)] == [1, 2]  # step 2 was logged; the resume runs it again
    monkeypatch.setattr(rl.train.checkpoints, "save_file", real)
    assert main(["train", "--no-ray", "--resume", str(run_dir)]) == 0
    rows = metrics_of(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    check_checkpoints(run_dir, 3, [1, 2, 3])
    fault_record(
        fault="the disk full (ENOSPC, injected) while step 2's checkpoint is written, in-process workers (torch engine)",
        outcome=f"one line: “{line[0].replace(str(tmp_path), '…')[:200]} …”; the half-written checkpoint deleted, "
        f"`latest` still step 1; `--resume` ran step 2 again and completed step 3",
        steps_lost="1 (step 2, logged before its checkpoint failed, run again)",
        data_lost=data_lost(rows, expected_digests_of(run_dir, 3)),
        run_dir=run_dir,
        exit_code=f"{code}, then 0 on `--resume`",
        detected_s="at the write that failed (the OSError's errno)",
    )


def test_a_full_disk_is_recognised_through_a_worker_error():
    """A learner on Ray re-raises the rank's OSError as Ray's own type: its text still says the disk is full."""
    from rl.atomic_files import disk_full

    assert disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert disk_full(RuntimeError("ray::LearnerRank.save_checkpoint() ... OSError: [Errno 28] No space left on device"))
    assert not disk_full(OSError(errno.EACCES, "Permission denied")) and not disk_full(ValueError("x"))
