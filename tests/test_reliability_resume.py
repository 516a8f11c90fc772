"""A step's metrics row is written before anything after the update that can fail or be killed (its checkpoint,
the policy export), so a resumed run logs every step exactly once (in-process workers: torch engine, torch
learner)."""

from __future__ import annotations

import pytest
from fault_harness import data_lost, expected_digests, fault_record, metrics_of  # noqa: F401
from test_faults_async import local_args


class Killed(BaseException):
    """Stands for a SIGKILL of the driver: nothing after it runs (not an Exception, so nothing handles it)."""


def test_killed_between_the_checkpoint_and_the_row_resume_logs_every_step_once(tmp_path, monkeypatch, fault_record):
    """The driver dies in step 2's policy export, after step 2's checkpoint is in place: `--resume` continues from
    it, and metrics.jsonl holds steps 1-4 once each, with the prompts an uninterrupted run draws."""
    from actors.cli import main
    from actors.cli.launch import load_train_config
    from rl.train.run_dir import RunDir

    real = RunDir.export_policy

    def dies_exporting(self, *args, **kwargs):
        raise Killed("killed during the policy export of step 2")

    monkeypatch.setattr(RunDir, "export_policy", dies_exporting)
    args = local_args(tmp_path, "train.steps=4", "train.checkpoint_every=2")
    with pytest.raises(Killed):
        main(args)
    run_dir = tmp_path / "run"
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000002"
    monkeypatch.setattr(RunDir, "export_policy", real)
    assert main(["train", "--no-ray", "--resume", str(run_dir)]) == 0
    rows = metrics_of(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    cfg = load_train_config(type("Args", (), {"config": None, "overrides": [], "resume": str(run_dir)})())[1]
    assert [r["prompts_digest"] for r in rows] == expected_digests(cfg, 4)
    fault_record(
        fault="the driver dies in step 2's policy export, after its checkpoint is in place (an exception that "
        "nothing handles stands for the SIGKILL), in-process workers (torch engine)",
        outcome="`latest` named step 2; `--resume` continued at step 3 and completed step 4; metrics.jsonl holds "
        "step 2, written before the checkpoint, once",
        steps_lost="0",
        data_lost=data_lost(rows, expected_digests(cfg, 4)),
        run_dir=run_dir,
        exit_code="killed, then 0 on `--resume`",
        detected_s="at `--resume` (the checkpoint `latest` names)",
    )
