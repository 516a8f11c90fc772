"""rewards.answer — where the answer of a completion is, and how answer text is normalised. Pure text, no sympy.

Owns the answer rules a policy is held to (docs/REWARDS.md states them for users; tests/test_rewards_answer.py
pins them):

  * An answer needs an anchor: `\\boxed{...}` or a "final answer is X" / "final answer: X" line (case-insensitive,
    markdown `**` allowed). Text such as "so x = 5" or "the answer is 5" is not an anchor. When both anchors
    appear, the one that starts last wins.
  * Box: the LAST `\\boxed{` is the answer (MATH / Minerva / PRM800K graders do the same): a model that boxes 3,
    then corrects itself and boxes 5, answered 5. Boxes that directly precede it, separated only by commas,
    "and", "or", `&`, spaces or math delimiters ("\\boxed{-2} and \\boxed{1}"), are one answer in several parts and
    are joined with ", ". Any other text between boxes ("\\boxed{3}. Wait: \\boxed{5}") ends the list. If the last
    box does not close, or is longer than `max_chars`, there is no answer (an earlier box is not used: it would
    reward a retracted answer).
  * "Final answer" line: the text after the anchor up to the end of its line (or the next non-empty line when
    the anchor ends its line; a display block `$$...$$` / `\\[...\\]` opened on it runs to its end). Everything
    from "I hope it is correct" on is dropped, wherever it stands. Then: the last math block of that text
    (`$...$`, `$$...$$`, `\\(...\\)`, `\\[...\\]`), joined with blocks directly before it that are separated
    only by commas / "and" / "or"; but if that block is followed by "is N" / "are N" / "= N" with N a plain
    number, N is the answer ("The largest $n$ is 34." answers 34). Without a math block the text itself is the
    answer, or the plain number after its last "is" ("The volume of the box is 120").
  * One rule for trailing punctuation on both paths: a final `.`, `,`, `;` or `:` is sentence punctuation and is
    dropped ("\\boxed{42.}", "$\\frac{1}{3}.$"); an ellipsis (`...`, `\\dots`) is kept (it is part of the answer).

Normalisation (`normalize`, applied to predicted and gold answers alike): digit groups joined by a thin space,
a space, `\\!`, `{,}` or `,\\!` become plain digits or commas ("1\\,000", "1 000" -> "1000"; "14{,}916" ->
"14,916"); `\\mathrm{e}` is Euler's number `e` (math-verify would strip it as a unit); unescaped `$` left
inside an answer are removed.

Literal numbers (`literal_value`): the strict option of the math reward and the arithmetic task accept only a
number written out — an optionally signed integer, decimal or fraction (`a/b`, `\\frac{a}{b}`) — never an
expression that evaluates to it (`17*23`, the question copied), nor units or words.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOX_RE = re.compile(r"\\boxed\s*\{")
# "final answer is X", "Final Answer: X", "**Final Answer:** X" — requires "is" or ":" right after, so that
# "the final answer will follow" is not an anchor.
_FINAL_RE = re.compile(r"final\s+answer\b[*\s]{0,8}(?:is\b[*\s]{0,8}:?|:)[*\s]{0,8}", re.IGNORECASE)
_HEDGE_RE = re.compile(r"I\s+hope\s+it\s+is\s+correct", re.IGNORECASE)
# Math blocks on a final-answer line. `\$` is a dollar sign, not a delimiter; inline `$`/`\(` stay on one line.
_BLOCK_RE = re.compile(
    r"(?<!\\)\$\$(.+?)(?<!\\)\$\$|\\\[(.+?)\\\]|\\\((.+?)\\\)|(?<![\\$])\$(?!\$)([^$\n]+?)(?<!\\)\$", re.DOTALL
)
# What may stand between the parts of one answer: commas, and/or, &, spaces, delimiters, LaTeX spacing.
_JOINER_RE = re.compile(r"(?:\s|,|;|&|\$|\\[()\[\]]|\\text\{\s*(?:and|or)\s*\}|\\q?quad|\\[,;: !]|\band\b|\bor\b)*")
_NUMBER = r"[-+−]?\$?\d[\d,]*(?:\.\d+)?%?"
# "is 34." / "= 34" closing a sentence (chat-template debris may follow on the line).
_IS_NUMBER_RE = re.compile(r"(?:\bis\b|\bare\b|=)\s*(" + _NUMBER + r")\s*(?:[.!](?:\s|$)|$)", re.IGNORECASE)
_PLAIN_NUMBER_RE = re.compile(r"^\s*" + _NUMBER + r"\s*$")
_DECORATION = " \t\n*\"'“”`"

# Digit groups: "1\\,000", "1 000", "1\\!000", "1~000" (the run must start a number: not after a letter, ".", "^";
# a line break does not separate groups).
_GROUPS_RE = re.compile(r"(?<![\w.^_{\\])(\d{1,3})((?:(?:\\[,;: !]|~|[ \u2009\u202f])\d{3})+)(?![\d])")
_GROUP_SEP_RE = re.compile(r"\\[,;: !]|~|[ \u2009\u202f]")
_ELLIPSIS_RE = re.compile(r"(?:\.\.|\\[lc]?dots|\\ldots|…)\s*$")


def box_content(text: str, open_brace: int, max_chars: int) -> str | None:
    """Content of the brace group opening at `open_brace`, or None if it does not close within max_chars.

    The scan is bounded by max_chars, so a 1 MB string of braces costs no more than a short answer.
    `\\{` and `\\}` are LaTeX set braces, not grouping, and are skipped.
    """
    depth, i, end = 0, open_brace, min(len(text), open_brace + max_chars + 2)
    while i < end:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[open_brace + 1 : i]
        i += 1
    return None


def _last_match(pattern: re.Pattern, text: str) -> re.Match | None:
    last = None
    for match in pattern.finditer(text):
        last = match
    return last


def _is_joiner(between: str) -> bool:
    return _JOINER_RE.fullmatch(between) is not None


def strip_trailing_punctuation(answer: str) -> str:
    """Drop sentence punctuation at the end (`.`, `,`, `;`, `:`), never an ellipsis."""
    answer = answer.strip()
    while answer and answer[-1] in ".,;:" and not _ELLIPSIS_RE.search(answer):
        answer = answer[:-1].rstrip()
        while answer.endswith(("\\,", "\\;", "\\!", "\\ ")):
            answer = answer[:-2].rstrip()
    return answer


def _box_answer(completion: str, boxes: list[re.Match], max_chars: int) -> str | None:
    """The last box, with the boxes that directly precede it in a list ("\\boxed{-2} and \\boxed{1}")."""
    parts: list[str] = []
    end_of_next = None
    for m in reversed(boxes):
        content = box_content(completion, m.end() - 1, max_chars)
        if content is None:
            if not parts:
                return None  # the last box is broken: no answer, never an earlier (retracted) one
            break
        close = m.end() - 1 + len(content) + 1
        if end_of_next is not None and not _is_joiner(completion[close + 1 : end_of_next]):
            break
        parts.append(content.strip())
        end_of_next = m.start()
        if sum(map(len, parts)) > max_chars:
            return None
    parts = [_unbrace(p, max_chars) for p in reversed(parts)]
    return ", ".join(p for p in parts if p) or None


def _unbrace(content: str, max_chars: int) -> str:
    # "{{42}}" is the group "42": drop redundant outer braces (math-verify's parse slows ~0.1 s per level).
    while content.startswith("{") and box_content(content, 0, max_chars) == content[1:-1]:
        content = content[1:-1].strip()
    return content


def _final_region(text: str, start: int, max_chars: int) -> str:
    """The text a "final answer" anchor ending at `start` refers to (see the module docstring)."""
    rest = text[start : start + 8 * max_chars]
    stripped = rest.lstrip(" \t*")
    if stripped.startswith("\n"):  # "Final answer:\n42": the next non-empty line
        stripped = stripped.lstrip()
    line, _, after = stripped.partition("\n")
    # A display block opened on this line and not closed on it runs on to its end.
    closer = "$$" if line.count("$$") % 2 else "\\]" if line.count("\\[") > line.count("\\]") else None
    if closer is not None and after.find(closer) >= 0:
        line = line + "\n" + after[: after.find(closer) + len(closer)]
    hedge = _HEDGE_RE.search(line)
    return line[: hedge.start()] if hedge else line


def _final_answer(text: str, start: int, max_chars: int) -> str | None:
    region = _final_region(text, start, max_chars)
    blocks = list(_BLOCK_RE.finditer(region))
    if blocks:
        last = blocks[-1]
        tail = region[last.end() :].strip(_DECORATION)
        is_number = _IS_NUMBER_RE.search(tail)
        if is_number and re.fullmatch(r"[\w\s,]*", tail[: is_number.start()]):  # "... $n$ is 34."
            answer = is_number.group(1)
        else:
            parts = [next(g for g in last.groups() if g is not None)]
            for prev, nxt in zip(reversed(blocks[:-1]), reversed(blocks[1:])):
                if not _is_joiner(region[prev.end() : nxt.start()]):
                    break
                parts.append(next(g for g in prev.groups() if g is not None))
            answer = ", ".join(p.strip() for p in reversed(parts))  # math as written: f' keeps its prime
    else:
        answer = region.strip(_DECORATION)  # prose decoration: **bold**, quotes
        is_number = _IS_NUMBER_RE.search(answer)
        if is_number and not _PLAIN_NUMBER_RE.match(answer):
            answer = is_number.group(1)
    answer = strip_trailing_punctuation(answer)
    if not answer or len(answer) > max_chars:
        return None
    return answer


def extract_answer(completion: str, max_chars: int = 512) -> str | None:
    """The anchored answer text of a completion (see the module docstring), or None when there is none."""
    boxes = list(_BOX_RE.finditer(completion))
    final = _last_match(_FINAL_RE, completion)
    if final is not None and (not boxes or final.start() > boxes[-1].start()):
        answer = _final_answer(completion, final.end(), max_chars)
        # "The final answer is $\boxed{42}$": the box inside the line is the answer.
        inner = list(_BOX_RE.finditer(answer or ""))
        answer = _box_answer(answer, inner, max_chars) if inner else answer
    elif boxes:
        answer = _box_answer(completion, boxes, max_chars)
    else:
        return None
    return (strip_trailing_punctuation(answer) or None) if answer is not None else None


# -- normalisation ---------------------------------------------------------------------------------------------------


def _join_groups(m: re.Match) -> str:
    return m.group(1) + _GROUP_SEP_RE.sub("", m.group(2))


def normalize(answer: str, strip_dollars: bool = True) -> str:
    """Normalise an answer (predicted or gold) before it is parsed; see the module docstring. `strip_dollars=False`
    keeps math delimiters (a gold written as a whole solution, where math-verify looks for them)."""
    s = re.sub(r"\{,\}|,\\!\s*(?=\d)", ",", answer).replace("−", "-")
    s = _GROUPS_RE.sub(_join_groups, s)
    s = re.sub(r"\\mathrm\s*\{\s*e\s*\}", "e", s)
    if strip_dollars:
        s = re.sub(r"(?<!\\)\$", "", s)
    return s.strip()


# -- literal numbers ---------------------------------------------------------------------------------------------

_INT_RE = re.compile(r"[-+]?\s*[0-9]+")
_THOUSANDS_RE = re.compile(r"[-+]?\s*[1-9][0-9]{0,2}(?:,[0-9]{3})+(?:\.[0-9]+)?")
_DEC_RE = re.compile(r"[-+]?\s*(?:[0-9]+\.[0-9]*|\.[0-9]+)")
# \frac{a}{b}, \dfrac / \tfrac / \cfrac, the one-digit shorthand \frac12, and a/b.
_FRAC_RE = re.compile(
    r"([-+]?)\s*(?:\\[dtc]?frac\s*(?:\{\s*([0-9]+)\s*\}|([0-9]))\s*(?:\{\s*([0-9]+)\s*\}|([0-9]))"
    r"|([0-9]+)\s*/\s*([0-9]+))"
)


def literal_value(answer: str) -> tuple[str, Fraction] | None:
    """(kind, value) when `answer` is a number written out — kind "int", "decimal" or "fraction" — else None.

    Only ASCII digits count ("١٧" is not 17), an optional sign, thousands commas in groups of three; no
    operators, exponents, units, words or LaTeX beyond `\\frac{a}{b}`. A zero denominator is not a number.
    """
    s = answer.strip()
    if len(s) > 200:
        return None
    if _INT_RE.fullmatch(s):
        return "int", Fraction(int(re.sub(r"\s", "", s)))
    if _THOUSANDS_RE.fullmatch(s):
        plain = re.sub(r"[\s,]", "", s)
        return ("decimal" if "." in plain else "int"), Fraction(plain)
    if _DEC_RE.fullmatch(s):
        return "decimal", Fraction(re.sub(r"\s", "", s))
    m = _FRAC_RE.fullmatch(s)
    if m:
        num, den = [next(g for g in pair if g is not None) for pair in ((m[2], m[3], m[6]), (m[4], m[5], m[7]))]
        if int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
        return "fraction", -value if m.group(1) == "-" else value
    return None


def literal_equal(gold: str, answer: str) -> bool | None:
    """Strict comparison: None when the gold is not a literal number (use math-verify); else False when `answer`
    is not a literal of the gold's kind (an integer gold needs an integer: `\\frac{782}{2}` is not 391), else
    whether the values are equal — exactly, or to 6 decimal places when either side is a decimal (math-verify's
    default `float_rounding`: 0.0833333 is 1/12, 0.33 is not 1/3)."""
    g = literal_value(gold)
    if g is None:
        return None
    a = literal_value(answer)
    if a is None or (g[0] == "int" and a[0] != "int"):
        return False
    if "decimal" in (g[0], a[0]):
        return round(a[1], 6) == round(g[1], 6)
    return a[1] == g[1]
