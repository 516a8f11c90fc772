"""tools/reliability_table.py: records of what the fault tests measured become docs/RELIABILITY.md's fault table."""

from __future__ import annotations

import importlib.util
import re

import pytest
from conftest import ROOT


def load_table_module():
    spec = importlib.util.spec_from_file_location("reliability_table", ROOT / "tools" / "reliability_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


table = load_table_module()

RECORDS = [
    {
        "test": "test_rollout_actor_killed_mid_generate",
        "kind": "CI",
        "wall_s": 108.4,
        "fault": "rollout actor SIGKILLed mid-`generate`, step 2 of 4",
        "outcome": "4/4 steps completed | each with 32 samples\n`faults/rollout_restarts` = 1",
        "steps_lost": "0",
        "data_lost": "none: steps 1-4 in metrics.jsonl once each",
    },
    {
        "test": "test_reward_failing_on_every_row_stops_the_job",
        "kind": "slow",
        "wall_s": 61.5,
        "fault": "a reward function that raises on every row",
        "outcome": "stopped after step 3; exit code 3",
        "steps_lost": "0",
        "data_lost": "3 of 3 batches not trained on",
    },
]


def test_records_become_rows_in_order():
    assert table.render(RECORDS) == [
        "| fault (test; CI or slow; wall s) | outcome | steps lost | data lost |",
        "|---|---|---|---|",
        "| rollout actor SIGKILLed mid-`generate`, step 2 of 4 (`test_rollout_actor_killed_mid_generate`; **CI**; "
        "108 s) | 4/4 steps completed \\| each with 32 samples `faults/rollout_restarts` = 1 | 0 "
        "| none: steps 1-4 in metrics.jsonl once each |",
        "| a reward function that raises on every row (`test_reward_failing_on_every_row_stops_the_job`; slow; 62 s) "
        "| stopped after step 3; exit code 3 | 0 | 3 of 3 batches not trained on |",
    ]


@pytest.mark.parametrize("field", ["test", "kind", "wall_s", "fault", "outcome", "steps_lost", "data_lost"])
def test_a_record_missing_a_field_is_refused(field):
    broken = [RECORDS[0], {k: v for k, v in RECORDS[1].items() if k != field}]
    with pytest.raises(ValueError, match=f"fault record 1 .*lacks {field}"):
        table.render(broken)
    with pytest.raises(ValueError, match=f"lacks {field}"):  # an empty value is no value
        table.render([{**RECORDS[0], field: ""}])


def test_no_records_and_unknown_kinds_are_refused():
    with pytest.raises(ValueError, match="no fault records"):
        table.render([])
    with pytest.raises(ValueError, match="kind must be CI or slow"):
        table.render([{**RECORDS[0], "kind": "nightly"}])


def test_only_the_text_between_the_markers_is_replaced():
    page = f"# Page\n\nbefore\n{table.BEGIN}\n| old | table |\n{table.END}\nafter\n"
    assert table.rewrite(page, ["| new |"]) == f"# Page\n\nbefore\n{table.BEGIN}\n| new |\n{table.END}\nafter\n"
    with pytest.raises(ValueError, match="needs exactly one"):
        table.rewrite("# no markers\n", ["| new |"])
    with pytest.raises(ValueError, match="needs exactly one"):
        table.rewrite(page + table.BEGIN, ["| new |"])


def test_the_page_holds_a_generated_row_for_each_fault_test():
    """docs/RELIABILITY.md's table names exactly the test functions of tests/test_faults.py, in order (a
    parametrized one has a row per case, `test_x[0]`): a test added, renamed or removed without regenerating the table
    (`python -m tools.reliability_table`) fails here."""
    page = (ROOT / "docs" / "RELIABILITY.md").read_text()
    generated = page.split(table.BEGIN)[1].split(table.END)[0]
    rows = re.findall(r"^\| .*?\(`(test_\w+)(?:\[[^\]`]*\])?`; (?:\*\*CI\*\*|slow); \d+ s\)", generated, re.M)
    in_page = [name for i, name in enumerate(rows) if name not in rows[:i]]
    in_tests = [
        name for path in table.TESTS for name in re.findall(r"^def (test_\w+)\(", (ROOT / path).read_text(), re.M)
    ]
    assert in_page == in_tests and len(in_tests) >= 8


def test_an_update_replaces_its_rows_and_keeps_the_others():
    """`--update`: the rows of the tests run replace theirs (or are added in test order); the others stay."""
    a, b = table.render(RECORDS)[2:]
    page = f"{table.BEGIN}\n" + "\n".join(table.HEADER + [a, b]) + f"\n\nnote\n{table.END}\n"
    new_b = b.replace("62 s", "70 s")
    ids = [
        "tests/test_faults.py::test_rollout_actor_killed_mid_generate",
        "tests/test_faults_async.py::test_reward_failing_on_every_row_stops_the_job",
    ]
    assert table.merged(page, [new_b], ids) == (table.HEADER + [a, new_b], [])
    case = ids[0] + "[2]"  # a case of a test that has a row: listed as not run yet, not refused
    assert table.merged(page, [new_b], ids + [case]) == (
        table.HEADER + [a, new_b],
        ["test_rollout_actor_killed_mid_generate[2]"],
    )
    with pytest.raises(ValueError, match="no row for test_new"):
        table.merged(page, [new_b], ids + ["tests/test_faults_async.py::test_new"])
