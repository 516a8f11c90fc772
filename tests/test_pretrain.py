"""Multi-pass pretraining (rl/pretrain/trainer.py): the objective, no-detach gradients, the pass schedule, a short run.

The short runs train on a copy task (a random 8-letter string, `|`, the same string): copying needs an
induction match (find where the current letter occurred, emit the letter after it), which a one-layer
transformer cannot do in one pass but can with feedback, because pass 2's input at position t carries pass 1's
state of position t-1, i.e. the previous letter. So pass-2 < pass-1 shows up clearly
after ~150 steps (a few seconds on an idle core).
"""

import json
import random

import pytest
import torch

import rl.model  # noqa: F401
import rl.pretrain.trainer as P
from rl.config import load_config
from rl.data.tokenizer import build_tokenizer


def tiny_model(layers=2, seed=0):
    cfg = load_config(
        None,
        [
            "model.path=null",
            f"pretrain.seed={seed}",
            f"model.init={{backbone: llama, hidden_size: 64, num_layers: {layers}, num_heads: 1, "
            "num_kv_heads: 1, intermediate_size: 128}",
        ],
    )
    return P.load_model_and_tokenizer(cfg)


def toy_batch(tok, n=4):
    rows = [{"prompt": f"Q: {i}+{i + 3}=?", "solution": f" {2 * i + 3}. \\boxed{{{2 * i + 3}}}"} for i in range(n)]
    return P.collate_documents(P.encode_rows(rows, tok, 64, "response"), tok.pad_token_id)


def hand_ce(model, hidden, ids, mask):
    """Cross-entropy written out: log-softmax of the full logits, gather the next token, masked mean."""
    logp = torch.log_softmax(model.logits_from_hidden(hidden)[:, :-1].float(), -1)
    nll = -logp.gather(-1, ids[:, 1:, None])[..., 0]
    m = mask[:, 1:].float()
    return (nll * m).sum() / m.sum()


def test_encode_masks_only_the_response():
    tok = build_tokenizer()
    ((ids, mask),) = P.encode_rows([{"prompt": "Q: 1+2=?", "solution": " 3"}], tok, 64, "response")
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert tok.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=True) == " 3"
    ((_, mask_all),) = P.encode_rows([{"prompt": "Q: 1+2=?", "solution": " 3"}], tok, 64, "all")
    assert all(mask_all)


def test_objective_is_l1_plus_mean_of_later_passes():
    model, tok = tiny_model()
    ids, am, lm = toy_batch(tok)
    for k in (1, 2, 3):
        total, losses = P.multipass_loss(model, ids, am, lm, k)
        hidden = model.multipass_forward(ids, k, attention_mask=am).hidden
        by_hand = [hand_ce(model, h, ids, lm) for h in hidden]
        expect = by_hand[0] + (sum(by_hand[1:]) / (k - 1) if k > 1 else 0)
        assert torch.allclose(total, expect, atol=1e-5), (k, total, expect)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(losses, by_hand))
    assert losses[1] != losses[0]  # pass 2 really differs (feedback on)


def test_exact_loss_is_the_limit_of_enough_passes():
    """With feedback on the response only, pass k is exact on the first k-1 response positions, so K = R + 1
    passes (R = longest response) give the exact recurrence: same L_exact, same gradient. fp32, and the two
    differ only in summation order (token-by-token KV cache vs one parallel pass): 1e-5 absolute on losses of
    order 1 and on gradients of order 1e-1 leaves two orders of magnitude over the ~1e-7 seen."""
    model, tok = tiny_model()
    ids, am, lm = toy_batch(tok, n=8)  # prompts and answers of different lengths: right padding matters
    assert len(set(am.sum(1).tolist())) > 1
    R = int(lm.sum(1).max())
    lex, parts = P.exact_loss(model, ids, am, lm, "response")
    _, losses = P.multipass_loss(model, ids, am, lm, R + 1, feedback_on="response")
    assert parts == [lex]
    assert torch.allclose(lex, losses[-1], atol=1e-5), (lex, losses[-1])
    assert (lex - losses[1]).abs() > 1e-4  # two passes are not the recurrence: the comparison can fail
    params = [p for n, p in model.named_parameters() if "layers.0.self_attn.q_proj" in n or "fusion.w_u" in n]
    g_exact = torch.autograd.grad(lex, params)
    g_pass = torch.autograd.grad(losses[-1], params)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g_exact, g_pass))
    assert all(a.abs().sum() > 0 for a in g_exact)  # the fusion weights learn through time


def test_exact_steps_are_drawn_per_step_with_a_seed():
    p = load_config(None, ["pretrain.exact_prob=0.3"]).pretrain
    draws = [P.exact_step(s, p) for s in range(2000)]
    assert 0.26 < sum(draws) / len(draws) < 0.34
    assert draws[:300] == [P.exact_step(s, p) for s in range(300)]
    assert not any(P.exact_step(s, load_config(None, []).pretrain) for s in range(300))  # default: never
    with pytest.raises(Exception, match="exact_prob"):
        load_config(None, ["pretrain.exact_prob=1.5"])


def test_gradient_flows_through_every_pass():
    """L_2's gradient must reach pass 1's computation: it differs from the gradient with pass 1 detached."""
    model, tok = tiny_model()
    ids, am, lm = toy_batch(tok)
    params = [p for n, p in model.named_parameters() if "layers.0.self_attn.q_proj" in n]
    _, losses = P.multipass_loss(model, ids, am, lm, 2)
    full = torch.autograd.grad(losses[1], params)
    hidden = model.multipass_forward(ids, 2, attention_mask=am, no_grad_until_last=True).hidden
    detached = torch.autograd.grad(hand_ce(model, hidden[-1], ids, lm), params)
    assert all(torch.isfinite(g).all() for g in full)
    assert any((a - b).abs().max() > 1e-6 for a, b in zip(full, detached))
    # and the fusion weights get a gradient from the objective
    total, _ = P.multipass_loss(model, ids, am, lm, 3)
    total.backward()
    assert model.fusion.w_u.weight.grad.abs().sum() > 0 and model.fusion.w_g.weight.grad.abs().sum() > 0


def test_boundaries_schedule_gives_k_by_step_fraction():
    p = load_config(None, ["pretrain.steps=100"]).pretrain  # default [[0.75,1],[0.97,2],[1.0,3]]
    ks = [P.passes_for_step(s, 100, p) for s in range(100)]
    assert ks.count(1) == 75 and ks.count(2) == 22 and ks.count(3) == 3
    assert ks[74] == 1 and ks[75] == 2 and ks[96] == 2 and ks[97] == 3 and ks[99] == 3
    assert ks == sorted(ks)
    assert P.max_passes(p) == 3


def test_mixture_schedule_respects_probabilities_and_is_seeded():
    p = load_config(None, ["pretrain.schedule=mixture", "pretrain.mixture_probs=[0.5, 0.3, 0.2]"]).pretrain
    n = 20000
    ks = [P.passes_for_step(s, n, p) for s in range(n)]
    for k, prob in zip((1, 2, 3), (0.5, 0.3, 0.2)):
        assert abs(ks.count(k) / n - prob) < 0.015, (k, ks.count(k) / n)
    assert ks[:200] == [P.passes_for_step(s, n, p) for s in range(200)]  # same seed, same draws
    other = load_config(
        None, ["pretrain.schedule=mixture", "pretrain.mixture_probs=[0.5, 0.3, 0.2]", "pretrain.seed=1"]
    ).pretrain
    assert ks[:200] != [P.passes_for_step(s, n, other) for s in range(200)]


def test_lr_schedule_warms_up_then_decays_to_floor():
    p = load_config(None, ["pretrain.steps=100", "pretrain.warmup=10", "pretrain.min_lr_ratio=0.1"]).pretrain
    f = [P.lr_factor(s, p) for s in range(101)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:])) and f[100] == pytest.approx(0.1)


def copy_corpus(path, n, seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        s = "".join(rng.choice("abcdefghijklmnop") for _ in range(8))
        rows.append({"prompt": s + "|", "answer": s})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def run_copy_task(tmp_path, steps, capsys):
    copy_corpus(tmp_path / "train.jsonl", 4000, 0)
    copy_corpus(tmp_path / "val.jsonl", 128, 1)
    from actors.cli import main

    rc = main(
        [
            "pretrain",
            "model.path=null",
            "model.init={backbone: llama, hidden_size: 64, num_layers: 1, num_heads: 1, "
            "num_kv_heads: 1, intermediate_size: 128}",
            "data.task=jsonl",
            f"data.train_path={tmp_path / 'train.jsonl'}",
            f"data.test_path={tmp_path / 'val.jsonl'}",
            f"pretrain.steps={steps}",
            "pretrain.batch_size=32",
            "pretrain.seq_len=32",
            "pretrain.lr=3e-3",
            "pretrain.warmup=20",
            "pretrain.loss_on=response",
            "pretrain.pass_schedule=[[0.2,1],[0.9,2],[1.0,3]]",
            f"pretrain.eval_every={steps}",
            "pretrain.val_batches=4",
            f"pretrain.out_dir={tmp_path / 'ckpt'}",
            "pretrain.threads=1",
            "logging.progress=false",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "ckpt" / "training_summary.json").read_text())
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    assert (tmp_path / "ckpt" / "tokenizer.json").is_file()
    # K=1 and K>=2 steps with feedback at every position (feedback_on: all, the default): standard and fused
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["fbt_decode_modes"] == ["standard", "fused"]
    assert not list(tmp_path.glob("ckpt.*"))  # no tmp / old dirs left behind
    return out, summary


def test_short_run_pass2_below_pass1(tmp_path, capsys):
    out, summary = run_copy_task(tmp_path, 200, capsys)
    val = summary["final_val_loss_per_pass"]
    assert "pass-2 < pass-1" in out and "yes" in out, out
    # seen: pass 1 ~0.35 (one layer cannot copy), pass 2 ~0.01 (feedback supplies the previous letter)
    assert val[1] < 0.5 * val[0], val
    assert summary["steps_per_k"] == {"1": 40, "2": 140, "3": 20}
    assert [h["step"] for h in summary["val_history"]] == [0, 200]


@pytest.mark.parametrize("fusion", ["linear_addition", "concat_projection"])
def test_identity_fusion_starts_as_the_standard_model(fusion):
    """After identity_fusion_, soft decoding's exact recurrence gives the standard forward's log-probs up to the
    RMS epsilons (embedding RMS ~0.02 at init, so eps=1e-6 against a mean square of ~4e-4: 9e-4 measured on
    this batch; tolerance 1e-2, ten times that), and the gradient reaches W_U (training can grow the channel)."""
    cfg = load_config(
        None,
        [
            "model.path=null",
            f"model.fusion_mode={fusion}",
            "model.init={backbone: llama, "
            "hidden_size: 64, num_layers: 2, num_heads: 1, num_kv_heads: 1, intermediate_size: 128}",
        ],
    )
    model, tok = P.load_model_and_tokenizer(cfg)
    ids, am, lm = toy_batch(tok, n=6)
    fb = model.feedback_mask(ids, am) & lm.bool()
    before = model.recurrent_forward(ids, feedback_mask=fb)
    plain = model.multipass_forward(ids, 1, attention_mask=am).last_hidden
    assert (before - plain).abs().max() > 1e-2  # random fusion: feedback changes the states
    P.identity_fusion_(model)
    lp = lambda h: torch.log_softmax(model.logits_from_hidden(h), -1)
    soft = model.recurrent_forward(ids, feedback_mask=fb)
    assert torch.allclose(lp(soft)[am.bool()], lp(plain)[am.bool()], atol=1e-2)
    loss, _ = P.exact_loss(model, ids, am, lm, "response")
    loss.backward()
    w = model.fusion.w_u.weight if fusion == "linear_addition" else model.fusion.w_c.weight
    assert w.grad.abs().sum() > 0


def test_identity_fusion_refuses_gate_product():
    model, _ = tiny_model()
    with pytest.raises(ValueError, match="no identity setting"):
        P.identity_fusion_(model)


def test_stop_after_writes_the_full_runs_checkpoint_at_that_step(tmp_path, monkeypatch):
    """`pretrain.stop_after=4` of 10 steps: the schedules still span 10 steps, so its model is the one a full
    10-step run holds after step 4 (captured at that run's step-4 save), not a 4-step run's."""
    copy_corpus(tmp_path / "train.jsonl", 400, 0)
    copy_corpus(tmp_path / "val.jsonl", 32, 1)
    saved = []
    real_save = P.save_checkpoint
    monkeypatch.setattr(
        P,
        "save_checkpoint",
        lambda model, *a, **k: (
            saved.append({n: t.clone() for n, t in model.state_dict().items()}),
            real_save(model, *a, **k),
        ),
    )

    def run(*overrides):
        cfg = load_config(
            None,
            [
                "model.path=null",
                "model.init={backbone: llama, hidden_size: 32, num_layers: 1, num_heads: 1, num_kv_heads: 1, "
                "intermediate_size: 64}",
                "data.task=jsonl",
                f"data.train_path={tmp_path / 'train.jsonl'}",
                f"data.test_path={tmp_path / 'val.jsonl'}",
                "pretrain.batch_size=8",
                "pretrain.seq_len=32",
                "pretrain.lr=3e-3",
                "pretrain.warmup=2",
                "pretrain.val_batches=1",
                "pretrain.pass_schedule=[[0.3,1],[1.0,2]]",
                "pretrain.threads=1",
                "logging.progress=false",
                *overrides,
            ],
        )
        saved.clear()
        summary = P.train(cfg, log=lambda m: None)
        return summary, list(saved)

    full, full_saves = run("pretrain.steps=10", "pretrain.eval_every=4", f"pretrain.out_dir={tmp_path / 'full'}")
    short, short_saves = run("pretrain.steps=10", "pretrain.stop_after=4", f"pretrain.out_dir={tmp_path / 'cut'}")
    alone, alone_saves = run("pretrain.steps=4", f"pretrain.out_dir={tmp_path / 'alone'}")
    assert short["steps_done"] == 4 and short["stop_after"] == 4 and len(short_saves) == 1
    assert [h["step"] for h in full["val_history"]] == [0, 4, 8, 10]
    step4 = full_saves[0]  # the full run's save after step 4
    assert all(torch.equal(step4[n], short_saves[0][n]) for n in step4)
    assert not all(torch.equal(step4[n], alone_saves[0][n]) for n in step4)  # a 4-step schedule differs
    with pytest.raises(Exception, match="stop_after"):
        load_config(None, ["pretrain.steps=10", "pretrain.stop_after=11"])
