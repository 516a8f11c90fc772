"""tools/reliability_table.py and tools/reliability_render.py: records of what the fault tests measured become
docs/RELIABILITY.md's fault table and its transport x staleness table; a record older than the code it covers
fails here."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from conftest import ROOT

from tools import reliability_render as render
from tools import reliability_table as table

RECORDS = [
    {
        "test": "test_rollout_actor_killed_mid_generate",
        "kind": "CI",
        "wall_s": 108.4,
        "commit": "abc1234",
        "fault": "rollout actor SIGKILLed mid-`generate`, step 2 of 4",
        "staleness": 0,
        "transport": "file (auto, one machine)",
        "detected_s": 0.43,
        "exit_code": 0,
        "outcome": "4/4 steps completed | each with 32 samples\n`faults/rollout_restarts` = 1",
        "steps_lost": "0",
        "rows_once": "yes (steps 1-4)",
        "data_lost": "none: steps 1-4 in metrics.jsonl once each",
        "temporaries_left": "none",
        "processes_left": "0 (all gone 1 s after the test's process)",
        "matrix": "rollout actor dies",
    },
    {
        "test": "test_reward_failing_on_every_row_stops_the_job",
        "kind": "slow",
        "wall_s": 61.5,
        "commit": "abc1234",
        "fault": "a reward function that raises on every row",
        "staleness": 1,
        "transport": "ray",
        "detected_s": "at step 3 (the share rule)",
        "exit_code": 3,
        "outcome": "stopped after step 3",
        "steps_lost": "0",
        "rows_once": "yes (steps 1-3)",
        "data_lost": "3 of 3 batches not trained on",
        "temporaries_left": "none",
        "processes_left": "0 (all gone 0 s after the test's process)",
    },
]


def test_records_become_rows_in_order():
    rows = render.render(RECORDS)
    assert rows[:2] == render.HEADER
    assert rows[2] == (
        "| rollout actor SIGKILLed mid-`generate`, step 2 of 4 (`test_rollout_actor_killed_mid_generate`; **CI**; "
        "108 s; abc1234) | s = 0, file (auto, one machine) | 0.4 s | 0 | 4/4 steps completed \\| each with 32 "
        "samples `faults/rollout_restarts` = 1 | 0 | yes (steps 1-4) | none: steps 1-4 in metrics.jsonl once each "
        "| none | 0 (all gone 1 s after the test's process) |"
    )
    assert rows[3].startswith("| a reward function that raises on every row (`test_reward_failing_on_every_row")
    assert "| s = 1, ray | at step 3 (the share rule) | 3 |" in rows[3]
    assert all(row.count(" | ") == 9 for row in rows[2:])  # ten cells: the header's


@pytest.mark.parametrize("field", render.FIELDS)
def test_a_record_missing_a_field_is_refused(field):
    broken = [RECORDS[0], {k: v for k, v in RECORDS[1].items() if k != field}]
    with pytest.raises(ValueError, match=f"fault record 1 .*lacks {field}"):
        render.render(broken)
    with pytest.raises(ValueError, match=f"lacks {field}"):  # an empty value is no value
        render.render([{**RECORDS[0], field: ""}])


def test_no_records_unknown_kinds_and_unknown_cells_are_refused():
    with pytest.raises(ValueError, match="no fault records"):
        render.render([])
    with pytest.raises(ValueError, match="kind must be CI or slow"):
        render.render([{**RECORDS[0], "kind": "nightly"}])
    with pytest.raises(ValueError, match="matrix must be one of"):
        render.matrix([{**RECORDS[0], "matrix": "a comet"}])


def test_the_matrix_is_filled_from_records_and_says_what_was_not_run():
    lines = render.matrix(RECORDS + [{**RECORDS[0], "test": "test_b", "staleness": 2, "transport": "native_ray"}])
    assert lines[0] == "| fault | staleness | file | ray | native_ray | nccl | ipc |"
    dies_0, dies_1 = (x for x in lines if x.startswith("| rollout actor dies |"))
    cells = [c.strip() for c in dies_0.split(" | ")]
    assert cells[2] == "`test_rollout_actor_killed_mid_generate`: exit 0, steps lost 0"  # the file column
    assert cells[3] == "not run" and cells[4] == "not run"
    assert cells[5].startswith("not run: needs GPUs") and cells[6].startswith("not run: needs GPUs")
    assert "`test_b`: exit 0" in dies_1.split(" | ")[4]  # native_ray, staleness >= 1
    assert len(lines) == 2 + 2 * len(render.MATRIX_ROWS)


def test_only_the_text_between_the_markers_is_replaced():
    b, e = table.BEGIN, table.END
    page = f"# Page\n\nbefore\n{b}\n| old | table |\n{e}\nafter\n"
    assert render.rewrite(page, b, e, ["| new |"]) == f"# Page\n\nbefore\n{b}\n| new |\n{e}\nafter\n"
    with pytest.raises(ValueError, match="needs exactly one"):
        render.rewrite("# no markers\n", b, e, ["| new |"])
    with pytest.raises(ValueError, match="needs exactly one"):
        render.rewrite(page + b, b, e, ["| new |"])


def test_an_update_replaces_its_records_and_keeps_the_others():
    a, b = RECORDS
    new_b = {**b, "wall_s": 70.0, "commit": "def5678"}
    names = [a["test"], b["test"]]
    assert render.merged([a, b], [new_b], names) == [a, new_b]
    assert render.merged([b], [a], names) == [a, b]  # in the order of the tests
    with pytest.raises(ValueError, match="no record for test_new"):
        render.merged([a, b], [new_b], names + ["test_new"])
    assert render.merged([a, b], [], names + ["test_new"], allow_missing=True) == [a, b]


# ---- the committed page --------------------------------------------------------------------------------------------
def committed_records() -> list[dict]:
    return [json.loads(x) for x in table.RECORDS.read_text().splitlines() if x.strip()]


def test_the_page_is_the_rendering_of_the_committed_records_one_per_fault_test():
    """docs/RELIABILITY.md's two tables are exactly what docs/reliability_records.jsonl renders to, and the records
    name every test function of the fault test files, in order (a parametrized one has a record per case): a test
    added, renamed or removed without generating the tables again fails here."""
    records = committed_records()
    page = (ROOT / "docs" / "RELIABILITY.md").read_text()
    fault_table = page.split(table.BEGIN)[1].split(table.END)[0].strip().splitlines()
    assert fault_table[: len(records) + 2] == render.render(records)
    assert page.split(table.MATRIX_BEGIN)[1].split(table.MATRIX_END)[0].strip().splitlines() == render.matrix(records)
    in_records = list(dict.fromkeys(r["test"].split("[")[0] for r in records))
    in_tests = [
        name for path in table.TESTS for name in re.findall(r"^def (test_\w+)\(", (ROOT / path).read_text(), re.M)
    ] + [n.split("::")[1] for n in table.NAMED]
    assert in_records == in_tests and len(in_tests) >= 8


def test_no_record_is_older_than_the_code_it_covers():
    """Each record's commit is compared with the last commit that touched the code the table covers
    (tools/reliability_render.py's COVERED): a change there after a row was measured fails here until the table
    is generated again (`python -m tools.reliability_table`)."""
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: the commits cannot be compared")
    assert render.stale_rows(committed_records(), ROOT) == []


def test_the_bad_input_table_is_not_older_than_the_checks_it_measures():
    """The bad-input table's note names the commit it ran at; a change to the checks since fails here."""
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: the commits cannot be compared")
    page = (ROOT / "docs" / "RELIABILITY.md").read_text()
    block = page.split(table.BAD_BEGIN)[1].split(table.BAD_END)[0]
    (commit,) = re.findall(r"at commit (\S+?),? in \d+ s", block)
    assert len([x for x in block.splitlines() if x.startswith("| ")]) >= 20
    assert render.staleness(commit, ROOT, render.INPUT_COVERED) is None


def test_a_change_to_covered_code_makes_a_record_stale(tmp_path):
    """stale_rows on a scratch repository: a record at the first commit is fresh until a covered file changes."""

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "loop.py").write_text("a = 1\n")
    (tmp_path / "README.md").write_text("x\n")
    git("add", ".")
    git("commit", "-qm", "first")
    first = git("rev-parse", "--short", "HEAD").strip()
    record = {**RECORDS[0], "commit": first}
    (tmp_path / "README.md").write_text("y\n")
    git("commit", "-qam", "docs only")
    assert render.stale_rows([record], tmp_path) == []
    (tmp_path / "rl" / "loop.py").write_text("a = 2\n")
    git("commit", "-qam", "loop changed")
    (problem,) = render.stale_rows([record], tmp_path)
    assert "older than the code they cover" in problem and "loop changed" in problem
    assert "not a commit" in render.stale_rows([{**record, "commit": "abc1234 with uncommitted changes"}], tmp_path)[0]
