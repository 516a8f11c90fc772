"""The calculator study's table (scripts/smollm_calc.py `summarize`) from two runs' eval records and metrics: the
paired tool-vs-no-tool difference with McNemar's p, the tool use read off the responses, and the latent channel
averaged over the steps that report it."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("smollm_calc", ROOT / "scripts" / "smollm_calc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(out: Path, name: str, start: list[int], end: list[int], responses: list[str], metrics: list[dict]):
    for step, strict in ((0, start), (5, end)):
        record = {"step": step, "modes": {"soft": {"strict": strict, "responses": responses, "tool_calls": [1] * 4}}}
        (out / name / "eval").mkdir(parents=True, exist_ok=True)
        (out / name / "eval" / f"step_{step:06d}.json").write_text(json.dumps(record))
    (out / name / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))


def test_the_table_pairs_tool_and_no_tool_and_reads_the_latent_channel(tmp_path):
    calc = _script()
    used = "2 * 8 = <<2*8=16>>16\n\\boxed{16}"
    unused = "2 * 8 = <<2*8=16>>17\n\\boxed{17}"
    metrics = [
        {"step": 0},
        {"step": 1, "learner/latent/state_share_after_tool": 0.2, "learner/latent/policy_shift": 0.1},
        {"step": 2, "learner/latent/state_share_after_tool": 0.4, "learner/latent/policy_shift": 0.3},
    ]
    _run(tmp_path, "fbt-tool", [0, 1, 0, 0], [1, 1, 1, 0], [used, used, unused, used], metrics)
    _run(tmp_path, "fbt-notool", [0, 0, 0, 0], [0, 1, 0, 0], ["\\boxed{3}"] * 4, [{"step": 1}])
    res = calc.summarize(tmp_path)
    tool = res["runs"]["fbt-tool"]
    assert (tool["start"], tool["end"]) == (0.25, 0.75)
    assert tool["tool_use_end"] == {"calls_per_problem": 1.0, "results_written": 0.75}
    assert tool["latent"] == {"state_share_after_tool": pytest.approx(0.3), "policy_shift": pytest.approx(0.2)}
    assert res["runs"]["fbt-notool"]["latent"] == {}
    d = res["tool_vs_notool"]["fbt"]  # problems 0 and 2 right only with the tool, none only without
    assert (d["n"], d["diff_points"], d["a_only"], d["b_only"]) == (4, 50.0, 0, 2)
    assert d["p_value"] == pytest.approx(0.5)  # McNemar's exact, two discordant pairs
    table = (tmp_path / "comparison.md").read_text()
    assert "| fbt-tool | 0.250 | 0.750 |" in table and "0.300 (—)" in table and "fbt: tool − no tool +50.0" in table
