"""bench/study_estimators.py: the per-estimator comparison table, JSON and plot from the arms' metrics rows."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load_study():
    spec = importlib.util.spec_from_file_location("study_estimators", ROOT / "bench" / "study_estimators.py")
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
    results = {"replay": _rows(0.342, 0.714, [0.4] * 5 + [0.7] * 5, 1.0),
               "standard": _rows(0.338, 0.350, [0.4] * 10, 0.9)}
    for arm, rows in results.items():   # what `fbrl train` leaves in each arm's run dir
        (tmp_path / arm).mkdir()
        (tmp_path / arm / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert study.main(["--out", str(tmp_path), "--arms", "replay", "standard", "--collect"]) == 0
    md = (tmp_path / "comparison.md").read_text()
    assert "| replay | 0.342 | 0.714 | +37.2 | 0.400 → 0.700 |" in md
    assert "| standard | 0.338 | 0.350 | +1.2 | 0.400 → 0.400 |" in md
    table = json.loads((tmp_path / "comparison.json").read_text())
    assert table["replay"]["steps"] == 10 and abs(table["standard"]["time_learner_s_mean"] - 0.9) < 1e-12
    assert (tmp_path / "comparison.png").stat().st_size > 1000
