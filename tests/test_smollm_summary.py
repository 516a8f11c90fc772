"""`make smollm-rl`'s summary (scripts/smollm_rl.py): start vs end on the same held-out problems under both
reads, the lift in points and McNemar's exact p, from the per-problem records a run writes (RUN_DIR/eval/)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rl.train.run_dir import RunDir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts.smollm_rl import format_summary, mcnemar, summarize  # noqa: E402


def record(step, strict, lenient, answers=None):
    answers = answers or [str(i) for i in range(len(strict))]
    return {
        "step": step,
        "policy_version": step + 1,
        "answers": answers,
        "questions": answers,
        "modes": {
            "soft": {
                "strict": strict,
                "lenient": lenient,
                "truncated": [0] * len(strict),
                "responses": [""] * len(strict),
            }
        },
    }


def test_mcnemar_counts_gains_and_losses_on_the_same_problems():
    r = mcnemar([1, 0, 0, 0, 1, 0], [1, 1, 1, 1, 0, 0])
    assert (r["gained"], r["lost"], r["n"]) == (3, 1, 6)
    assert r["lift_points"] == pytest.approx(100 * 2 / 6) and r["p_value"] == pytest.approx(0.625)
    with pytest.raises(ValueError, match="same problems"):
        mcnemar([1], [1, 0])


def test_summary_pairs_the_first_and_last_eval_under_both_reads(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    n = 40
    run.write_eval(0, record(0, [0] * n, [1] * 5 + [0] * (n - 5)))
    run.write_eval(5, record(5, [1] * 20 + [0] * 20, [1] * 5 + [0] * (n - 5)))  # the format only: lenient flat
    run.write_eval(10, record(10, [1] * 30 + [0] * 10, [1] * 12 + [0] * (n - 12)))
    for step in range(1, 11):
        run.log_metrics({"step": step, "time_step_s": 30.0 + step, "skipped": int(step == 3), "reward_mean": 0.1})
    s = summarize(run.path, wall_s=600)
    assert s["steps"] == [0, 10] and s["n"] == n
    strict, lenient = s["modes"]["soft"]["strict"], s["modes"]["soft"]["lenient"]
    assert strict["lift_points"] == pytest.approx(75.0) and strict["p_value"] < 1e-6
    assert (lenient["gained"], lenient["lost"]) == (7, 0) and lenient["p_value"] == pytest.approx(2 / 2**7)
    assert s["train"]["steps"] == 10 and s["train"]["skipped"] == 1 and s["train"]["median_step_s"] == 36.0
    text = format_summary(s)
    assert "| soft | strict | 0.000 | 0.750 | +75.0 |" in text and "| soft | lenient |" in text
    assert "10.0 min" in text


def test_summary_refuses_unpaired_or_missing_evals(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    with pytest.raises(SystemExit, match="no metrics.jsonl"):
        summarize(run.path)
    run.log_metrics({"step": 0})
    run.write_eval(0, record(0, [0, 1], [0, 1]))
    with pytest.raises(SystemExit, match="needs the step-0 one and the final one"):
        summarize(run.path)
    run.write_eval(2, record(2, [0, 1], [0, 1], answers=["7", "8"]))
    with pytest.raises(SystemExit, match="different problems"):
        summarize(run.path)
