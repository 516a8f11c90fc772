"""docs/QUICKSTART.md's commands, run as written (each ```bash block in order, from a directory holding the
repository's configs), against a Hugging Face cache filled here with tiny stand-ins for the two Hub ids it names
(HuggingFaceTB/SmolLM2-135M-Instruct: the demo checkpoint's backbone saved as a stock Llama, with its tokenizer and a
chat template, so that some answers are right and the steps have a signal;
openai/gsm8k: arithmetic problems in GSM8K's layout, `question` and a worked `answer` ending in `#### N`),
offline (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from test_data_sources import write_parquet
from test_model_source import hub_cache
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

import rl.model  # noqa: F401  (the demo checkpoint is an FBT)
from rl.data import arith

DOC = ROOT / "docs" / "QUICKSTART.md"
TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"  # the demo's own prompt format


def fill_cache(cache: Path, scratch: Path) -> None:
    model, demo = scratch / "smollm", ROOT / "checkpoints" / "tiny-arith"
    fbt = AutoModelForCausalLM.from_pretrained(demo, dtype=torch.float32)
    fields = {k: v for k, v in fbt.config.to_dict().items() if not k.startswith("fbt_")}
    fields.pop("model_type", None), fields.pop("architectures", None)
    stock = LlamaForCausalLM(LlamaConfig(**fields))
    stock.load_state_dict({k: v for k, v in fbt.state_dict().items() if not k.startswith("fusion.")})
    stock.save_pretrained(model)
    tok = AutoTokenizer.from_pretrained(demo)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(model)
    hub_cache(cache, "HuggingFaceTB/SmolLM2-135M-Instruct", model)
    data = scratch / "gsm8k"
    for split in ("train", "test"):
        rows = [
            {"question": r["prompt"], "answer": f"Work it out.\n#### {r['answer']}"}
            for r in arith.generate(split, 40, seed=0, difficulties=(1,))
        ]
        write_parquet(rows, data / "main" / f"{split}-00000-of-00001.parquet")
    (data / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n    path: main/train-*\n"
        "  - split: test\n    path: main/test-*\n---\n"
    )
    hub_cache(cache, "openai/gsm8k", data, kind="datasets")


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, re.S)


@pytest.mark.slow  # (~1.5 min: five fbrl processes; each path is also in CI through test_model_source / _data_sources)
def test_the_quickstart_runs_as_written(tmp_path):
    blocks = bash_blocks(DOC.read_text())
    assert len(blocks) == 5
    work = tmp_path / "work"
    work.mkdir()
    (work / "configs").symlink_to(ROOT / "configs")
    fill_cache(tmp_path / "hf-cache", tmp_path / "repos")
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        HF_HUB_CACHE=str(tmp_path / "hf-cache"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_CACHE=str(tmp_path / "datasets-cache"),
        WANDB_MODE="offline",
        PYTHONPATH=str(ROOT),
    )
    for block in blocks:
        run = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block], cwd=work, env=env, capture_output=True, text=True, timeout=600
        )
        assert run.returncode == 0, f"{block}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert "path: HuggingFaceTB/SmolLM2-135M-Instruct" in (work / "resolved.yaml").read_text()
    quick = work / "runs" / "quickstart"
    assert (quick / "policy" / "model.safetensors").is_file() and (quick / "base_model" / "conversion.json").is_file()
    steps = [json.loads(x)["step"] for x in (quick / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]  # the held-out eval before training, then the three steps
    assert "brevity" in (work / "runs" / "quickstart-reward" / "metrics.jsonl").read_text()
