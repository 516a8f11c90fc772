"""examples/study_estimators.py: the per-estimator comparison table, JSON and plot from the arms' metrics rows."""

import importlib.util
import json

from conftest import ROOT


def _load_study():
    spec = importlib.util.spec_from_file_location("study_estimators", ROOT / "examples" / "study_estimators.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(acc_start, acc_end, rewards, learner_s):
    rows = [{"step": 0, "eval_accuracy": acc_start}]
    for i, r in enumerate(rewards, start=1):
        row = {"step": i, "reward_mean": r, "logprob_mismatch_abs_mean": 1e-8, "time_learner_s": learner_s}
        if i == len(rewards):
            row["eval_accuracy"] = acc_end
        rows.append(row)
    return rows


def test_comparison_table_json_and_plot(tmp_path):
    study = _load_study()
    results = {
        "replay": _rows(0.342, 0.714, [0.4] * 5 + [0.7] * 5, 1.0),
        "standard": _rows(0.338, 0.350, [0.4] * 10, 0.9),
    }
    for arm, rows in results.items():  # what `fbrl train` leaves in each arm's run dir
        (tmp_path / arm).mkdir()
        (tmp_path / arm / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert study.main(["--out", str(tmp_path), "--arms", "replay", "standard", "--collect"]) == 0
    md = (tmp_path / "comparison.md").read_text()
    assert "| replay | 0.342 | 0.714 | +37.2 | 0.400 → 0.700 |" in md
    assert "| standard | 0.338 | 0.350 | +1.2 | 0.400 → 0.400 |" in md
    table = json.loads((tmp_path / "comparison.json").read_text())["runs"]
    assert table["replay"]["steps"] == 10 and abs(table["standard"]["time_learner_s_mean"] - 0.9) < 1e-12
    assert (tmp_path / "comparison.png").stat().st_size > 1000


def test_seed_repeats_and_custom_arms(tmp_path):
    """Two seeds per arm: runs land in <arm>-seed<S>, and the per-arm table gives each seed's gain, the mean and
    the spread; an arm defined with --arm is accepted by name."""
    study = _load_study()
    gains = {
        ("replay", 0): (0.30, 0.50),
        ("replay", 1): (0.30, 0.46),
        ("mine", 0): (0.30, 0.32),
        ("mine", 1): (0.30, 0.36),
    }
    for (arm, seed), (a, b) in gains.items():
        (tmp_path / f"{arm}-seed{seed}").mkdir()
        (tmp_path / f"{arm}-seed{seed}" / "metrics.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in _rows(a, b, [0.5] * 6, 1.0))
        )
    assert (
        study.main(
            [
                "--out",
                str(tmp_path),
                "--arms",
                "replay",
                "mine",
                "--arm",
                "mine",
                "likelihood.estimator=kpass",
                "likelihood.passes=2",
                "--seeds",
                "0",
                "1",
                "--collect",
            ]
        )
        == 0
    )
    md = (tmp_path / "comparison.md").read_text()
    assert "| replay | 2 | +20.0, +16.0 | +18.0 | 4.0 |" in md
    assert "| mine | 2 | +2.0, +6.0 | +4.0 | 4.0 |" in md
    by_arm = json.loads((tmp_path / "comparison.json").read_text())["gain_points_by_arm"]
    assert [round(x, 6) for x in by_arm["replay"]] == [20.0, 16.0]
    assert study.ARMS["kpass1"] == ["likelihood.estimator=kpass", "likelihood.passes=1"]
