"""The answer rules a policy is held to (rewards/answer.py, docs/REWARDS.md) and the reward hacks they close.

- the wrapper cases math-verify's own suite exposed: a "final answer" line's last math block (or "is N"), the
  hedge anywhere after the anchor, thin-space and space digit groups, one rule for a trailing period on both
  paths, golds normalised before parsing (`\\mathrm{e}` is e, a bare "1,22" is 1.22), odd golds counted and logged;
- several boxes: a list of boxes is one answer, a retraction is not;
- strict scoring (the arithmetic task): a literal number, never an expression that evaluates to the gold — the
  question copied into the box, `\\boxed{17*23}`, units, another base or script;
- the arithmetic task's own checker (rl/data/arith.py) and the strict reward agree on every adversarial case.
"""

import importlib
import logging
from fractions import Fraction

import pytest

from rewards.answer import extract_answer, literal_value, normalize
from rewards.math import GOLD_LOST_SYMBOLS, GOLD_STRING_ONLY, MathReward, gold_text, score_completion


def score(gold, completion, strict=False):
    return score_completion(gold, completion, strict=strict)[0]


# --- the wrapper cases (each scored wrongly before this change) ------------------------------------------------


@pytest.mark.parametrize(
    "gold,completion",
    [
        ("34", "Final Answer: The largest $n$ is 34."),  # read `n`
        ("120", "Final Answer: The volume of $ABCDEFGH$ is 120. I hope it is correct."),
        ("19", "Final Answer: The maximum is attained at $f(x)$ and the count is 19. <|im_start|>user"),
        ("12, 13", 'The final answer is "$12$ and $13$". I hope it is correct.'),  # read 12
        ("28\\%", "Final Answer: The final answer is $28 \\%$. I hope it is correct. Note: the solution is wrong."),
        ("9", "The final answer is $$\n9\n$$"),  # a display block on the next lines
        ("1000", "\\boxed{1\\,000}"),
        ("1000", "\\boxed{1 000}"),
        ("1000", "\\boxed{1\\!000}"),  # read 1*0
        ("11111111100", "is $\\boxed{11,\\! 111,\\! 111,\\! 100}$"),
        ("1,22", "\\boxed{1.22}"),
        ("0,111", "\\boxed{0.111}"),  # gold read as the set {1, 22}
        ("42", "\\boxed{42.}"),
        ("42", "The final answer is $42.$"),  # one rule for a trailing period
        ("\\frac{1}{3}", "\\boxed{\\frac{1}{3}.}"),
        ("\\frac{1}{3}", "The final answer is $\\frac{1}{3}.$"),
        ("2\\mathrm{e}", "\\boxed{2e}"),
        ("1 - \\frac{1}{\\mathrm{e}}", "\\boxed{1 - e^{-1}}"),  # e stripped as a unit
        ("1, -2", "The integers are \\boxed{-2} and \\boxed{1}."),  # a multi-part answer in two boxes
        ("\\$5", "\\boxed{5}"),
    ],
)
def test_right_answers_the_wrapper_used_to_score_0(gold, completion):
    assert score(gold, completion) == 1.0


@pytest.mark.parametrize(
    "gold,completion",
    [
        ("2\\mathrm{e}", "\\boxed{2}"),  # Euler's number collapsed: 2 used to score 1
        ("1 - \\frac{1}{\\mathrm{e}}", "\\boxed{1 + \\frac{1}{e}}"),
        ("2", "The final answer is $2^{10}.$"),
        ("1", "The final answer is $1/3.$"),  # math-verify alone reads 2, 1
        ("1, 2, 3", "\\boxed{1, 2, 3, \\dots}"),
        ("1, 2, 3", "The final answer is $1, 2, 3, ...$"),  # an ellipsis stays
        ("32349", "\\boxed{32, 349}"),  # a comma and a space: two numbers, not a group
        ("3", "\\boxed{3}. No wait, that is wrong: \\boxed{5}"),  # a retraction: the last box only
        ("5", "\\boxed{5} or \\boxed{6}"),  # hedging over two boxes is a set, not 5
        ("5", "The final answer is $\\frac{1}{2}$, which is the probability."),
    ],
)
def test_wrong_answers_score_0(gold, completion):
    assert score(gold, completion) == 0.0


def test_extraction_rules():
    assert extract_answer("\\boxed{3}. No: \\boxed{5}") == "5"
    assert extract_answer("$\\boxed{-2}$, $\\boxed{1}$") == "-2, 1"
    assert extract_answer("\\boxed{(3,3)} \\text{ for part (a) and } \\boxed{(1,1)}") == "(1,1)"
    assert extract_answer("The final answer is $x$ = $5$") == "5"
    assert extract_answer("Final answer: 7. I hope it is correct. Later lines: \\(8\\)") == "7"
    assert extract_answer("The final answer is 12,000,023.") == "12,000,023"
    assert extract_answer("Final Answer: Jane started 3 hours ago.") == "Jane started 3 hours ago"  # prose: read as is
    assert extract_answer("\\boxed{42} ... the final answer is $\\boxed{41}$") == "41"
    assert extract_answer("\\boxed{1} \\boxed{2") is None  # the last box is broken: never an earlier one
    assert extract_answer("The final answer is $f'$.") == "f'"  # math keeps its prime; prose loses its quotes
    assert extract_answer('**Final answer:** "42"') == "42"
    assert normalize("1\\,000\\,000") == "1000000" and normalize("2^{10 000}") == "2^{10 000}"
    assert normalize("x^2 100") == "x^2 100"  # a group must start a number, not follow `^2`
    assert normalize("4 4/9") == "4 4/9"  # a mixed number is not a digit group
    assert normalize("12\n345") == "12\n345"  # nor are two lines


@pytest.mark.parametrize("completion", ["The final answer is 1234567890", "\\boxed{1234567890}"])
def test_answer_length_limit_is_inclusive(completion):
    # an answer of exactly max_chars characters is kept, one more is refused (on both anchors)
    assert extract_answer(completion, max_chars=10) == "1234567890"
    assert extract_answer(completion, max_chars=9) is None


@pytest.mark.parametrize(
    "text", ["\\frac{3}{4}", "\\frac34", "\\frac{3}4", "\\frac3{4}", "\\dfrac{3}{4}", "3/4", "3 / 4"]
)
def test_every_fraction_form_reads_numerator_over_denominator(text):
    assert literal_value(text) == ("fraction", Fraction(3, 4))
    assert literal_value("-" + text) == ("fraction", Fraction(-3, 4))


def test_one_character_between_boxes_ends_the_list():
    assert extract_answer("\\boxed{3}x\\boxed{5}") == "5" and extract_answer("\\boxed{3},\\boxed{5}") == "3, 5"


def test_redundant_braces_in_a_box_are_dropped():
    assert extract_answer("\\boxed{{42}}") == "42" and extract_answer("\\boxed{{{7}}}") == "7"
    assert extract_answer("\\boxed{{1}{2}}") == "{1}{2}"  # not one group: kept


def test_gold_normalisation():
    assert gold_text("1,22") == "1.22" and gold_text("0,111") == "0.111"
    assert gold_text("7,425,000") == "7425000" and gold_text("1,000.5") == "1000.5"
    assert gold_text("$-2,1$") == "$-2,1$"  # delimited: a list, as math-verify reads it
    assert gold_text("2\\mathrm{e}") == "\\boxed{2e}"
    assert gold_text("\\frac{1}{2}") == "\\boxed{\\frac{1}{2}}"


def test_odd_golds_are_counted_and_logged(caplog):
    r = MathReward(in_process=True)
    golds = ["2\\mathrm{i}", "?", "5", "5"]
    with caplog.at_level(logging.WARNING, logger="rewards.math"):
        out = r(["q"] * 4, ["\\boxed{2}", "\\boxed{?}", "\\boxed{5}", "\\boxed{6}"], golds)
    assert out.counts[GOLD_LOST_SYMBOLS] == 1 and out.counts[GOLD_STRING_ONLY] == 1
    assert list(out)[2:] == [1.0, 0.0]
    assert "2 gold answers parse only to text" in caplog.text and "2\\\\mathrm{i}" in caplog.text


# --- strict scoring: the arithmetic task's answer rule -----------------------------------------------------------

ARITH_PROMPT = "Q: 37+5*3=? Put the answer in \\boxed{}.\nA:"
# (completion, strict score) for the gold 52 of 37+5*3, and what math-verify's semantics give without strict.
ADVERSARIAL = [
    (" 5*3=15, 37+15=52. \\boxed{52}", 1.0, 1.0),
    (" \\boxed{37+5*3}", 0.0, 1.0),  # the question copied into the box
    (" \\boxed{37+15}", 0.0, 1.0),  # an expression
    (" The final answer is 37+5*3", 0.0, 1.0),
    (" \\boxed{4*13}", 0.0, 1.0),
    (" \\boxed{\\frac{104}{2}}", 0.0, 1.0),  # a fraction that reduces to the integer
    (" \\boxed{52.0}", 0.0, 1.0),  # a decimal where the answer is an integer
    (" \\boxed{52 \\text{ apples}}", 0.0, 1.0),  # units
    (" \\boxed{x = 52}", 0.0, 1.0),
    (" \\boxed{50} \\boxed{52}", 0.0, 0.0),  # several boxes: a list, not 52
    (" \\boxed{53}. No: \\boxed{52}", 1.0, 1.0),  # a correction: the last box
    (" \\boxed{52.}", 1.0, 1.0),  # sentence punctuation
    (" \\boxed{52...}", 0.0, 0.0),  # an ellipsis is not
    (" \\boxed{+52}", 1.0, 1.0),
    (" \\boxed{ 052 }", 1.0, 1.0),
    (" \\boxed{٥٢}", 0.0, 0.0),  # another script's digits
    (" \\boxed{5.2e1}", 0.0, 0.0),
    (" \\boxed{0x34}", 0.0, 0.0),
    (" \\boxed{52_{10}}", 0.0, 1.0),
    (" \\boxed{53}", 0.0, 0.0),
    (" 52", 0.0, 0.0),  # wrong; no anchor
]


@pytest.mark.parametrize("completion,strict,loose", ADVERSARIAL)
def test_strict_scores_only_a_literal_answer(completion, strict, loose):
    assert score("52", completion, strict=True) == strict
    assert score("52", completion, strict=False) == loose  # MATH semantics stay math-verify's


def test_strict_keeps_math_verify_for_golds_that_are_not_numbers():
    assert score("x^2+2x+1", "\\boxed{(x+1)^2}", strict=True) == 1.0
    assert score("\\frac{1}{2}", "\\boxed{0.5}", strict=True) == 1.0  # a decimal of a fraction, exactly
    assert score("\\frac{1}{12}", "\\boxed{0.0833333333}", strict=True) == 1.0  # to 6 places, as math-verify
    assert score("\\frac{1}{3}", "\\boxed{0.33}", strict=True) == 0.0
    assert literal_value("17*23") is None and literal_value("-\\frac{3}{4}")[1] == -0.75


def test_strict_batch_reward_counts_not_literal_without_the_pool():
    r = MathReward(strict=True)  # no pool is started for literal golds
    out = r([ARITH_PROMPT] * 3, [" \\boxed{52}", " \\boxed{37+5*3}", " \\boxed{53}"], ["52", "52", "52"])
    assert list(out) == [1.0, 0.0, 0.0] and out.counts["not_literal"] == 1 and out.counts["wrong"] == 1
    assert r._pool is None


def test_arith_task_checker_agrees_with_the_strict_reward():
    arith = importlib.import_module("rl.data.arith")
    for completion, strict, _ in ADVERSARIAL:
        assert arith.score(completion, "52") == strict, completion
    assert arith.score("\\boxed{1_7}", "17") == 0.0 and arith.score("\\boxed{ 17 }", "17") == 1.0
