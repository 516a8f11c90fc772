"""rl.data: arithmetic task (determinism, disjoint splits), char tokenizer, loaders, resumable sampler."""

import importlib.util
import json

import pytest

from rl.config import ConfigError, DataConfig, config_from_dict
from rl.data import arith
from rl.data.jsonl import DataError, read_jsonl, write_jsonl
from rl.data.loaders import PromptSampler, load_jsonl, load_rows, load_task_split

ALL = (1, 2, 3, 4)


def test_generation_is_deterministic_and_seeded():
    a = arith.generate("train", 300, seed=1, difficulties=ALL)
    assert a == arith.generate("train", 300, seed=1, difficulties=ALL)
    assert a[:100] == arith.generate("train", 100, seed=1, difficulties=ALL)  # a prefix, not a reshuffle
    assert a != arith.generate("train", 300, seed=2, difficulties=ALL)


def test_rows_are_well_formed_and_short():
    for row in arith.generate("val", 400, seed=0, difficulties=ALL):
        assert set(row) >= {"prompt", "answer", "solution", "difficulty"}
        assert row["prompt"].endswith("Put the answer in \\boxed{}.\nA:") and len(row["prompt"]) <= 60
        assert row["solution"].endswith(f"\\boxed{{{row['answer']}}}")
        assert int(row["answer"]) == eval(row["question"])  # Python's precedence is the task's
        assert row["question"].count("+") + row["question"].count("*") + row["question"].count("-") == row["difficulty"]
        assert arith.score(row["solution"], row["answer"]) == 1.0
    assert arith.score("... \\boxed{3}", "4") == 0.0 and arith.score("4", "4") == 0.0


def test_worked_solution_format():
    import random

    class Fixed(random.Random):  # drives make_problem to 37+5*3
        seq = iter(["+", "*", 37, 5, 3])

        def choice(self, s):
            return next(self.seq)

        def randint(self, a, b):
            return next(self.seq)

    row = arith.make_problem(Fixed(), 2)
    assert row["prompt"] == "Q: 37+5*3=? Put the answer in \\boxed{}.\nA:"
    assert row["solution"] == " 5*3=15, 37+15=52. \\boxed{52}" and row["answer"] == "52"


def test_direct_answer_mixture():
    worked = arith.generate("train", 2000, seed=0, difficulties=(1, 2))
    mixed = arith.generate("train", 2000, seed=0, difficulties=(1, 2), direct_answer_frac=0.7)
    # the same problems, only the solution text differs; the choice is a function of the question
    assert [r["question"] for r in mixed] == [r["question"] for r in worked]
    direct = [m["solution"] == f" \\boxed{{{m['answer']}}}" for m in mixed]
    assert 0.66 < sum(direct) / len(direct) < 0.74
    for m, w, d in zip(mixed, worked, direct):
        assert m["solution"] == (f" \\boxed{{{w['answer']}}}" if d else w["solution"])
        assert arith.score(m["solution"], m["answer"]) == 1.0
    assert all("=" in w["solution"] for w in worked)  # the default keeps every worked solution
    cfg = DataConfig(difficulty=[1, 2], direct_answer_frac=0.7, num_train=2000)
    assert load_task_split(cfg, "train") == mixed
    with pytest.raises(ConfigError, match="direct_answer_frac"):
        config_from_dict({"data": {"direct_answer_frac": 1.5}})


def test_test_split_never_in_train():
    train = arith.generate("train", 20000, seed=0, difficulties=ALL)
    test = arith.generate("test", 500, seed=0, difficulties=ALL)
    val = arith.generate("val", 500, seed=0, difficulties=ALL)
    h = lambda rows: {arith.problem_hash(r["question"]) for r in rows}  # noqa: E731
    assert len(h(test)) == 500 and len(h(val)) == 500  # held-out splits have no repeats
    assert not h(test) & h(train) and not h(val) & h(train) and not h(test) & h(val)
    # by construction: even another seed's train never contains this test set
    assert not h(test) & h(arith.generate("train", 5000, seed=7, difficulties=ALL))


def test_small_space_runs_out_loudly():
    with pytest.raises(ValueError, match="distinct test problems"):
        arith.generate("test", 1000, difficulties=(1,))


def test_tokenizer_round_trip_and_autotokenizer(tmp_path):
    from transformers import AutoTokenizer

    from rl.data.tokenizer import save_tokenizer

    tok = save_tokenizer(tmp_path / "tok")
    assert len(tok) <= 128 and (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert (loaded.pad_token, loaded.bos_token, loaded.eos_token, loaded.unk_token) == (
        "<pad>",
        "<bos>",
        "<eos>",
        "<unk>",
    )
    texts = [r["prompt"] + r["solution"] for r in arith.generate("test", 50, difficulties=ALL)]
    texts += ["  spaces  .  , ;\t{}\\^_ ~`'\"|\n\nend ", "What is 37 + 5 * 3? (-12) [x] #1 @a $b %c &d"]
    for t in (tok, loaded):
        for x in texts:
            bare = t.encode(x, add_special_tokens=False)
            assert len(bare) == len(x) and 3 not in bare  # one token per character, nothing unknown
            assert t.decode(bare) == x
            ids = t(x)["input_ids"]
            assert ids[0] == t.bos_token_id and ids[1:] == bare
            assert t.decode(ids, skip_special_tokens=True) == x
    assert loaded.encode("é", add_special_tokens=False) == [loaded.unk_token_id]


def test_load_tokenizer_is_autotokenizer_without_its_imports(tmp_path):
    """A checkpoint's own tokenizer is loaded by its class name: the same tokenizer AutoTokenizer gives (class,
    vocabulary, special tokens, settings, ids), without importing torch or the model classes in a driver."""
    import subprocess
    import sys

    from transformers import AutoTokenizer, PreTrainedConfig

    from rl.data.tokenizer import build_tokenizer, load_tokenizer

    chat = build_tokenizer()  # with a chat template, which save_pretrained writes to a file of its own
    chat.chat_template = "{% for m in messages %}<bos>{{ m['content'] }}<eos>{% endfor %}"
    chat.save_pretrained(str(tmp_path / "chat"))
    for path in ("checkpoints/tiny-arith", "checkpoints/tiny-cups", str(tmp_path / "chat")):
        ours, auto = load_tokenizer(path), AutoTokenizer.from_pretrained(path, config=PreTrainedConfig())
        assert type(ours) is type(auto) and ours.get_vocab() == auto.get_vocab()
        assert ours.special_tokens_map == auto.special_tokens_map and ours.all_special_ids == auto.all_special_ids
        assert (ours.model_max_length, ours.padding_side, ours.chat_template) == (
            auto.model_max_length,
            auto.padding_side,
            auto.chat_template,
        )
        text = "Q: 12+3*4=? Put the answer in \\boxed{}.\nA: é"
        assert ours(text)["input_ids"] == auto(text)["input_ids"]
        if ours.chat_template:
            talk = [{"role": "user", "content": text}]
            assert ours.apply_chat_template(talk, tokenize=False) == auto.apply_chat_template(talk, tokenize=False)
    assert ours.chat_template  # the last one's template was read back
    probe = "import sys; from rl.data.tokenizer import load_tokenizer; load_tokenizer('checkpoints/tiny-arith'); "
    probe += "print(sorted(m for m in ('torch', 'transformers.modeling_utils') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_jsonl_write_read_and_errors_name_file_line(tmp_path):
    rows = arith.generate("val", 20, difficulties=ALL)
    p = tmp_path / "val.jsonl"
    write_jsonl(rows, p)
    assert read_jsonl(p) == rows
    loaded = load_jsonl(p)
    assert [r["prompt"] for r in loaded] == [r["prompt"] for r in rows]

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b", "answer": \n')
    with pytest.raises(DataError, match=r"bad\.jsonl:3: invalid JSON"):
        load_jsonl(bad)
    bad.write_text('{"prompt": "a", "answer": "1"}\n[1, 2]\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: expected a JSON object"):
        load_jsonl(bad)
    bad.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:3: missing field 'answer'"):
        load_jsonl(bad)


def test_custom_fields_and_numeric_answers(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text("\n".join(json.dumps({"problem": f"q{i}", "solution": i, "level": 2}) for i in range(3)))
    rows = load_jsonl(p, prompt_field="problem", answer_field="solution")
    assert rows[1]["prompt"] == "q1" and rows[1]["answer"] == "1" and rows[1]["level"] == 2


def test_load_task_split_from_config(tmp_path):
    data = DataConfig(difficulty=[1, 2], num_train=50, seed=3)
    assert load_task_split(data, "train") == arith.generate("train", 50, seed=3, difficulties=(1, 2))
    assert len(load_task_split(data, "test", n=10)) == 10
    p = tmp_path / "t.jsonl"
    write_jsonl([{"prompt": "p", "answer": 1}] * 5, p)
    rows = load_task_split(DataConfig(task="jsonl", train_path=str(p), test_path=str(p)), "test", n=2)
    assert rows == [{"prompt": "p", "answer": "1"}] * 2


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None, reason="pyarrow not installed")
def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": 2}]), p)
    assert [r["answer"] for r in load_rows("parquet", p)] == ["1", "2"]
    with pytest.raises(DataError, match="row 0: missing field 'q'"):
        load_rows("parquet", p, prompt_field="q")


@pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="datasets not installed")
def test_hf_disk(tmp_path):
    import datasets

    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([{"prompt": "a", "answer": "1"}]),
            "test": datasets.Dataset.from_list([{"prompt": "b", "answer": "2"}]),
        }
    )
    dd.save_to_disk(str(tmp_path / "ds"))
    assert load_rows("hf_disk", tmp_path / "ds", "test")[0]["prompt"] == "b"
    assert load_rows("hf_disk", tmp_path / "ds" / "train")[0]["answer"] == "1"  # a single Dataset dir
    with pytest.raises(DataError, match="no split 'dev'"):
        load_rows("hf_disk", tmp_path / "ds", "dev")


def test_sampler_epochs_and_resume_equivalence():
    rows = [{"prompt": str(i), "answer": str(i)} for i in range(10)]
    full = PromptSampler(rows, seed=5)
    stream = [full.next(4) for _ in range(8)]  # 32 draws: crosses three epoch boundaries
    flat = [r["prompt"] for batch in stream for r in batch]
    assert sorted(flat[:10]) == sorted(flat[10:20]) == [str(i) for i in range(10)]  # each epoch a permutation
    assert flat[:10] != flat[10:20]  # reshuffled per epoch

    first = PromptSampler(rows, seed=5)
    for _ in range(3):
        first.next(4)
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint as JSON
    resumed = PromptSampler(rows, seed=5)
    resumed.load_state_dict(state)
    assert [resumed.next(4) for _ in range(5)] == stream[3:]

    with pytest.raises(DataError, match="num_rows was 10, now 9"):
        PromptSampler(rows[:9], seed=5).load_state_dict(state)
    with pytest.raises(DataError, match="seed"):
        PromptSampler(rows, seed=6).load_state_dict(state)


def test_task_names_are_one_registry():
    """rl/data/tasks.py's table names every task once: the schema accepts exactly its names (an unknown one is
    refused naming them all), and its state-tracking entries are the ones track.py defines."""
    from rl.data import tasks, track

    assert {n for n, t in tasks.TASKS.items() if t.scorer is not None} == set(track.TRACKING_RULES)
    assert set(tasks.TASKS) == set(tasks.generated_tasks()) | set(tasks.file_tasks())
    for name, task in tasks.TASKS.items():
        config_from_dict({"data": {"task": name, "train_path": None if task.generated else "rows.jsonl"}})
    with pytest.raises(ConfigError, match="data.task: expected one of arith, word_problems, cups"):
        config_from_dict({"data": {"task": "arithmetic"}})


def test_a_new_task_is_one_entry(monkeypatch, capsys):
    """One entry in the table, and the config, the loaders, `fbrl eval`'s choices and help, its scorer and the
    math reward's strictness all know the task."""
    from actors.cli import main
    from actors.cli.evaluate import _scorer
    from actors.reward_workers import _math_options
    from rl.data import tasks

    def doubling_rows(data, split, n):
        return [{"prompt": f"Q: 2 x {i + 10 * data.seed}\nA:", "answer": str(2 * i)} for i in range(n)]

    def exact(prompts, completions, answers, **_):
        return [float(c.strip() == a) for c, a in zip(completions, answers)]

    entry = tasks.Task("doubling numbers", doubling_rows, 3, "levels", (1,), strict_math=True, scorer=exact)
    monkeypatch.setitem(tasks.TASKS, "doubling", entry)

    data = config_from_dict({"data": {"task": "doubling", "difficulty": [1, 3]}}).data
    assert [r["answer"] for r in load_task_split(data, "test", 4)] == ["0", "2", "4", "6"]
    with pytest.raises(ConfigError, match="data.difficulty: expected a non-empty list of levels in 1..3"):
        config_from_dict({"data": {"task": "doubling", "difficulty": [4]}})
    assert _scorer("auto", "doubling") is exact
    assert _math_options({"fn": "math"}, config_from_dict({}).reward, "doubling")["options"]["strict"] is True
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "doubling: doubling numbers" in help_text and "doubling}" in help_text
