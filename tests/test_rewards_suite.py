"""math-verify's own public test cases (tests/data/math_verify_cases.json, shipped as data) through our math reward.

The goals of the table `bench/rewards.py --suite` prints: no wrong answer scored 1, and no right answer scored 0
outside the by-design classes (bench/rewards_suite.py says what each class is and decides it by a rule on the
case). Default and strict scoring both. The suite's ~290 pairs take ~10 s in-process.
"""

import importlib.util
import json

import pytest
from conftest import ROOT


@pytest.fixture(scope="module")
def suite():
    spec = importlib.util.spec_from_file_location("rewards_suite", ROOT / "bench" / "rewards_suite.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_data_file_holds_the_public_cases(suite):
    doc = json.loads(suite.CASES.read_text())
    cases = doc["cases"]
    assert len(cases) == 288 and [c["id"] for c in cases] == list(range(288))
    assert {c["expected"] for c in cases} == {0, 1} and sum(c["expected"] == 0 for c in cases) == 47
    assert "MIT License" in doc["license"] and "huggingface/Math-Verify" in doc["source"]["repository"]


@pytest.mark.parametrize("strict", [False, True])
def test_no_wrong_answer_scored_1_and_no_right_answer_scored_0_outside_the_classes(suite, strict):
    result = suite.run_suite(strict=strict)
    table = suite.format_table(result, verbose=True)
    assert result["wrong_scored_1"] == 0, table
    assert result["right_scored_0"] == 0, table
    assert result["cases"] == result["agree"] + sum(result["by_design"].values())
    if not strict:  # the default reward differs from the suite only in these few, named cases
        assert result["agree"] >= 278 and sum(result["by_design"].values()) <= 10, table
        assert result["by_design"]["not_literal"] == 0


def test_the_classes_are_decided_by_rules(suite):
    """A right answer is excused only by a class; a wrong answer scored 1 never is."""
    case = {"id": 0, "source": "t", "expected": 1, "gold": "5", "pred": "\\boxed{6}", "settings": suite.OUR_SETTINGS}
    assert suite.by_design(case, "6", False, 1, 1, "wrong") is None
    assert (
        suite.by_design({**case, "settings": {**suite.OUR_SETTINGS, "precision": 2}}, "6", False, 1, 0, "wrong")
        == "test_setting"
    )
    assert suite.by_design(case, "1000,99", False, 1, 1, "wrong") == "decimal_comma"
    assert suite.by_design(case, "1,000", False, 1, 1, "wrong") is None
    assert (
        suite.by_design({**case, "pred": "\\boxed{1} and then \\boxed{6}"}, "6", False, 1, 1, "wrong")
        == "several_boxes"
    )
    assert suite.by_design(case, "the answer is six apples", False, 1, 1, "wrong") == "prose"
