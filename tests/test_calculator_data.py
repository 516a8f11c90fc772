"""Calculator calls in the data (rl/data/word_problems.py, rl/data/gsm8k.py) and in multi-pass SFT documents
(rl/pretrain/trainer.py `encode_rows`): the tool's part of each annotation is what the calculator environment
writes, and SFT neither trains on it nor feeds anything back into it — as a multi-turn rollout reads it."""

import json

from rewards.environments import Calculator
from rl.data import gsm8k
from rl.data.tokenizer import build_tokenizer
from rl.data.word_problems import annotate_step, calculator_segments, generate
from rl.pretrain.trainer import encode_rows


def test_steps_become_calculator_calls():
    assert annotate_step("3 * 4 = 12") == "3 * 4 = <<3*4=12>>12"
    assert annotate_step("12 - 2 = 10") == "12 - 2 = <<12-2=10>>10"
    assert annotate_step("\\boxed{10}") == "\\boxed{10}"
    assert annotate_step("5 + 5 = <<5+5=10>>10") == "5 + 5 = <<5+5=10>>10"
    assert calculator_segments("a = <<1+2=3>>3 b") == [("a = <<1+2=", True), ("3>>", False), ("3 b", True)]
    assert calculator_segments("no calls") == [("no calls", True)]


def test_the_calculator_writes_every_annotation_of_the_data():
    rows = generate("train", 200, difficulties=(1, 2, 3, 4), calculator=True)
    calls = 0
    for r in rows:
        text = ""
        for segment, by_policy in calculator_segments(r["solution"]):
            if not by_policy:
                env = Calculator()
                env.reset(r)
                assert env.step(text).observation == segment, (text, segment)
                calls += 1
            text += segment
        assert text == r["solution"]
    assert calls >= 400
    assert "<<14+9=23>>23" in rows[0]["prompt"]  # the worked examples show the calls too


def test_gsm8k_keeps_its_annotations_when_asked(tmp_path):
    line = {"question": "Q?", "answer": "Half of 48 is 48/2 = <<48/2=24>>24.\n#### 24"}
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps(line) + "\n")
    split = gsm8k.split_of("Q?")
    kept = gsm8k.rows_from_file(path, split, calculator=True)[0]
    plain = gsm8k.rows_from_file(path, split)[0]
    assert "<<48/2=24>>24" in kept["solution"] and "<<" not in plain["solution"]


def test_sft_documents_mask_the_tools_part():
    tok = build_tokenizer()
    row = {"prompt": "Q\n", "solution": "6 * 7 = <<6*7=42>>42\n\\boxed{42}"}
    ((ids, mask),) = encode_rows([row], tok, 512, "response")
    prompt = len(tok("Q\n")["input_ids"])
    assert tok.decode(ids[prompt:-1]) == row["solution"]
    tool = [i for i, m in enumerate(mask) if m == 0 and i >= prompt]
    assert tok.decode([ids[i] for i in tool]) == "42>>"
    plain = {"prompt": "Q\n", "solution": "6 * 7 = 42"}
    ((ids2, mask2),) = encode_rows([plain], tok, 512, "response")
    assert mask2 == [0] * prompt + [1] * (len(ids2) - prompt)  # no annotation: every target token trained on
