"""`train.keep_best`: the n best checkpoints by a metric survive `train.keep_checkpoints`, are listed in
checkpoints/best.json, and stay kept across a resume; a metric that can never be logged is refused at load naming
`train.keep_best.metric`, one that only the job can judge gets one warning line."""

import json
import warnings

import pytest

from rl.config import ConfigError, load_config
from rl.config.checkpointing import KeepBestConfig
from rl.train.best_checkpoints import read_best
from rl.train.run_dir import RunDir


class FileLearner:
    def save_checkpoint(self, directory):
        import os

        os.makedirs(directory)
        open(f"{directory}/weights.txt", "w").write("w")


def kept(tmp_path) -> list[int]:
    return sorted(int(p.name[5:]) for p in (tmp_path / "run" / "checkpoints").glob("step_*"))


def run_steps(run: RunDir, values: dict[int, float], rule: KeepBestConfig, keep: int = 2) -> None:
    """Each step: its row logged (the loop writes it before the checkpoint), then its checkpoint."""
    for step, value in values.items():
        run.log_metrics({"step": step, "reward_mean": value, "eval_accuracy": value if step % 2 == 0 else None})
        run.save_checkpoint(step, FileLearner(), {"version": step}, keep=keep, best=rule)


def test_the_best_are_never_pruned_and_best_json_lists_them(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    rewards = {1: 0.1, 2: 0.9, 3: 0.3, 4: 0.8, 5: 0.2, 6: 0.4, 7: 0.5}
    run_steps(run, rewards, KeepBestConfig("reward_mean", 2, "max"))
    assert kept(tmp_path) == [2, 4, 6, 7]  # the 2 best (0.9, 0.8) and the newest 2
    record = read_best(tmp_path / "run" / "checkpoints")
    assert record["metric"] == "reward_mean" and record["mode"] == "max" and record["n"] == 2
    assert [(c["step"], c["name"], c["value"]) for c in record["checkpoints"]] == [
        (2, "step_000002", 0.9),
        (4, "step_000004", 0.8),
    ]


def test_min_mode_and_checkpoints_without_the_metric(tmp_path):
    """An eval metric ranks only checkpoints of steps that had an eval (null elsewhere); min: lower is better."""
    run = RunDir(str(tmp_path / "run"))
    run_steps(
        run, {1: 0.0, 2: 0.5, 3: 0.0, 4: 0.2, 5: 0.0, 6: 0.7, 7: 0.0, 8: 0.9}, KeepBestConfig("eval_accuracy", 1, "min")
    )
    assert kept(tmp_path) == [4, 7, 8]
    assert [c["step"] for c in read_best(tmp_path / "run" / "checkpoints")["checkpoints"]] == [4]


def test_a_resume_keeps_honouring_them(tmp_path):
    """A new driver on the same run (a resume) ranks from metrics.jsonl and the checkpoints on disk: the earlier
    best stays kept; the rows after the restored step are dropped and logged again."""
    rule = KeepBestConfig("reward_mean", 1, "max")
    run_steps(RunDir(str(tmp_path / "run")), {1: 0.2, 2: 0.9, 3: 0.3, 4: 0.5}, rule)
    assert kept(tmp_path) == [2, 3, 4]
    resumed = RunDir(str(tmp_path / "run"))
    resumed.truncate_metrics_after(4)
    run_steps(resumed, {5: 0.1, 6: 0.3, 7: 0.4}, rule)
    assert kept(tmp_path) == [2, 6, 7]
    assert [c["step"] for c in read_best(tmp_path / "run" / "checkpoints")["checkpoints"]] == [2]
    run_steps(resumed, {8: 0.95, 9: 0.0}, rule)  # a new best: the old one goes
    assert kept(tmp_path) == [8, 9]


def test_the_values_follow_metrics_jsonl_when_a_restore_rewrites_it(tmp_path):
    """A rebuilt learner restores a step and its later rows are dropped and logged again: the ranking reads the
    new values, not the ones it had read before (the file is rewritten, not appended to)."""
    from rl.train.best_checkpoints import MetricHistory

    run = RunDir(str(tmp_path / "run"))
    history = MetricHistory(tmp_path / "run" / "metrics.jsonl", "reward_mean")
    for step, value in ((1, 0.5), (2, 0.75), (3, 0.25)):
        run.log_metrics({"step": step, "reward_mean": value})
    assert history.refresh() == {1: 0.5, 2: 0.75, 3: 0.25}
    run.truncate_metrics_after(1)
    run.log_metrics({"step": 2, "reward_mean": 0.125})  # the same length as the row it replaces
    assert history.refresh() == {1: 0.5, 2: 0.125}
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "reward_me')  # a row being written (or torn): read once it is whole
    assert history.refresh() == {1: 0.5, 2: 0.125}


def test_a_metric_no_row_has_warns_once(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_steps(run, {1: 0.1, 2: 0.2, 3: 0.3}, KeepBestConfig("reward/typo", 1, "max"))
    lines = [str(w.message) for w in caught if "train.keep_best.metric" in str(w.message)]
    assert len(lines) == 1, lines
    assert "'reward/typo' is in none of the 1 rows" in lines[0] and "reward_mean" in lines[0]
    assert kept(tmp_path) == [2, 3]  # nothing ranked: keep_checkpoints alone


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.keep_best={metric: eval/accuracy, n: 2}", "is not a key of metrics.jsonl rows (did you mean"),
        ("train.keep_best={metric: eval_accuracy}", "train.eval_every is 0"),
        ("train.keep_best={metric: eval_accuracy_greedy}", "'greedy' is not one of train.eval_decode_modes"),
        ("train.keep_best={metric: reward_mean, mode: best}", "expected one of 'max', 'min'"),
        ("train.keep_best={metric: reward_mean, n: 0}", "must be >= 1"),
    ],
)
def test_a_metric_that_cannot_be_logged_is_refused_at_load(override, message):
    with pytest.raises(ConfigError, match="^train.keep_best.(metric|mode|n): ") as e:
        load_config(None, [override, "train.eval_every=0" if "eval_every is 0" in message else "train.eval_every=5"])
    assert message in str(e.value)


def test_the_config_knows_the_reports_metric_names():
    from rl.config import checkpointing
    from rl.report import metrics

    assert (checkpointing.EVAL_ACCURACY, checkpointing.EVAL_LENIENT) == (metrics.EVAL_ACCURACY, metrics.EVAL_LENIENT)
    for family in (metrics.REWARD, metrics.LEARNER, metrics.MISMATCH_PARTS, metrics.FAULTS):
        assert family in checkpointing.METRIC_FAMILIES
    cfg = load_config(None, ["train.keep_best={metric: reward_mean, n: 3, mode: min}"])
    assert cfg.train.keep_best == KeepBestConfig("reward_mean", 3, "min")
    assert load_config(None).train.keep_best is None  # off by default
    assert json.loads(json.dumps(cfg.to_dict()))["train"]["keep_best"]["n"] == 3


def test_the_job_keeps_the_best_and_the_newest(tmp_path, capsys):
    """In-process workers (torch engine): 4 steps checkpointed each, keep_checkpoints 1 and the best by reward_mean:
    the newest and the best step of metrics.jsonl stay, best.json names the best."""
    from fault_harness import metrics_of
    from test_faults_async import local_args

    from actors.cli import main

    overrides = ["train.steps=4", "train.checkpoint_every=1", "train.keep_checkpoints=1"]
    assert main(local_args(tmp_path, *overrides, "train.keep_best={metric: reward_mean, n: 1}")) == 0
    rows = metrics_of(tmp_path / "run")
    best = max(rows, key=lambda r: (r["reward_mean"], -r["step"]))["step"]
    assert kept(tmp_path) == sorted({best, 4})
    assert [c["step"] for c in read_best(tmp_path / "run" / "checkpoints")["checkpoints"]] == [best]
