"""Your data as you have it: rows from JSON lines, a JSON file, parquet, CSV, a `save_to_disk` directory or a Hub
dataset (served from a local cache with HF_HUB_OFFLINE=1), with dotted fields into nested columns, a chat in the
prompt column (verl's and TRL's layout) and optional answers — required, with an error naming the reward and the
row, only when a reward needs them."""

from __future__ import annotations

import csv
import json

import pytest
from test_model_source import hub_cache

from rl.config import DataConfig, load_config
from rl.data.jsonl import DataError
from rl.data.loaders import load_rows, load_task_split

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
VERL_ROWS = [  # verl's parquet layout (its gsm8k preprocessing), as a verl user has it on disk
    {
        "data_source": "openai/gsm8k",
        "prompt": CHAT,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "5"},
        "extra_info": {"split": "train", "index": 0},
    },
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "What is 7-4?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "3"},
        "extra_info": {"split": "train", "index": 1},
    },
]
VERL_FIELDS = dict(prompt_field="prompt", answer_field="reward_model.ground_truth")


def write_parquet(rows, path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_verl_parquet_chat_prompts_and_nested_ground_truth(tmp_path):
    write_parquet(VERL_ROWS, tmp_path / "train.parquet")
    rows = load_rows("parquet", tmp_path / "train.parquet", **VERL_FIELDS)
    assert [r["answer"] for r in rows] == ["5", "3"]
    assert rows[0]["messages"] == CHAT and "prompt" not in rows[0]  # a chat: rendered with the template later
    assert rows[0]["data_source"] == "openai/gsm8k" and rows[1]["extra_info"]["index"] == 1  # columns ride along


def test_json_and_csv_files(tmp_path):
    (tmp_path / "rows.json").write_text(json.dumps({"data": [{"q": "1+1?", "a": 2}, {"q": "2+2?", "a": 4}]}))
    with open(tmp_path / "rows.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["question", "answer", "level"])
        w.writeheader()
        w.writerows([{"question": "3+3?", "answer": "6", "level": "1"}])
    assert [r["answer"] for r in load_rows("json", tmp_path / "rows.json", prompt_field="q", answer_field="a")] == [
        "2",
        "4",
    ]
    row = load_rows("csv", tmp_path / "rows.csv", prompt_field="question")[0]
    assert row["prompt"] == "3+3?" and row["answer"] == "6" and row["level"] == "1"
    (tmp_path / "bad.json").write_text('{"a": 1}')
    with pytest.raises(DataError, match=r"bad.json: expected a list of rows"):
        load_rows("json", tmp_path / "bad.json")


def test_answers_are_optional_unless_a_reward_needs_them(tmp_path):
    p = tmp_path / "judge.jsonl"
    p.write_text('{"prompt": "Write a haiku."}\n{"prompt": "Write a limerick."}\n')
    rows = load_rows("jsonl", p, answer_needed_by=None)
    assert [r["answer"] for r in rows] == [None, None]
    with pytest.raises(DataError, match=r"judge.jsonl:1: missing field 'answer', which reward.fns\[0\] \(the math"):
        load_rows("jsonl", p, answer_needed_by=load_config(None).reward.answer_needed_by())
    judged = load_config(None, ["reward.fns=[{fn: format}]", "reward.accuracy=auto"])
    assert judged.reward.answer_needed_by() is None


def test_a_hub_dataset_from_the_local_cache_offline(tmp_path, monkeypatch):
    """A dataset repository on the Hub (parquet files per split under data/, a `main` config as on the Hub)
    resolved from the cache with HF_HUB_OFFLINE=1: what a TRL or verl user names by id."""
    files = tmp_path / "repo"
    write_parquet(VERL_ROWS, files / "main" / "train-00000-of-00001.parquet")
    write_parquet(VERL_ROWS[:1], files / "main" / "test-00000-of-00001.parquet")
    (files / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n    path: main/train-*\n"
        "  - split: test\n    path: main/test-*\n---\n"
    )
    cache = tmp_path / "hf-cache"
    hub_cache(cache, "acme/word-math", files, kind="datasets")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    data = DataConfig(task="hub", train_path="acme/word-math", hub_config="main", chat_template="off", **VERL_FIELDS)
    train, test = load_task_split(data, "train"), load_task_split(data, "test")
    assert [r["answer"] for r in train] == ["5", "3"] and len(test) == 1
    assert train[0]["prompt"] == "Be brief.\n\nWhat is 2+3?\n"  # the chat as plain text (chat_template off)
    with pytest.raises(DataError, match=r"acme/word-math \(data.hub_config=main, split 'dev'\)"):
        load_task_split(
            DataConfig(task="hub", train_path="acme/word-math", hub_config="main", train_split="dev"), "train"
        )
    with pytest.raises(Exception, match=r"data.train_path: acme/elsewhere is not in the local Hugging Face cache"):
        load_task_split(DataConfig(task="hub", train_path="acme/elsewhere"), "train")


def test_eval_and_compare_likelihood_read_the_same_sources(tmp_path):
    """`fbrl eval` and `fbrl compare-likelihood` take the config's data options: here verl's parquet layout with a
    chat prompt and the answer nested in reward_model.ground_truth, read with --prompt-field / --answer-field."""
    from pathlib import Path

    from actors.cli import main

    ckpt = Path(__file__).resolve().parent.parent / "checkpoints" / "tiny-arith"
    rows = [
        {"prompt": [{"role": "user", "content": f"{i}+{i}="}], "reward_model": {"ground_truth": str(2 * i)}}
        for i in range(1, 5)
    ]
    write_parquet(rows, tmp_path / "test.parquet")
    data = ["--task", "parquet", "--data-path", str(tmp_path / "test.parquet"), "--chat-template", "off"]
    fields = ["--answer-field", "reward_model.ground_truth"]
    out = tmp_path / "eval.json"
    argv = ["eval", "--checkpoint", str(ckpt), *data, *fields, "--n", "4", "--decode-mode", "soft", "--samples", "0"]
    assert main([*argv, "--scorer", "plain", "--threads", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["meta"]["n"] == 4 and report["meta"]["task"] == "parquet" and "soft" in report["modes"]
    cmp = tmp_path / "cmp.json"
    argv = ["compare-likelihood", "--checkpoint", str(ckpt), *data, "--n-samples", "3", "--max-passes", "2"]
    assert main([*argv, "--max-tokens", "4", "--json", str(cmp)]) == 0
    assert json.loads(cmp.read_text())["n_samples"] == 3
    with pytest.raises(SystemExit, match=r"fbrl eval: .*test.parquet: row 0: missing field 'answer', which the math"):
        main(["eval", "--checkpoint", str(ckpt), *data, "--n", "4", "--decode-mode", "soft", "--samples", "0"])
