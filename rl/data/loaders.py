"""Prompt/answer datasets from files, and the resumable prompt sampler.

Owns: the rows of a source (rl/data/sources.py: JSON lines, JSON, parquet, CSV, a `datasets` directory, a Hub
dataset) normalized to `prompt` / `answer` (dotted field paths, chats, optional answers), `load_task_split`
which maps a `data` config section to rows, and
`PromptSampler`, which draws prompts in a seeded per-epoch order and can save/restore its position so that a
resumed run draws exactly the prompts an uninterrupted run would have.

Rows are plain dicts with `prompt` (str) and `answer` (str, or None where the data has none and no reward needs
one); every other column rides along and reaches
the reward functions as a keyword list (`reward_columns`, TRL's convention; docs/REWARDS.md). A dataset may give
a `messages` chat (list of {role, content}) instead of, or beside, a prompt string: `render_prompts` turns it into
the prompt text with the tokenizer's chat template (`data.chat_template`: auto / on / off), and `encode_prompt`
tokenizes a prompt without adding a second set of special tokens to a templated one.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from rl.data.jsonl import DataError
from rl.data.sources import field, read_rows
from rl.data.tasks import TASKS


def _normalize(
    rows: list[dict],
    where,
    prompt_field: str,
    answer_field: str,
    messages_field: str = "messages",
    answer_needed_by: str | None = None,
) -> list[dict]:
    """Rename the configured fields to `prompt` / `answer` (and `messages`); `where(i)` names row i for errors.

    Fields may be dotted paths into nested columns (`reward_model.ground_truth`). A row needs a prompt: a string,
    or a chat — a list of {role, content} in the prompt field (verl's and TRL's layout) or in `messages_field` —
    rendered later by `render_prompts`. The answer is optional: rows without one get None, unless
    `answer_needed_by` names what needs it (the math reward), which makes a missing answer an error naming it.
    """
    out = []
    for i, row in enumerate(rows):
        prompt, answer = field(row, prompt_field), field(row, answer_field)
        messages = field(row, messages_field)
        if isinstance(prompt, list):  # a chat in the prompt column
            messages, prompt = prompt, None
        if answer is None and answer_needed_by:
            raise DataError(
                f"{where(i)}: missing field {answer_field!r}, which {answer_needed_by} needs (fields: {sorted(row)}); "
                f"set data.answer_field to the column holding the reference answer"
            )
        if messages is None and prompt is None:
            raise DataError(f"{where(i)}: missing field {prompt_field!r} or {messages_field!r} (fields: {sorted(row)})")
        if answer is not None and (isinstance(answer, bool) or not isinstance(answer, (str, int, float))):
            raise DataError(
                f"{where(i)}: field {answer_field!r} must be a string or number, got {type(answer).__name__}"
            )
        new = dict(row)
        if messages is not None:
            new["messages"] = _check_messages(messages, f"{where(i)}: field {messages_field!r}")
        new.pop("prompt", None)
        if prompt is not None:
            if not isinstance(prompt, str):
                raise DataError(f"{where(i)}: field {prompt_field!r} must be a string, got {type(prompt).__name__}")
            new["prompt"] = prompt
        new["answer"] = None if answer is None else str(answer)
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


def load_rows(
    task: str,
    path: str | Path,
    split: str = "train",
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    messages_field: str = "messages",
    hub_config: str | None = None,
    answer_needed_by: str | None = "the math reward",
) -> list[dict]:
    """The rows of one source (rl/data/sources.py: jsonl, json, parquet, csv, hf_disk, hub), normalized."""
    rows, where = read_rows(task, str(path), split, hub_config)
    return _normalize(rows, where, prompt_field, answer_field, messages_field, answer_needed_by)


def load_jsonl(
    path: str | Path, prompt_field: str = "prompt", answer_field: str = "answer", messages_field: str = "messages"
) -> list[dict]:
    return load_rows("jsonl", path, prompt_field=prompt_field, answer_field=answer_field, messages_field=messages_field)


def load_task_split(
    data: Any, split: str, n: int | None = None, tokenizer=None, answer_needed_by: str | None = "the math reward"
) -> list[dict]:
    """Rows for `split` ('train', 'val' or 'test') of a `data` config section (rl.config.DataConfig), each with
    its `prompt` text (`messages` rendered by `render_prompts` with `tokenizer` per `data.chat_template`).

    arith, word_problems and the state-tracking tasks (rl/data/track.py: cups, modsum, parity; `data.difficulty`
    = chain lengths): generated (`n` problems; train defaults to `data.num_train`), with split names
    `data.train_split` / `data.test_split` mapping onto the task's own splits. Files: `train_path` for train,
    `test_path` for the others (a Hub dataset: `train_path` for both unless `test_path` is set); `n` keeps the
    first n rows. A row without an answer is an error naming `answer_needed_by` (None: answers are optional).
    """
    rows = _task_rows(data, split, n, answer_needed_by)
    return render_prompts(rows, tokenizer, getattr(data, "chat_template", "auto"))


def _task_rows(data: Any, split: str, n: int | None, answer_needed_by: str | None) -> list[dict]:
    name = data.train_split if split == "train" else data.test_split if split == "test" else split
    task = TASKS[data.task]
    if task.generated:
        if n is None:
            if split != "train":
                raise DataError(f"data: say how many {split} problems to generate (n)")
            n = data.num_train
        return task.make_rows(data, name, n)
    path = data.train_path if split == "train" else data.test_path
    if not path and data.task == "hub":
        path = data.train_path  # one Hub dataset, another split
    if not path:
        raise DataError(f"data.{'train' if split == 'train' else 'test'}_path: required for task {data.task!r}")
    rows = load_rows(
        data.task,
        path,
        name,
        data.prompt_field,
        data.answer_field,
        getattr(data, "messages_field", "messages"),
        getattr(data, "hub_config", None),
        answer_needed_by,
    )
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
