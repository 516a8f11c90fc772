"""Math reward: the table of (gold, completion, expected) cases, anchor rules, truncation, format reward, caching.

The table is scored both in-process and through the pool; both must equal the expected column.
"""

import importlib

import pytest

from rewards.base import RewardResult
from rewards.math import (
    MathReward,
    _parse_gold,
    extract_answer,
    format_reward,
    math_reward,
    score_completion,
)

CASES = [
    # integers: the embedded arithmetic task's answers
    ("42", "6 * 7 = 42, so the result is \\boxed{42}", 1),
    ("-7", "3 - 10 = -7. \\boxed{-7}", 1),
    ("-7", "\\boxed{7}", 0),
    ("42", "\\boxed{ 42 }", 1),
    (42, "\\boxed{42}", 1),
    ("1000", "\\boxed{1,000}", 1),
    ("42", "\\boxed{42.0}", 1),
    ("0", "\\boxed{0}", 1),
    # fractions vs decimals, \frac / \dfrac
    ("\\frac{1}{2}", "\\boxed{0.5}", 1),
    ("0.5", "\\boxed{\\frac{1}{2}}", 1),
    ("\\frac{3}{4}", "\\boxed{\\dfrac{3}{4}}", 1),
    ("\\dfrac{3}{4}", "\\boxed{3/4}", 1),
    ("\\frac{1}{3}", "\\boxed{0.33}", 0),
    ("-\\frac{1}{2}", "\\boxed{-0.5}", 1),
    ("\\frac{2}{4}", "\\boxed{\\frac{1}{2}}", 1),
    # negatives
    ("-3", "\\boxed{-3}", 1),
    ("-3", "\\boxed{3}", 0),
    ("-3", "\\boxed{- 3}", 1),
    # sets
    ("\\{1,2,3\\}", "\\boxed{\\{3, 2, 1\\}}", 1),
    ("\\{1,2\\}", "\\boxed{\\{1,3\\}}", 0),
    ("1, 2", "\\boxed{2, 1}", 1),
    # intervals
    ("[0,1)", "\\boxed{[0, 1)}", 1),
    ("[0,1)", "\\boxed{[0, 1]}", 0),
    ("(-\\infty, 2]", "\\boxed{(-\\infty,2]}", 1),
    ("(1,2)", "\\boxed{(1, 2)}", 1),
    # LaTeX noise
    ("5", "\\boxed{\\text{5}}", 1),
    ("5", "\\boxed{x = 5}", 1),
    ("12", "\\boxed{12\\text{ cm}}", 1),
    ("\\sqrt{2}", "\\boxed{\\sqrt 2}", 1),
    ("2\\pi", "$\\boxed{2 \\pi}$", 1),
    ("90", "\\boxed{90^\\circ}", 1),
    ("x^2+2x+1", "\\boxed{(x+1)^2}", 1),
    ("\\frac{1}{2}", "\\boxed{\\left( \\frac{1}{2} \\right)}", 1),
    # several boxes: the LAST box is the answer
    ("5", "First try \\boxed{3}. No, that is wrong: \\boxed{5}", 1),
    ("3", "First try \\boxed{3}. No, that is wrong: \\boxed{5}", 0),
    ("5", "\\boxed{5}, but let me redo it \\boxed{4", 0),
    ("7", "\\boxed{\\boxed{7}}", 1),
    # no box
    ("42", "6*7 = 42", 0),
    ("42", "", 0),
    # wrong answers
    ("42", "\\boxed{43}", 0),
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{3}}", 0),
    # the right number in the reasoning, without an anchor
    ("42", "The answer is 42.", 0),
    ("42", "Answer: 42", 0),
    ("42", "We get $x = 42$ at the end.", 0),
    ("42", "The final answer will be computed below: 40 + 2 = 42", 0),
    ("42", "I think it is 42 but I am not sure", 0),
    # "final answer" forms
    ("42", "Final Answer: The final answer is 42. I hope it is correct.", 1),
    ("\\frac{1}{2}", "The final answer is $\\frac{1}{2}$.", 1),
    ("42", "**Final Answer:** 42", 1),
    ("42", "Final answer:\n42", 1),
    ("5", "So \\boxed{3}. Rechecking, the final answer is 5.", 1),
    ("42", "The final answer is $\\boxed{42}$", 1),
    ("42", "The final answer is 41.", 0),
    # gold written with delimiters
    ("$42$", "\\boxed{42}", 1),
    ("\\boxed{42}", "\\boxed{42}", 1),
]


@pytest.fixture(scope="module")
def pooled():
    r = MathReward(num_workers=2, timeout_s=10.0)
    yield r
    r.close()


def test_table_is_big_and_mixed():
    assert len(CASES) >= 40
    assert {e for _, _, e in CASES} == {0, 1}


@pytest.mark.parametrize("gold,completion,expected", CASES)
def test_table_in_process(gold, completion, expected):
    score, status, _ = score_completion(str(gold), completion)
    assert score == expected, status


def test_table_through_pool(pooled):
    golds = [g for g, _, _ in CASES]
    completions = [c for _, c, _ in CASES]
    out = pooled(["q"] * len(CASES), completions, golds)
    assert isinstance(out, RewardResult)
    assert list(out) == [float(e) for _, _, e in CASES]
    assert out.errors == 0 and out.timeouts == 0


def test_last_box_policy_and_final_answer_precedence():
    assert extract_answer("\\boxed{1} then \\boxed{2}") == "2"
    assert extract_answer("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_answer("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"  # escaped set braces do not close the box
    assert extract_answer("\\boxed{1} then \\boxed{2") is None  # broken last box: no fallback to a retracted one
    assert extract_answer("The final answer is 7. Later: \\boxed{8}") == "8"
    assert extract_answer("\\boxed{8}. The final answer is 7") == "7"
    assert extract_answer("\\boxed{" + "1" * 600 + "}") is None  # longer than max_answer_chars
    assert extract_answer("\\boxed{   }") is None


def test_arithmetic_task_integers(pooled):
    # The embedded default's arithmetic task: integer answers (str or int), completions ending in \boxed{N}.
    golds = ["42", "-7", 13, -250, "0", "1000000"]
    good = [
        "12 + 30 = 42\n\\boxed{42}",
        "\\boxed{-7}",
        "\\boxed{13}",
        "\\boxed{-250}",
        "\\boxed{0}",
        "\\boxed{1000000}",
    ]
    bad = ["\\boxed{24}", "\\boxed{7}", "\\boxed{-13}", "\\boxed{250}", "\\boxed{1}", "\\boxed{100000}"]
    assert list(pooled(["q"] * 6, good, golds)) == [1.0] * 6
    assert list(pooled(["q"] * 6, bad, golds)) == [0.0] * 6


def _load_arith():
    """rl.data.arith (pure Python: importing `rl` loads neither torch nor transformers)."""
    return importlib.import_module("rl.data.arith")


def test_embedded_arithmetic_task_is_scored_by_the_math_reward(pooled):
    arith = _load_arith()
    generate, score = arith.generate, arith.score

    rows = generate("val", 40, seed=3, difficulties=(1, 2, 3, 4))
    golds = [r["answer"] for r in rows]
    right = [r["solution"] for r in rows]
    wrong = [r["solution"].replace(f"\\boxed{{{r['answer']}}}", f"\\boxed{{{int(r['answer']) + 1}}}") for r in rows]
    assert any(g.startswith("-") for g in golds)  # negative integer answers are in the mix
    assert list(pooled([r["prompt"] for r in rows], right, golds)) == [1.0] * 40
    assert list(pooled([r["prompt"] for r in rows], wrong, golds)) == [0.0] * 40
    assert [score(c, g) for c, g in zip(wrong, golds)] == [0.0] * 40  # the task's own checker agrees


def test_duplicates_scored_once_and_fanned_out(pooled):
    before = pooled.pool.stats["items"]
    comps = ["\\boxed{4}", "\\boxed{5}", "\\boxed{4}", "\\boxed{4}", "\\boxed{5}"]
    out = pooled(["q"] * 5, comps, ["4", "4", "4", "5", "4"])
    assert list(out) == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert pooled.pool.stats["items"] - before == 3  # (4,4), (4,5), (5,4)


def test_truncated_scores_zero(pooled):
    comps = ["\\boxed{5}"] * 4
    out = pooled(["q"] * 4, comps, ["5"] * 4, finish_reasons=["stop", "length", None, "aborted"])
    assert list(out) == [1.0, 0.0, 1.0, 0.0]
    assert out.counts["truncated"] == 2 and out.errors == 0
    with pytest.raises(ValueError, match="finish_reasons"):
        pooled(["q"], ["\\boxed{5}"], ["5"], finish_reasons=["stop", "stop"])


def test_counts_and_gold_errors_are_reported(caplog):
    r = MathReward(in_process=True)
    comps = ["\\boxed{1}", "no anchor", "\\boxed{2}", "\\boxed{1}", "\\boxed{1}", None]
    out = r(["q"] * 6, comps, ["1", "1", "1", "", None, "1"])
    assert list(out) == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert out.counts["no_answer"] == 1 and out.counts["wrong"] == 1
    assert out.counts["gold_unparsed"] == 2 and out.errors == 3  # bad golds are data errors; None completion too
    assert "3 of 6 samples scored 0 for an error" in caplog.text


def test_gold_parse_is_cached():
    score_completion("\\frac{17}{19}", "\\boxed{\\frac{17}{19}}")
    before = _parse_gold.cache_info().hits
    for _ in range(3):
        assert score_completion("\\frac{17}{19}", "\\boxed{\\frac{34}{38}}") == (1.0, "correct", "")
    assert _parse_gold.cache_info().hits == before + 3


def test_math_reward_function_form():
    out = math_reward(["q", "q"], ["\\boxed{-7}", "\\boxed{7}"], ["-7", "-7"], finish_reasons=["stop", "stop"])
    assert list(out) == [1.0, 0.0] and isinstance(out, RewardResult)


def test_format_reward():
    comps = ["\\boxed{3}", "final answer: 3", "3", "\\boxed{3", "\\boxed{3}"]
    assert format_reward(["q"] * 5, comps, ["3"] * 5) == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert format_reward(["q"] * 5, comps, ["3"] * 5, finish_reasons=[None] * 4 + ["length"])[4] == 0.0


def test_a_whole_gsm8k_solution_is_read_as_its_final_answer():
    """openai/gsm8k's `answer` column as it comes (worked steps, calculator notes, `#### N` with a thousands comma):
    the gold is N, so a Hub dataset needs no preprocessing (what verl's gsm8k script does by hand)."""
    from rewards.math import MathReward

    gold = "She sold 48/2 = <<48/2=24>>24 clips.\nIn all 48+24 = <<48+24=72>>72.\n#### 1,072"
    out = MathReward(in_process=True)(["q"] * 3, ["So \\boxed{1072}.", "It is 72.", "\\boxed{1,072}"], [gold] * 3)
    assert list(out) == [1.0, 0.0, 1.0]
