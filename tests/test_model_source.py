"""Your model as you have it: `model.path` (and `fbrl convert`) take a Hugging Face Hub id, served from the local
cache with HF_HUB_OFFLINE=1, and a stock checkpoint is converted when the job starts (identity init: it starts
exactly at the stock model), printed and recorded in the run directory. A tiny random stock Qwen3 with the demo's
tokenizer, laid out in a Hub cache built here (no downloads)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY_ARITH
from test_faults_async import local_args
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from actors.cli import main

DEMO = TINY_ARITH
REPO = "acme/tiny-qwen3"


def hub_cache(root: Path, repo: str, files_from: Path, kind: str = "models") -> Path:
    """`root` laid out as huggingface_hub's cache holding `repo` at one revision, with the files of `files_from`."""
    entry = root / f"{kind}--{repo.replace('/', '--')}"
    snap = entry / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(files_from, snap)
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(snap.name)
    return snap


@pytest.fixture
def stock_qwen3(tmp_path):
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        max_position_embeddings=256,
    )
    out = tmp_path / "stock"
    Qwen3ForCausalLM(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(DEMO).save_pretrained(out)
    return out


@pytest.fixture
def offline_cache(tmp_path, monkeypatch, stock_qwen3):
    cache = tmp_path / "hf-cache"
    hub_cache(cache, REPO, stock_qwen3)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_train_on_a_hub_id_of_a_stock_model_converts_it_and_trains(tmp_path, offline_cache, capsys):
    # a random model never answers right: a reward that varies with the completion gives the steps a signal
    (tmp_path / "by_length.py").write_text(
        "def by_length(prompts, completions, answers, **_):\n    return [len(c) % 3 / 2 for c in completions]\n"
    )
    reward = f"reward.fns=[{{fn: {tmp_path / 'by_length.py'}:by_length}}]"
    args = local_args(tmp_path, f"model.path={REPO}", "train.steps=2", reward, "reward.accuracy=none")
    assert main(args) == 0
    out = capsys.readouterr().out
    run = tmp_path / "run"
    base = run / "base_model"
    assert "is a stock Qwen3ForCausalLM checkpoint: converted to an FBT (linear_addition, " in out
    assert json.loads((base / "conversion.json").read_text())["init"] == "identity"
    assert json.loads((base / "config.json").read_text())["architectures"] == ["FBTQwen3ForCausalLM"]
    saved = (run / "config.yaml").read_text()
    assert f"path: {base}" in saved  # the run names the converted checkpoint: --resume loads it as it is
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert json.loads((run / "policy" / "config.json").read_text())["architectures"] == ["FBTQwen3ForCausalLM"]


def test_a_hub_id_missing_from_the_cache_offline_is_refused_naming_the_key(tmp_path, offline_cache, capsys):
    args = local_args(tmp_path, "model.path=acme/not-cached", "train.steps=1")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert (
        "model.path: checkpoint not found: " in err and "acme/not-cached is not in the local Hugging Face cache" in err
    )
    assert "HF_HUB_OFFLINE=1" in err
    assert not (tmp_path / "run").exists()


def test_fbrl_convert_takes_a_hub_id(tmp_path, offline_cache):
    out = tmp_path / "fbt"
    assert main(["convert", REPO, str(out), "--init", "identity"]) == 0
    assert json.loads((out / "config.json").read_text())["architectures"] == ["FBTQwen3ForCausalLM"]
    assert (out / "tokenizer.json").is_file()


def test_an_unsupported_stock_model_is_refused_naming_the_supported_backbones(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=101, n_embd=32, n_layer=1, n_head=2)).save_pretrained(gpt2)
    assert main(local_args(tmp_path, f"model.path={gpt2}", "train.steps=1")) == 2
    err = capsys.readouterr().err
    assert "model_type 'gpt2'" in err and "supported backbones: llama, qwen2, qwen3, mistral" in err, err
