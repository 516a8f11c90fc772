"""Prompt/answer datasets from files, and the resumable prompt sampler.

Owns: JSONL read/write (errors name file:line), parquet (pyarrow, when installed), Hugging Face `datasets`
saved to disk (when `datasets` is installed), `load_task_split` which maps a `data` config section to rows, and
`PromptSampler`, which draws prompts in a seeded per-epoch order and can save/restore its position so that a
resumed run draws exactly the prompts an uninterrupted run would have.

Rows are plain dicts with at least `prompt` (str) and `answer` (str); every other column rides along and reaches
the reward functions as a keyword list (`reward_columns`, TRL's convention; docs/REWARDS.md). A dataset may give
a `messages` chat (list of {role, content}) instead of, or beside, a prompt string: `render_prompts` turns it into
the prompt text with the tokenizer's chat template (`data.chat_template`: auto / on / off), and `encode_prompt`
tokenizes a prompt without adding a second set of special tokens to a templated one.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from rl.data.jsonl import DataError, read_jsonl, read_numbered, write_jsonl  # noqa: F401  (re-exported)
from rl.data.tasks import LEVEL_TASKS, TRACK_TASKS


def _normalize(
    rows: list[dict], where, prompt_field: str, answer_field: str, messages_field: str = "messages"
) -> list[dict]:
    """Rename the configured fields to `prompt` / `answer` (and `messages`); `where(i)` names row i for errors.

    A row needs a prompt string or a `messages` list of {role, content} dicts (a chat, rendered later by
    `render_prompts`), and an answer.
    """
    out = []
    for i, row in enumerate(rows):
        if answer_field not in row or row[answer_field] is None:
            raise DataError(f"{where(i)}: missing field {answer_field!r} (fields: {sorted(row)})")
        has_messages = row.get(messages_field) is not None
        if not has_messages and (prompt_field not in row or row[prompt_field] is None):
            raise DataError(f"{where(i)}: missing field {prompt_field!r} or {messages_field!r} (fields: {sorted(row)})")
        answer = row[answer_field]
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise DataError(
                f"{where(i)}: field {answer_field!r} must be a string or number, got {type(answer).__name__}"
            )
        new = dict(row)
        if has_messages:
            new["messages"] = _check_messages(row[messages_field], f"{where(i)}: field {messages_field!r}")
        if row.get(prompt_field) is not None:
            if not isinstance(row[prompt_field], str):
                raise DataError(
                    f"{where(i)}: field {prompt_field!r} must be a string, got {type(row[prompt_field]).__name__}"
                )
            new["prompt"] = row[prompt_field]
        new["answer"] = str(answer)
        out.append(new)
    return out


def _check_messages(messages, where: str) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where} must be a non-empty list of {{role, content}} messages")
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(f"{where}[{j}]: expected {{'role': str, 'content': str}}, got {m!r:.80}")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


CHAT_TEMPLATE_MODES = ("auto", "on", "off")


def render_prompts(rows: list[dict], tokenizer=None, chat_template: str = "auto") -> list[dict]:
    """Give every row its `prompt` text: a `messages` chat rendered with the tokenizer's chat template.

    auto: rows with `messages` are rendered with the template when the tokenizer has one (else as plain text);
    plain `prompt` rows are left alone. on: every row goes through the template (a plain prompt becomes one user
    message); the tokenizer must have a template. off (base models): no template; `messages` rows are rendered
    as plain text (their contents separated by blank lines) unless they carry a `prompt` already.
    Rendered rows get `chat_templated: True`; their text already holds the template's special tokens, so
    `encode_prompt` encodes them without adding any.
    """
    if chat_template not in CHAT_TEMPLATE_MODES:
        raise DataError(f"data.chat_template: expected one of {CHAT_TEMPLATE_MODES}, got {chat_template!r}")
    has_template = tokenizer is not None and getattr(tokenizer, "chat_template", None)
    if chat_template == "on" and not has_template:
        raise DataError(
            "data.chat_template is 'on' but the tokenizer has no chat template (a base model? set "
            "data.chat_template: off)"
        )
    out = []
    for row in rows:
        messages = row.get("messages")
        if chat_template == "on" and messages is None:
            messages = [{"role": "user", "content": row["prompt"]}]
        use_template = messages is not None and has_template and chat_template != "off"
        if use_template:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            row = dict(row, prompt=text, chat_templated=True)
        elif row.get("prompt") is None:
            row = dict(row, prompt="\n\n".join(m["content"] for m in messages) + "\n")
        out.append(row)
    return out


def encode_prompt(tokenizer, row: dict) -> list[int]:
    """Token ids of a row's prompt: a chat-templated prompt already holds its special tokens (no second BOS)."""
    return tokenizer.encode(row["prompt"], add_special_tokens=not row.get("chat_templated", False))


def load_jsonl(
    path: str | Path, prompt_field: str = "prompt", answer_field: str = "answer", messages_field: str = "messages"
) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    numbered = read_numbered(path)  # keep line numbers so that a missing field names its line
    return _normalize(
        [row for _, row in numbered], lambda i: f"{path}:{numbered[i][0]}", prompt_field, answer_field, messages_field
    )


def load_parquet(
    path: str | Path, prompt_field: str = "prompt", answer_field: str = "answer", messages_field: str = "messages"
) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
    if not Path(path).exists():
        raise DataError(f"{path}: no such file")
    rows = pq.read_table(path).to_pylist()
    return _normalize(rows, lambda i: f"{path}: row {i}", prompt_field, answer_field, messages_field)


def load_hf_disk(
    path: str | Path,
    split: str | None = None,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    messages_field: str = "messages",
) -> list[dict]:
    """A `datasets` Dataset or DatasetDict written by `save_to_disk`; `split` picks from a DatasetDict."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"{path}: reading a saved Hugging Face dataset needs `datasets`") from None
    if not Path(path).exists():
        raise DataError(f"{path}: no such directory")
    ds = datasets.load_from_disk(str(path))
    where = str(path)
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"{path}: no split {split!r} (splits: {sorted(ds)})")
        ds, where = ds[split], f"{path}[{split}]"
    return _normalize(ds.to_list(), lambda i: f"{where}: row {i}", prompt_field, answer_field, messages_field)


def load_task_split(data: Any, split: str, n: int | None = None, tokenizer=None) -> list[dict]:
    """Rows for `split` ('train', 'val' or 'test') of a `data` config section (rl.config.DataConfig), each with
    its `prompt` text (`messages` rendered by `render_prompts` with `tokenizer` per `data.chat_template`).

    arith, word_problems and the state-tracking tasks (rl/data/track.py: cups, modsum, parity; `data.difficulty`
    = chain lengths): generated (`n` problems; train defaults to `data.num_train`), with split names
    `data.train_split` / `data.test_split` mapping onto the task's own splits. Files: `train_path` for train,
    `test_path` for the others; `n` keeps the first n rows.
    """
    rows = _task_rows(data, split, n)
    return render_prompts(rows, tokenizer, getattr(data, "chat_template", "auto"))


def _task_rows(data: Any, split: str, n: int | None) -> list[dict]:
    name = data.train_split if split == "train" else data.test_split if split == "test" else split
    if data.task in LEVEL_TASKS:
        if n is None:
            if split != "train":
                raise DataError(f"data: say how many {split} problems to generate (n)")
            n = data.num_train
        if data.task == "word_problems":
            from rl.data import word_problems

            return word_problems.generate(
                name,
                n,
                seed=data.seed,
                difficulties=tuple(data.difficulty),
                numbers=getattr(data, "numbers", "standard"),
                shots=getattr(data, "shots", 2),
            )
        from rl.data import arith

        return arith.generate(
            name, n, seed=data.seed, difficulties=tuple(data.difficulty), direct_answer_frac=data.direct_answer_frac
        )
    if data.task in TRACK_TASKS:
        from rl.data import track

        if n is None:
            if split != "train":
                raise DataError(f"data: say how many {split} problems to generate (n)")
            n = data.num_train
        return track.generate(data.task, name, n, seed=data.seed, lengths=tuple(data.difficulty))
    path = data.train_path if split == "train" else data.test_path
    if not path:
        raise DataError(f"data.{'train' if split == 'train' else 'test'}_path: required for task {data.task!r}")
    fields = dict(
        prompt_field=data.prompt_field,
        answer_field=data.answer_field,
        messages_field=getattr(data, "messages_field", "messages"),
    )
    if data.task == "jsonl":
        rows = load_jsonl(path, **fields)
    elif data.task == "parquet":
        rows = load_parquet(path, **fields)
    elif data.task == "hf_disk":
        rows = load_hf_disk(path, name, **fields)
    else:
        raise DataError(f"data.task: unknown task {data.task!r}")
    return rows if n is None else rows[:n]


# Reward arguments a dataset column must not shadow: the positional lists and the finish reasons the loop adds.
RESERVED_COLUMNS = ("prompts", "completions", "answers", "finish_reasons", "completion_ids")


def reward_columns(rows: list[dict]) -> dict[str, list]:
    """The columns of `rows` other than `prompt` and `answer` (those are the rewards' positional `prompts` and
    `answers`), one list per column, aligned with the rows: `{"difficulty": [1, 3, ...], "id": [...]}`. Rewards get
    them as keyword arguments (`def r(prompts, completions, answers, difficulty, **_)`), as in TRL. A column that a
    row lacks is None there. Raises DataError for a column that would shadow a reward argument."""
    names = dict.fromkeys(k for row in rows for k in row if k not in ("prompt", "answer"))
    clash = [k for k in names if k in RESERVED_COLUMNS]
    if clash:
        raise DataError(
            f"dataset column(s) {clash} would shadow the reward arguments {list(RESERVED_COLUMNS)}; "
            f"rename them in the data"
        )
    return {k: [row.get(k) for row in rows] for k in names}


class PromptSampler:
    """Draws rows in a seeded shuffled order, epoch after epoch; `state_dict()` is the exact data position.

    The order of epoch e depends only on (seed, e, len(rows)), so restoring (epoch, pos) replays the same
    stream. A batch that crosses an epoch boundary takes the rest of one epoch and the start of the next.
    """

    def __init__(self, rows: list[dict], seed: int = 0, shuffle: bool = True):
        if not rows:
            raise DataError("PromptSampler: no rows to sample from")
        self.rows, self.seed, self.shuffle = rows, seed, shuffle
        self.epoch, self.pos = 0, 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(f"fbrl-sampler:{self.seed}:{epoch}").shuffle(order)
        return order

    def next_indices(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._epoch_order(self.epoch)
            take = min(k - len(out), len(self._order) - self.pos)
            out += self._order[self.pos : self.pos + take]
            self.pos += take
        return out

    def next(self, k: int) -> list[dict]:
        """The next `k` rows."""
        return [self.rows[i] for i in self.next_indices(k)]

    def state_dict(self) -> dict:
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "pos": self.pos,
            "num_rows": len(self.rows),
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict) -> None:
        # a different dataset or seed would silently draw other prompts: refuse, naming what changed
        for key, mine in (("seed", self.seed), ("num_rows", len(self.rows)), ("shuffle", self.shuffle)):
            if state[key] != mine:
                raise DataError(f"sampler state: {key} was {state[key]!r}, now {mine!r} (data changed)")
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self._order = self._epoch_order(self.epoch)
