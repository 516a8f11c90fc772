"""`logging.report_to`: the metrics of every step reach TensorBoard (event files in RUN_DIR/tensorboard, read back
with tensorboard's own reader) beside wandb, on a 2-step tiny job."""

from __future__ import annotations

from pathlib import Path

from test_faults_async import local_args

from actors.cli import main


def test_tensorboard_gets_every_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = local_args(tmp_path, "train.steps=2", "logging.report_to=[tensorboard]")
    assert main(args) == 0
    events = EventAccumulator(str(Path(tmp_path) / "run" / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert "reward_mean" in tags and "learner/loss" in tags, tags
    assert [e.step for e in events.Scalars("reward_mean")] == [1, 2]
    assert not (tmp_path / "run" / "wandb").exists()  # wandb was not asked for
