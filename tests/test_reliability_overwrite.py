"""`--overwrite` deletes what fbrl wrote into a run directory and nothing else (the user's hidden files, such as
.git and .env, stay), and accepts every directory an fbrl run makes (tensorboard/, base_model/, policy_adapter/)."""

from __future__ import annotations

import pytest

from rl.train.run_dir import RunDir, RunDirError


def earlier_run(path):
    """What runs of fbrl leave, with a stale temporary of a writer that is gone, beside the user's hidden files."""
    path.mkdir()
    for name in ("config.yaml", "metrics.jsonl", "summary.md", ".lock"):
        (path / name).write_text("x")
    for name in ("checkpoints/step_000001", "tensorboard", "base_model", "policy_adapter", "policy", "plots", "eval"):
        (path / name).mkdir(parents=True)
        (path / name / "f").write_text("x")
    (path / ".policy.tmp-999999999").mkdir()  # a policy export that a killed driver left
    (path / ".git").mkdir()
    (path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (path / ".env").write_text("WANDB_API_KEY=mine\n")


def test_overwrite_deletes_only_what_fbrl_wrote(tmp_path):
    run = tmp_path / "run"
    earlier_run(run)
    RunDir.new(str(run), overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == [".env", ".git", ".lock", "checkpoints"]
    assert (run / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n" and (run / ".env").read_text()
    assert list((run / "checkpoints").iterdir()) == []


def test_overwrite_still_refuses_what_is_not_a_run(tmp_path):
    other = tmp_path / "other"
    earlier_run(other)
    (other / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match=r"does not look like an fbrl run directory \(it holds notes.txt\)"):
        RunDir.new(str(other), overwrite=True)
    assert (other / "notes.txt").exists() and (other / "metrics.jsonl").exists()


def test_overwrite_keeps_hidden_files_beside_a_plain_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("x")
    (run / "metrics.jsonl").write_text("x")
    (run / ".git").mkdir()
    (run / ".env").write_text("WANDB_API_KEY=mine\n")
    RunDir.new(str(run), overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == [".env", ".git", ".lock", "checkpoints"]
