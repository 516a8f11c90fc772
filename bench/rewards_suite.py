"""math-verify's own public test cases through our math reward: agree / differ by design / wrong. Prints a table.

    python -m bench.rewards --suite [--strict] [--json out.json] [--verbose]

The cases (tests/data/math_verify_cases.json) are the (gold, prediction, expected) pairs of math-verify's public
test suite, as data. Each prediction is scored by `rewards.math.score_completion` in-process, as written when it
carries one of our anchors (`\\boxed{}`, a "final answer" line); math-verify's tests mostly feed a bare answer
("$\\frac{1}{3}.$", "1 000"), which our reward would score 0 for the missing anchor, so a prediction without an
anchor is given one: "The final answer is " + prediction, the way a policy prompted for our format writes it.

A case agrees when our score equals the suite's verdict. A right answer (verdict 1) that we score 0 "differs by
design" only in these classes, each decided by a rule on the case, never by a list of ids:
  test_setting    the verdict needs a setting the test passes and our reward does not use (another float
                  precision, strict=False, set/relation comparison, expression-only matching): math-verify itself,
                  run with our settings on the same pair, misses the verdict too.
  upstream_newer  the installed math-verify misses the verdict even with the test's own settings (the test pins
                  behaviour of a newer release).
  prose           the answer is stated in prose, not at an anchor: the prediction has no anchor and ten or more
                  words outside math, or the anchored answer we read is itself a sentence (three or more words).
  several_boxes   the prediction spreads its answer over boxes with text between them ("\\boxed{(3,3)} for part
                  (a) and \\boxed{(1,1)}"): we read the last box, or a list of boxes separated only by commas /
                  "and" / "or" (docs/REWARDS.md).
  decimal_comma   the answer writes a decimal comma ("1000,99"): inside an answer a comma between digits
                  separates items, unless it groups thousands.
  not_literal     (strict only) the gold is a number and the answer is not a number written out (an expression,
                  units, a currency sign, "k = 1/3"), or a fraction / decimal where the gold is an integer.
A wrong answer (verdict 0) that we score 1 is never by design: the goal is zero of them, and zero right answers
scored 0 outside the classes.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

CASES = Path(__file__).resolve().parent.parent / "tests" / "data" / "math_verify_cases.json"
OUR_SETTINGS = {
    "call": "compare_strings",
    "match_types": ["latex", "expr"],
    "precision": 6,
    "strict": True,
    "allow_set_relation_comp": False,
}
CLASSES = ("test_setting", "upstream_newer", "prose", "several_boxes", "decimal_comma", "not_literal")
_MATH_RE = re.compile(r"\$\$.+?\$\$|\$[^$]*\$|\\\(.+?\\\)|\\\[.+?\\\]", re.DOTALL)


def load_cases(path: str | Path = CASES) -> list[dict]:
    return json.loads(Path(path).read_text())["cases"]


def math_verify_says(case: dict, settings: dict) -> int:
    """math-verify's own verdict on the raw pair under `settings` (the test's, or ours)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    if settings["call"] == "parse_verify_defaults":
        return int(verify(parse(case["gold"]), parse(case["pred"])))
    cfg = [
        LatexExtractionConfig(boxed_match_priority=0) if m == "latex" else ExprExtractionConfig()
        for m in settings["match_types"]
    ]
    return int(
        verify(
            parse(case["gold"], cfg),
            parse(case["pred"], cfg),
            float_rounding=settings["precision"],
            strict=settings["strict"],
            allow_set_relation_comp=settings["allow_set_relation_comp"],
        )
    )


def _words(text: str) -> int:
    """Words of two or more letters outside math and LaTeX commands."""
    return len(re.findall(r"[A-Za-z]{2,}", re.sub(r"\\[A-Za-z]+", " ", _MATH_RE.sub(" ", text))))


def as_completion(pred: str) -> str:
    from rewards.answer import extract_answer

    return pred if extract_answer(pred) is not None else "The final answer is " + pred


def by_design(case: dict, answer: str | None, anchored: bool, mv_test: int, mv_ours: int, status: str) -> str | None:
    """The by-design class of a right answer we score 0 (module docstring), or None."""
    if status == "not_literal":
        return "not_literal"
    if case["settings"] != OUR_SETTINGS and mv_ours != case["expected"]:
        return "test_setting"
    if mv_test != case["expected"]:
        return "upstream_newer"
    if (anchored and _words(case["pred"]) >= 10) or (answer is not None and _words(answer) >= 3):
        return "prose"
    if case["pred"].count("\\boxed") >= 2:
        return "several_boxes"
    if (
        answer is not None
        and re.fullmatch(r"[-+]?\d+,\d+", answer)
        and not re.fullmatch(r"[-+]?[1-9]\d{0,2}(,\d{3})+", answer)
    ):
        return "decimal_comma"
    return None


def run_suite(cases: list[dict] | None = None, strict: bool = False) -> dict:
    """Score every case; returns the counts and one row per case."""
    from rewards.answer import extract_answer
    from rewards.math import score_completion

    rows = []
    for case in cases if cases is not None else load_cases():
        completion = as_completion(case["pred"])
        score, status, _ = score_completion(case["gold"], completion, strict=strict)
        ours = int(score)
        row = {
            "id": case["id"],
            "source": case["source"],
            "expected": case["expected"],
            "ours": ours,
            "status": status,
            "anchored": completion is not case["pred"],
            "answer": extract_answer(completion),
            "verdict": "agree",
        }
        if ours == 1 and case["expected"] == 0:
            row["verdict"] = "wrong_scored_1"
        elif ours == 0 and case["expected"] == 1:
            cls = by_design(
                case,
                row["answer"],
                row["anchored"],
                math_verify_says(case, case["settings"]),
                math_verify_says(case, OUR_SETTINGS),
                status,
            )
            row["verdict"] = f"by_design:{cls}" if cls else "right_scored_0"
        rows.append(row)
    verdicts = Counter(r["verdict"] for r in rows)
    return {
        "cases": len(rows),
        "agree": verdicts["agree"],
        "by_design": {c: verdicts[f"by_design:{c}"] for c in CLASSES},
        "wrong_scored_1": verdicts["wrong_scored_1"],
        "right_scored_0": verdicts["right_scored_0"],
        "anchored": sum(r["anchored"] for r in rows),
        "strict": strict,
        "rows": rows,
    }


def math_verify_alone(cases: list[dict] | None = None) -> dict:
    """The installed math-verify on the same pairs with each test's own settings (the baseline)."""
    cases = cases if cases is not None else load_cases()
    got = [math_verify_says(c, c["settings"]) for c in cases]
    return {
        "agree": sum(g == c["expected"] for g, c in zip(got, cases)),
        "wrong_scored_1": sum(g == 1 and c["expected"] == 0 for g, c in zip(got, cases)),
        "right_scored_0": sum(g == 0 and c["expected"] == 1 for g, c in zip(got, cases)),
    }


def format_table(result: dict, baseline: dict | None = None, verbose: bool = False) -> str:
    by_design = sum(result["by_design"].values())
    lines = [
        f"math-verify public test cases through rewards.math ({'strict' if result['strict'] else 'default'}); "
        f"{result['anchored']} bare predictions given 'The final answer is ' in front",
        f"{'cases':<50}{result['cases']:>5}",
        f"{'agree':<50}{result['agree']:>5}",
        f"{'differ by design':<50}{by_design:>5}",
    ]
    shown = [(c, n) for c, n in result["by_design"].items() if n or c != "not_literal" or result["strict"]]
    lines += [f"  {c:<48}{n:>5}" for c, n in shown]
    lines += [
        f"{'wrong answers scored 1 (goal 0)':<50}{result['wrong_scored_1']:>5}",
        f"{'right answers scored 0, not by design (goal 0)':<50}{result['right_scored_0']:>5}",
    ]
    if baseline is not None:
        lines.append(
            f"math-verify alone, each test's own settings: agree {baseline['agree']}, wrong answers scored 1 "
            f"{baseline['wrong_scored_1']}, right answers scored 0 {baseline['right_scored_0']}"
        )
    if verbose:
        for r in result["rows"]:
            if r["verdict"] != "agree":
                lines.append(
                    f"  #{r['id']:<4} {r['verdict']:<26} {r['source'].split('::')[-1]:<36} read {r['answer']!r:.60}"
                )
    return "\n".join(lines)
