"""GSM8K rows in fbrl's word-problem chat format, split by a hash of the question.

GSM8K (grade-school math, MIT licence) is not shipped with fbrl; get it with `datasets` and write its training
split as JSON lines (`{"question": ..., "answer": "...worked steps...\\n#### 72"}` per line):

    python -c "import datasets; datasets.load_dataset('openai/gsm8k', 'main')['train'].to_json('gsm8k_train.jsonl')"

`rows_from_file` turns each line into the row the word problems use (`rl.data.word_problems.chat_row`): a chat
with the same instruction and worked examples, `solution` = the worked steps with the calculator annotations
(`<<48/2=24>>`) removed and the final line `#### 72` written as `\\boxed{72}`, `answer` = that number. The split
(train / val / test) is the word problems' hash rule on the question text, so a slice never moves between
splits whatever the file order, and the same held-out slice serves continued training, RL and evaluation.
"""

from __future__ import annotations

import re
from pathlib import Path

from rl.data.jsonl import DataError, read_numbered
from rl.data.word_problems import SPLITS, chat_row, split_of

_CALC = re.compile(r"<<[^<>]*>>")
_FINAL = re.compile(r"^####\s*(.+?)\s*$")


def parse_solution(text: str, where: str, calculator: bool = False) -> tuple[list[str], str]:
    """GSM8K's worked answer -> (steps without calculator annotations, or with them when `calculator`, final
    answer without thousands commas)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    final = _FINAL.match(lines[-1]) if lines else None
    if final is None:
        raise DataError(f"{where}: field 'answer' does not end with a '#### N' line")
    answer = final.group(1).replace(",", "")
    return [ln if calculator else _CALC.sub("", ln) for ln in lines[:-1]], answer


def rows_from_file(
    path: str | Path, split: str, shots: int = 2, n: int | None = None, calculator: bool = False
) -> list[dict]:
    """The GSM8K rows of `split` ('train', 'val' or 'test') from a JSONL file of {question, answer} lines, in
    file order, the first `n` if given. Errors name file:line. `calculator`: the annotations stay in the solution
    as calculator calls (docs/TOOLS.md), and the worked examples of the prompt are written so too."""
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {list(SPLITS)}, got {split!r}")
    path = Path(path)
    if not path.is_file():
        raise DataError(
            f"{path}: no such file (GSM8K is not shipped with fbrl; write it with "
            f"`datasets.load_dataset('openai/gsm8k', 'main')['train'].to_json(PATH)`)"
        )
    rows = []
    for lineno, raw in read_numbered(path):
        where = f"{path}:{lineno}"
        if not isinstance(raw.get("question"), str) or not isinstance(raw.get("answer"), str):
            raise DataError(f"{where}: expected string fields 'question' and 'answer' (fields: {sorted(raw)})")
        question = raw["question"].strip()
        if split_of(question) != split:
            continue
        steps, answer = parse_solution(raw["answer"], where, calculator)
        row = chat_row(question, steps, 0, difficulty=len(steps), shots=shots, calculator=calculator)
        row["solution"] = "\n".join(steps + [f"\\boxed{{{answer}}}"])
        row["answer"] = answer
        row["source"] = "gsm8k"
        rows.append(row)
        if n is not None and len(rows) == n:
            break
    return rows
