"""The pieces of the stock-model → FBT recipe (scripts/smollm_fbt.py) that run without the real model: GSM8K rows in
the word problems' chat format, the fusion's own learning rate and the frozen backbone of `fbrl pretrain`, the
channel measurements of the card (rl/report/channel_card.py) and the paired difference of the RL comparison.

Tolerances (fp32, tiny models): an identity fusion (RMS epsilon 1e-12) changes log-probs by rounding only
(tests/test_identity.py measures ≤ 2e-6); K passes reproduce the exact recurrence on the first K−1 fed-back
positions to rounding (tests/test_likelihood.py): 1e-5 keeps a margin over both.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import rl.model  # noqa: F401
import rl.pretrain.trainer as P
from rl.config import load_config
from rl.data import gsm8k
from rl.data.jsonl import DataError
from rl.model import IDENTITY_RMS_EPS
from rl.report.channel_card import MAX_PASSES, channel_report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
TOL = 1e-5

GSM = [
    {
        "question": f"Natalia sold {n} clips in April and half as many in May. How many in all?",
        "answer": f"In May she sold {n}/2 = <<{n}/2={n // 2}>>{n // 2} clips.\nIn all {n}+{n // 2} = "
        f"<<{n}+{n // 2}={n + n // 2}>>{n + n // 2}.\n#### {n + n // 2:,}",
    }
    for n in range(2, 4000, 2)
]


def write_gsm(tmp_path, rows=GSM):
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_rows_are_chat_rows_with_boxed_solutions(tmp_path):
    path = write_gsm(tmp_path)
    splits = {s: gsm8k.rows_from_file(path, s) for s in ("train", "val", "test")}
    questions = [{r["question"] for r in rows} for rows in splits.values()]
    assert sum(map(len, questions)) == len(GSM)  # every row in exactly one split
    assert not (questions[0] & questions[1] or questions[0] & questions[2] or questions[1] & questions[2])
    assert 0.05 < len(splits["test"]) / len(GSM) < 0.15
    row = next(r for rows in splits.values() for r in rows if r["question"].startswith("Natalia sold 3000 "))
    assert row["answer"] == "4500"  # thousands separator dropped
    assert row["solution"] == "In May she sold 3000/2 = 1500 clips.\nIn all 3000+1500 = 4500.\n\\boxed{4500}"
    assert row["messages"][-1] == {"role": "user", "content": row["question"]}
    assert row["messages"][0]["role"] == "system" and len(row["messages"]) == 6  # instruction, 2 worked examples
    assert len(gsm8k.rows_from_file(path, "train", shots=0)[0]["messages"]) == 2


def test_gsm8k_errors_name_the_line(tmp_path):
    bad = write_gsm(tmp_path, GSM[:3] + [{"question": "q?", "answer": "no final line"}])
    with pytest.raises(DataError, match=r"gsm8k.jsonl:4: .*'#### N'"):
        for split in ("train", "val", "test"):
            gsm8k.rows_from_file(bad, split)
    with pytest.raises(DataError, match="no such file.*load_dataset"):
        gsm8k.rows_from_file(tmp_path / "missing.jsonl", "train")


def tiny(fusion_mode="gate_product", overrides=()):
    cfg = load_config(
        None,
        [
            "model.path=null",
            f"model.fusion_mode={fusion_mode}",
            "model.init={backbone: llama, hidden_size: 64, num_layers: 2, num_heads: 1, num_kv_heads: 1, "
            "intermediate_size: 128}",
            *overrides,
        ],
    )
    torch.manual_seed(0)
    model, tok = P.load_model_and_tokenizer(cfg)
    return cfg, model, tok


def test_fusion_lr_and_frozen_backbone():
    cfg, model, _ = tiny(overrides=["pretrain.lr=1e-5", "pretrain.fusion_lr=1e-3"])
    groups = P.param_groups(model, cfg.pretrain)
    fusion = {id(q) for q in model.fusion.parameters()}
    assert [g["lr"] for g in groups if {id(q) for q in g["params"]} == fusion] == [1e-3]
    assert all("lr" not in g for g in groups if not {id(q) for q in g["params"]} & fusion)

    cfg, model, _ = tiny(overrides=["pretrain.train_backbone=false"])
    groups = P.param_groups(model, cfg.pretrain)
    assert [id(q) for g in groups for q in g["params"]] == [id(q) for q in model.fusion.parameters()]
    assert not any(q.requires_grad for n, q in model.named_parameters() if not n.startswith("fusion."))


ROWS = [{"prompt": f"Q: {i}+{i + 3}=?", "solution": f" {2 * i + 3}"} for i in range(10, 16)]  # 3-4 fed tokens


def test_channel_report_is_zero_at_the_identity_point():
    _, model, tok = tiny("linear_addition")
    P.identity_fusion_(model)
    model.fusion.eps = IDENTITY_RMS_EPS
    r = channel_report(model, ROWS, tok, batch_size=4)
    assert r["policy_shift"] < TOL and abs(r["exact_minus_pass1"]) < TOL
    assert max(r["kpass_logprob_error"]) < TOL and r["state_share"] == 0.0
    assert abs(r["state_information"]) < TOL  # the state is not read at all


def test_channel_report_kpass_reaches_the_exact_recurrence():
    _, model, tok = tiny("gate_product")  # random fusion: the state replaces the input, big effects
    r = channel_report(model, ROWS, tok, batch_size=4)
    err = r["kpass_logprob_error"]
    assert len(err) == MAX_PASSES and err[-1] < TOL  # 8 passes are exact on responses of <= 7 fed tokens
    assert err[0] > 1e-3 and r["policy_shift"] == pytest.approx(err[0], rel=1e-4)
    assert abs(r["state_information"]) > 1e-3  # a random fusion reads the state: order matters
    lo, hi = r["exact_minus_pass1_ci95"]
    assert lo <= r["exact_minus_pass1"] <= hi


def test_paired_difference():
    from scripts.smollm_fbt_rl import paired_difference

    d = paired_difference([1, 1, 0, 0] * 25, [1, 1, 1, 0] * 25)
    assert d["diff_points"] == pytest.approx(25.0) and d["b_only"] == 25 and d["a_only"] == 0
    assert d["ci95_points"][0] < 25 < d["ci95_points"][1] and d["p_value"] < 1e-6
