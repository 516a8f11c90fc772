"""`--resume` with a learner that cannot load the checkpoint (another world size or ZeRO stage, or --no-ray's one
rank for a checkpoint of several): refused before any worker starts, exit 2, in one line naming both sizes and the
command that starts a new run from the checkpoint's weights. Before, a changed size was refused without a way on,
and `--no-ray` loaded a 2-rank ZeRO-2 checkpoint into one rank and died in DeepSpeed with a traceback."""

import os

import pytest

from rl.config import load_config
from rl.train.run_dir import RunDir, RunDirError


class PartitionedLearner:
    """Writes what DeepSpeed ZeRO 1-3 writes: one optimizer partition per rank (`ranks`), or none (ZeRO-0)."""

    def __init__(self, ranks: int):
        self.ranks = ranks

    def save_checkpoint(self, directory):
        state = f"{directory}/deepspeed/state"
        os.makedirs(state)
        os.makedirs(f"{directory}/model")
        open(f"{state}/mp_rank_00_model_states.pt", "wb").close()
        for r in range(self.ranks):
            open(f"{state}/zero_pp_rank_{r}_mp_rank_00_optim_states.pt", "wb").close()


def saved_run(tmp_path, workers: int, stage: int, partitions: int) -> RunDir:
    run = RunDir(str(tmp_path / "run"))
    run.write_config(load_config(None, [f"learner.num_workers={workers}", f"learner.zero_stage={stage}"]))
    run.save_checkpoint(3, PartitionedLearner(partitions), {"version": 3})
    return run


def job(workers: int, stage: int):
    return load_config(None, [f"learner.num_workers={workers}", f"learner.zero_stage={stage}"])


def test_two_ranks_to_one_is_refused_in_one_line_with_the_way_on(tmp_path):
    run = saved_run(tmp_path, 2, 2, 2)
    with pytest.raises(RunDirError) as e:
        run.check_resume_layout(job(1, 2), 1)
    line = str(e.value)
    assert "\n" not in line
    assert (
        "step_000003 was saved by 2 learner ranks at ZeRO-2" in line and "this job has 1 learner rank at ZeRO-2" in line
    )
    assert "Resume on Ray with learner.num_workers=2 learner.zero_stage=2" in line
    ckpt = tmp_path / "run" / "checkpoints" / "step_000003"
    assert (
        f"fbrl train {run.path}/config.yaml model.path={ckpt}/learner/model learner.num_workers=1 "
        f"learner.zero_stage=2 train.steps=27 train.run_dir=NEW_RUN_DIR"
    ) in line  # the default job's 30 steps, 3 done
    run.check_resume_layout(job(2, 2), 2)  # the same layout resumes


def test_no_ray_runs_one_rank_and_is_refused_for_a_checkpoint_of_two(tmp_path):
    run = saved_run(tmp_path, 2, 2, 2)
    with pytest.raises(
        RunDirError, match=r"this job has 1 learner rank at ZeRO-2 \(--no-ray: in-.*learner.num_workers=1 "
    ):
        run.check_resume_layout(job(2, 2), 1)


def test_what_the_ranks_wrote_counts_not_what_the_config_said(tmp_path):
    """A --no-ray run of a 2-worker config wrote one partition: it resumes with one rank, and not with two."""
    run = saved_run(tmp_path, 2, 2, 1)
    run.check_resume_layout(job(2, 2), 1)
    run.check_resume_layout(job(1, 2), 1)
    with pytest.raises(RunDirError, match="saved by 1 learner rank at ZeRO-2"):
        run.check_resume_layout(job(2, 2), 2)


def test_zero_stage_changes_and_whole_state_checkpoints(tmp_path):
    run = saved_run(tmp_path, 2, 0, 0)  # ZeRO-0: no partitions, the whole state in one file
    run.check_resume_layout(job(2, 0), 1)  # --no-ray of a ZeRO-0 run
    run.check_resume_layout(job(1, 0), 1)  # another world size (test_zero0_two_ranks_resume_as_one below)
    run.check_resume_layout(job(4, 0), 4)
    with pytest.raises(RunDirError, match="saved by 2 learner ranks at ZeRO-0.*this job has 2 learner ranks at ZeRO-1"):
        run.check_resume_layout(job(2, 1), 2)


def test_fbrl_train_refuses_it_with_exit_2(tmp_path, capsys, monkeypatch):
    """Refused by the checks that run while Ray starts (here a stand-in that starts nothing): one line, exit code 2."""
    import actors.placement
    from actors.cli import main

    saved_run(tmp_path, 2, 2, 2)
    monkeypatch.setattr(actors.placement, "init_ray", lambda cfg: None)
    assert main(["train", "--resume", str(tmp_path / "run"), "learner.num_workers=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"fbrl train: error: --resume {tmp_path / 'run'}: step_000003 was saved by 2"
    )


@pytest.mark.slow
def test_zero0_two_ranks_resume_as_one(tmp_path):
    """The real stack (local Ray, torch engine, DeepSpeed): a ZeRO-0 run of 2 learner ranks, checkpointed after
    steps 1 and 2; its step-1 checkpoint resumed by one rank (--no-ray) makes step 2 again. The weights after that
    update equal the 2-rank run's to fp32 rounding (1e-6), 100 times below what the update moved: weights and Adam's
    moments were both restored (fresh moments would make a different step)."""
    import shutil
    import subprocess
    import sys

    from safetensors.torch import load_file

    from rl.config.loading import DEFAULT_CONFIG

    def fbrl(*argv):
        p = subprocess.run([sys.executable, "-m", "actors.cli", "train", *argv], capture_output=True, text=True)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]

    two, one = tmp_path / "two", tmp_path / "one"
    fbrl(str(DEFAULT_CONFIG), "learner.num_workers=2", "learner.zero_stage=0", "train.steps=2",
         "train.checkpoint_every=1", "train.eval_every=0", "train.prompts_per_step=4", "rollout.n_samples_per_prompt=4",
         "train.mismatch_parts_frac=0", "logging.wandb_mode=disabled", "logging.progress=false", f"run_dir={two}")  # fmt: skip
    shutil.copytree(two, one, ignore=shutil.ignore_patterns(".lock", "step_000002"))
    (one / "checkpoints" / "latest").write_text("step_000001")
    fbrl("--resume", str(one), "--no-ray")

    def weights(run, step):
        return load_file(str(run / "checkpoints" / f"step_{step:06d}" / "learner" / "model" / "model.safetensors"))

    a, b, before = weights(two, 2), weights(one, 2), weights(two, 1)
    moved = max((a[k] - before[k]).abs().max().item() for k in a)
    assert max((a[k] - b[k]).abs().max().item() for k in a) < min(1e-6, moved / 100), moved
