"""The word-problem task (rl/data/word_problems.py) and chat rows in the loaders (messages, chat templates)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from rl.data import word_problems as wp
from rl.data.jsonl import DataError, write_jsonl
from rl.data.loaders import encode_prompt, load_jsonl, load_task_split, render_prompts
from rl.data.tokenizer import build_tokenizer

# A ChatML template like SmolLM2's, on the project's char tokenizer (offline; <bos> stands for <|im_start|>).
CHATML = (
    "{% for m in messages %}<bos>{{ m['role'] }}\n{{ m['content'] }}<eos>\n{% endfor %}"
    "{% if add_generation_prompt %}<bos>assistant\n{% endif %}"
)


def chat_tokenizer():
    tok = build_tokenizer()
    tok.chat_template = CHATML
    return tok


def test_generation_is_seeded_and_levels_have_their_number_of_steps():
    assert wp.generate("train", 50, seed=3, difficulties=(1, 2, 3, 4)) == wp.generate(
        "train", 50, seed=3, difficulties=(1, 2, 3, 4)
    )
    assert wp.generate("train", 50, seed=3) != wp.generate("train", 50, seed=4)
    for level in wp.LEVELS:
        for row in wp.generate("val", 200, difficulties=(level,)):
            steps = row["solution"].split("\n")[:-1]
            assert len(steps) == level == row["difficulty"]
            assert row["solution"].endswith(f"\\boxed{{{row['answer']}}}")
            assert int(row["answer"]) >= 0


def test_worked_steps_are_true_and_end_at_the_answer():
    """Every step `a op b = c` is right, and the last step's result is the answer (integers throughout)."""
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b}
    for row in wp.generate("train", 2000, difficulties=(1, 2, 3, 4)):
        steps = row["solution"].split("\n")[:-1]
        for step in steps:
            a, op, b, c = re.fullmatch(r"(\d+) ([-+*/]) (\d+) = (\d+)", step).groups()
            assert ops[op](int(a), int(b)) == int(c), (step, row["question"])
        assert steps[-1].endswith(f"= {row['answer']}")
        # the numbers the steps start from are in the question (no hidden quantities), bar unit factors
        first = re.findall(r"\d+", steps[0])[:2]
        assert all(n in re.findall(r"\d+", row["question"]) or n in ("100", "2") for n in first), row


def test_splits_are_hash_disjoint():
    test = {r["question"] for r in wp.generate("test", 1500, difficulties=(1, 2, 3, 4))}
    train = {r["question"] for r in wp.generate("train", 20000, difficulties=(1, 2, 3, 4))}
    assert not test & train
    assert all(wp.split_of(q) == "test" for q in test)
    assert len(test) == 1500  # held-out problems are distinct


def test_rows_are_chats_with_a_system_instruction_and_worked_examples():
    row = wp.generate("test", 1)[0]
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert row["messages"][-1]["content"] == row["question"]
    assert "\\boxed{N}" in row["messages"][0]["content"]
    assert all("\\boxed{" in m["content"] for m in row["messages"] if m["role"] == "assistant")
    assert row["question"] in row["prompt"]  # the plain-text form for base models


def test_word_problems_task_renders_with_the_chat_template():
    data = SimpleNamespace(
        task="word_problems",
        train_split="train",
        test_split="test",
        num_train=20,
        seed=0,
        difficulty=[1, 2],
        chat_template="auto",
    )
    tok = chat_tokenizer()
    rows = load_task_split(data, "test", n=5, tokenizer=tok)
    for row in rows:
        assert row["chat_templated"] and row["prompt"].startswith("<bos>system\n")
        assert row["prompt"].endswith(f"<bos>user\n{row['question']}<eos>\n<bos>assistant\n")
        ids = encode_prompt(tok, row)
        assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id  # the template's own, not a second one
        assert tok.decode(ids) == row["prompt"]
    assert len(load_task_split(data, "train", tokenizer=tok)) == 20
    # off (base models): the plain prompt, tokenized as usual
    plain = load_task_split(SimpleNamespace(**{**vars(data), "chat_template": "off"}), "test", n=2, tokenizer=tok)
    assert not plain[0].get("chat_templated") and plain[0]["prompt"] == wp.generate("test", 1)[0]["prompt"]


def test_chat_template_modes_and_errors():
    tok = chat_tokenizer()
    chat = {"messages": [{"role": "user", "content": "2+2?"}], "answer": "4"}
    prompt = {"prompt": "Q: 2+2?", "answer": "4"}
    auto = render_prompts([chat, prompt], tok, "auto")
    assert auto[0]["prompt"] == "<bos>user\n2+2?<eos>\n<bos>assistant\n" and auto[1]["prompt"] == "Q: 2+2?"
    on = render_prompts([prompt], tok, "on")
    assert on[0]["prompt"] == "<bos>user\nQ: 2+2?<eos>\n<bos>assistant\n"
    off = render_prompts([chat], tok, "off")
    assert off[0]["prompt"] == "2+2?\n" and not off[0].get("chat_templated")
    assert render_prompts([chat], build_tokenizer(), "auto")[0]["prompt"] == "2+2?\n"  # no template: plain text
    with pytest.raises(DataError, match="no chat template"):
        render_prompts([chat], build_tokenizer(), "on")
    with pytest.raises(DataError, match="chat_template"):
        render_prompts([chat], tok, "yes")


def test_jsonl_messages_rows_and_errors_name_the_line(tmp_path):
    good = tmp_path / "chat.jsonl"
    write_jsonl([{"messages": [{"role": "user", "content": "1+1?"}], "answer": 2}], good)
    rows = load_jsonl(good)
    assert rows[0]["messages"][0]["content"] == "1+1?" and rows[0]["answer"] == "2"
    bad = tmp_path / "bad.jsonl"
    write_jsonl(
        [{"messages": [{"role": "user", "content": "ok"}], "answer": 1}, {"messages": [{"role": "user"}], "answer": 1}],
        bad,
    )
    with pytest.raises(DataError, match=r"bad.jsonl:2: field 'messages'\[0\]"):
        load_jsonl(bad)
    neither = tmp_path / "neither.jsonl"
    write_jsonl([{"question": "x", "answer": 1}], neither)
    with pytest.raises(DataError, match=r"neither.jsonl:1: missing field 'prompt' or 'messages'"):
        load_jsonl(neither)
    custom = tmp_path / "custom.jsonl"
    write_jsonl([{"chat": [{"role": "user", "content": "3?"}], "sol": "3"}], custom)
    assert load_jsonl(custom, answer_field="sol", messages_field="chat")[0]["messages"][0]["content"] == "3?"


def test_small_numbers_stay_in_the_lowest_quarter_and_keep_the_splits():
    standard = wp.generate("train", 300, difficulties=(1, 2))
    small = wp.generate("train", 300, difficulties=(1, 2), numbers="small")
    biggest = lambda rows: max(int(n) for r in rows for n in re.findall(r"\d+", r["question"]))  # noqa: E731
    assert biggest(small) < biggest(standard)
    # same sentences, same checks: every step is still true and the splits stay hash-disjoint
    assert {r["question"].split()[-1] for r in small} <= {r["question"].split()[-1] for r in standard} | {"all?"}
    test = {r["question"] for r in wp.generate("test", 300, difficulties=(1, 2), numbers="small")}
    assert not test & {r["question"] for r in wp.generate("train", 5000, difficulties=(1, 2), numbers="small")}
    # the standard stream is what it was before the option existed (seeded runs keep their problems)
    assert standard[0]["question"] == wp.generate("train", 1, difficulties=(1, 2))[0]["question"]
    with pytest.raises(ValueError, match="numbers"):
        wp.generate("train", 1, numbers="tiny")


def test_shots_set_the_worked_examples_and_not_the_problems():
    rows = {k: wp.generate("test", 5, shots=k) for k in (0, 1, 2)}
    assert [len(r["messages"]) for r in (rows[0][0], rows[1][0], rows[2][0])] == [2, 4, 6]
    assert rows[0][0]["messages"][0]["content"] == wp.INSTRUCTION
    assert rows[1][0]["messages"][1]["content"] == wp.EXAMPLES[-1][0]
    assert [r["question"] for r in rows[0]] == [r["question"] for r in rows[2]]
    assert rows[0][0]["prompt"] == f"{wp.INSTRUCTION}\n\n{rows[0][0]['question']}\n"
    with pytest.raises(ValueError, match="shots"):
        wp.generate("test", 1, shots=3)
