"""Likelihood estimators (rl/estimators/likelihood.py) against the exact recurrence, on rollouts of the torch engine.

Model: a tiny random FBT Llama in fp32 whose fusion value weights are scaled up, so that feedback changes the
log-probs by ~0.1 nats (with the paper's init the estimators would agree trivially and prove nothing).
"""

import json

import pytest
import torch
from conftest import TINY_ARITH

from rl.estimators.likelihood import (
    ESTIMATORS,
    get_estimator,
    last_pass_inputs,
    response_hidden,
    run_pass,
    token_logprobs,
)
from rl.model import FBTLlamaConfig, FBTLlamaForCausalLM
from rl.samples.batch import Sample, collate
from rl.samples.request import SamplingParams
from rollout.torch_engine import TorchEngine

TOL = 1e-5


def tiny_model(seed=0, layers=2, dtype=torch.float32, vocab=101):
    torch.manual_seed(seed)
    cfg = FBTLlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = FBTLlamaForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():
        model.fusion.w_u.weight.mul_(4.0)  # strong feedback: estimators must actually differ
    return model


def random_prompts(n, seed=0, vocab=101):
    g = torch.Generator().manual_seed(seed)
    return [
        [1] + torch.randint(3, vocab, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module", params=["soft", "fused"])
def rollouts(request, model):
    """(mode, LearnerBatch) of 5 engine samples (ragged prompts and responses, sampled at T=1, no EOS stop)."""
    mode = request.param
    engine = TorchEngine(model, eos_token_ids=())
    samples = engine.generate(
        random_prompts(5), SamplingParams(temperature=1.0, max_tokens=10, seed=3, decode_mode=mode, record_states=True)
    )
    # ragged responses: cut two samples short (a prefix of a rollout is a rollout)
    for s, R in zip(samples[:2], (4, 7)):
        s.response_ids, s.logprobs, s.states = s.response_ids[:R], s.logprobs[:R], s.states[:R]
    return mode, collate(samples, with_states=True)


def run(model, batch, mode, name, **kw):
    with torch.no_grad():
        return get_estimator(name)(model, batch, mode, **kw)


def test_registry_names_and_error():
    assert set(ESTIMATORS) == {"exact", "kpass", "replay", "standard"}
    with pytest.raises(ValueError, match="exact, kpass, replay, standard"):
        get_estimator("kpas")


def test_exact_matches_engine_logprobs(model, rollouts):
    mode, batch = rollouts
    ex = run(model, batch, mode, "exact").logprobs
    assert (ex - batch.engine_logprobs).abs().max() <= TOL
    assert (ex * (1 - batch.response_mask)).abs().max() == 0  # padding is zeroed


def test_replay_equals_exact(model, rollouts):
    mode, batch = rollouts
    ex = run(model, batch, mode, "exact", with_entropy=True)
    rp = run(model, batch, mode, "replay", with_entropy=True)
    assert (rp.logprobs - ex.logprobs).abs().max() <= TOL
    assert (rp.entropy - ex.entropy).abs().max() <= TOL
    # and feedback matters on this model: the one-pass (K=1) estimate is far off
    k1 = run(model, batch, mode, "kpass", passes=1).logprobs
    assert (k1 - ex.logprobs).abs().max() > 1e-2


def test_kpass_first_k_positions_exact(model, rollouts):
    mode, batch = rollouts
    ex = run(model, batch, mode, "exact").logprobs
    R = batch.response_mask.shape[1]
    errs = []
    for K in (1, 2, 3, 5):
        d = (run(model, batch, mode, "kpass", passes=K).logprobs - ex).abs()
        assert d[:, :K].max() <= TOL, f"K={K}: first K positions not exact"
        errs.append(float(d.sum()))
    assert errs[-1] < errs[0]
    full = run(model, batch, mode, "kpass", passes=R).logprobs
    assert (full - ex).abs().max() <= TOL


def test_micro_batching_concatenates(model, rollouts):
    mode, batch = rollouts
    for name in ("kpass", "replay", "exact"):
        whole = run(model, batch, mode, name, with_entropy=True)
        parts = run(model, batch, mode, name, with_entropy=True, micro_batch_size=2)
        assert (whole.logprobs - parts.logprobs).abs().max() <= TOL
        assert (whole.entropy - parts.entropy).abs().max() <= TOL


def test_standard_is_the_backbone(model, rollouts):
    _, batch = rollouts
    std = run(model, batch, "soft", "standard").logprobs
    # soft K=1 is an ordinary forward; the exact recurrence in standard mode has no feedback either
    assert (run(model, batch, "soft", "kpass", passes=1).logprobs - std).abs().max() <= TOL
    assert (run(model, batch, "standard", "exact").logprobs - std).abs().max() <= TOL
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    pos, tok = batch.response_positions(), batch.response_ids
    ref = torch.log_softmax(logits.float(), -1)[torch.arange(len(batch))[:, None], pos, tok] * batch.response_mask
    assert (ref - std).abs().max() <= TOL


def test_temperature_contract(model, rollouts):
    mode, batch = rollouts
    a = run(model, batch, mode, "replay", temperature=0.7).logprobs
    h = response_hidden(model, batch, mode, "replay").detach()
    logits = model.logits_from_hidden(h) / 0.7
    ref = (
        torch.log_softmax(logits, -1)[torch.arange(len(batch))[:, None], batch.response_positions(), batch.response_ids]
        * batch.response_mask
    )
    assert (a - ref).abs().max() <= TOL
    assert torch.equal(
        run(model, batch, mode, "replay", temperature=0.0).logprobs,
        run(model, batch, mode, "replay", temperature=1.0).logprobs,
    )  # T=0: greedy contract


def test_replay_needs_states(model, rollouts):
    mode, batch = rollouts
    batch = batch.select(range(len(batch)))
    batch.states = None
    with pytest.raises(ValueError, match="record_states"):
        run(model, batch, mode, "replay")


def _grads(model, fn):
    model.zero_grad()
    fn().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name,passes", [("kpass", 3), ("replay", 1)])
def test_gradient_only_through_last_pass(model, rollouts, monkeypatch, name, passes):
    mode, batch = rollouts
    w = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(0))
    grad_calls = []
    orig = model.run_stack

    def counting(*a, **k):
        h, c = orig(*a, **k)
        grad_calls.append(h.requires_grad)
        return h, c

    monkeypatch.setattr(model, "run_stack", counting)
    g_est = _grads(model, lambda: (get_estimator(name)(model, batch, mode, passes=passes).logprobs * w).sum())
    assert sum(grad_calls) == 1, f"{name}: stack passes with a graph: {grad_calls}"
    assert len(grad_calls) == (passes if name == "kpass" else 1) + (mode == "fused")  # + prompt prefill pass
    monkeypatch.setattr(model, "run_stack", orig)
    # same gradient as ONE pass fed the detached carried states as fixed inputs
    carried, mask = last_pass_inputs(model, batch, mode, name, passes)
    g_ref = _grads(
        model, lambda: (token_logprobs(model, run_pass(model, batch, carried, mask)[0], batch).logprobs * w).sum()
    )
    assert g_est.keys() == g_ref.keys() and "fusion.w_u.weight" in g_est
    for n in g_est:
        torch.testing.assert_close(g_est[n], g_ref[n], rtol=1e-5, atol=1e-6, msg=n)
    model.zero_grad()


@pytest.fixture
def true_float64(monkeypatch):
    """The norms (ours and Llama's) upcast to fp32 by design, which would cap a float64 finite-difference
    check at fp32 precision: make them dtype-preserving for the check."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    import rl.model.fbt
    import rl.model.fusion

    inv_rms = lambda x, eps: torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    # where the model reads them: the fusion's norms, the embedding-RMS scale of the fused input
    monkeypatch.setattr(rl.model.fusion, "rms_normalize", lambda x, eps=1e-6: x * inv_rms(x, eps))
    monkeypatch.setattr(rl.model.fbt, "rms_value", lambda x, eps=1e-6: 1 / inv_rms(x, eps))
    monkeypatch.setattr(LlamaRMSNorm, "forward", lambda self, h: self.weight * h * inv_rms(h, self.variance_epsilon))


@pytest.mark.parametrize("mode", ["soft", "fused"])
def test_exact_gradient_finite_differences(mode, true_float64):
    """The exact estimator's gradient (through the whole recurrence) against central differences along a
    random direction in parameter space (scaled to each tensor's magnitude), float64, 2 layers."""
    model = tiny_model(seed=1, layers=2, dtype=torch.float64)
    g = torch.Generator().manual_seed(2)
    samples = [
        Sample(p, torch.randint(3, 101, (R,), generator=g).tolist(), [0.0] * R, "length", 0)
        for p, R in zip(random_prompts(3, seed=5), (6, 4, 5))
    ]
    batch = collate(samples)
    w = torch.randn(batch.response_mask.shape, generator=g, dtype=torch.float64)
    loss = lambda: (get_estimator("exact")(model, batch, mode).logprobs.double() * w).sum()
    grads = _grads(model, loss)
    params = dict(model.named_parameters())
    direction = {
        n: torch.randn(p.shape, generator=g, dtype=torch.float64) * p.detach().abs().mean() for n, p in params.items()
    }
    analytic = sum(float((grads[n] * direction[n]).sum()) for n in grads)
    eps = 1e-5

    def shifted(sign):
        with torch.no_grad():
            for n, p in params.items():
                p.add_(sign * eps * direction[n])
            val = float(loss())
            for n, p in params.items():
                p.sub_(sign * eps * direction[n])
        return val

    numeric = (shifted(1) - shifted(-1)) / (2 * eps)
    assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(analytic)), (numeric, analytic)
    # the recurrence's gradient is not the one-pass surrogate's
    g_kpass = _grads(model, lambda: (get_estimator("kpass")(model, batch, mode, passes=2).logprobs * w).sum())
    assert not torch.allclose(g_kpass["fusion.w_u.weight"], grads["fusion.w_u.weight"])


def test_kv_helper_replay_cache_equals_exact(model, rollouts):
    mode, batch = rollouts
    ex_h = response_hidden(model, batch, mode, "exact").detach()
    h_ex, kv_ex = run_pass(model, batch, *last_pass_inputs(model, batch, mode, "exact"), with_kv=True)
    _, kv_rp = run_pass(model, batch, *last_pass_inputs(model, batch, mode, "replay"), with_kv=True)
    real = batch.attention_mask.bool()
    assert (h_ex - ex_h)[real].abs().max() <= TOL  # the parallel pass over exact inputs is the recurrence
    assert len(kv_ex) == model.config.num_hidden_layers
    for (k0, v0), (k1, v1) in zip(kv_ex, kv_rp):
        assert k0.shape == (len(batch), 2, batch.input_ids.shape[1], 32)
        assert (k0 - k1).abs().max() <= TOL and (v0 - v1).abs().max() <= TOL


def check_report(rep):
    """JSON keys; errors non-increasing from K=1 to K=3 and replay at or below K=3 (and exact); standard (no
    feedback) is a row of its own, far from exact on a model whose feedback matters."""
    assert {"passes", "replay", "standard", "exact", "engine"} <= rep.keys()
    assert [r["k"] for r in rep["passes"]] == [1, 2, 3]
    for r in rep["passes"] + [rep["replay"], rep["standard"]]:
        assert {"mean_abs_logp_diff", "kl", "top1_agreement", "k_rel_l2", "v_rel_l2", "time_per_token_ms"} <= r.keys()
        assert len(r["k_rel_l2"]) == len(r["v_rel_l2"]) == rep["n_layers"]
    k1, k2, k3 = rep["passes"]
    for key in ("mean_abs_logp_diff", "kl", "k_rel_l2_mean", "v_rel_l2_mean"):
        assert k1[key] >= k2[key] >= k3[key] >= rep["replay"][key] - 1e-7, key
    assert rep["replay"]["mean_abs_logp_diff"] <= TOL and rep["replay"]["top1_agreement"] == 1.0
    assert rep["engine"]["max_abs_logp_diff"] <= TOL
    assert rep["standard"]["mean_abs_logp_diff"] > 100 * TOL
    if rep["decode_mode"] == "soft":  # one plain pass: K=1 feeds nothing back in soft mode, exactly like standard
        assert abs(rep["standard"]["mean_abs_logp_diff"] - k1["mean_abs_logp_diff"]) <= TOL


def test_compare_estimators(model, rollouts):
    from rl.estimators.comparison import compare_estimators, format_comparison

    mode, batch = rollouts
    rep = compare_estimators(model, batch, mode, max_passes=3, micro_batch_size=3)
    check_report(rep)
    table = format_comparison(rep)
    assert rep["n_tokens"] == int(batch.response_mask.sum()) and "replay" in table
    assert any(line.split()[0] == "standard" for line in table.splitlines()[2:])


def test_compare_report_equals_each_estimator_run_alone(model, rollouts):
    """The comparison runs each estimator once (kpass K as a chain of passes, exact once over all rows with its
    own cache, the rest per micro-batch): its figures equal the public estimators run one by one on the whole
    batch, and exact's cache equals the K/V of a parallel pass over the recurrence's inputs (how the comparison
    used to build it). Tolerance: fp32 computed in other batch shapes and orders: rounding, ~1e-7 per log-prob."""
    from rl.estimators.comparison import compare_estimators
    from rl.estimators.likelihood import exact_states_and_kv

    mode, batch = rollouts
    rep = compare_estimators(model, batch, mode, max_passes=3, micro_batch_size=2)  # 5 rows: 2 + 2 + 1
    mask = batch.response_mask
    exact = run(model, batch, mode, "exact").logprobs
    runs = [("kpass", k, rep["passes"][k - 1]) for k in (1, 2, 3)]
    runs += [("replay", 1, rep["replay"]), ("standard", 1, rep["standard"])]
    for name, passes, record in runs:
        diff = (run(model, batch, mode, name, passes=passes).logprobs - exact).abs() * mask
        assert abs(record["mean_abs_logp_diff"] - float(diff.sum() / mask.sum())) <= TOL, (name, passes)
        assert abs(record["max_abs_logp_diff"] - float(diff.max())) <= TOL, (name, passes)
    engine = (batch.engine_logprobs - exact).abs() * mask
    assert abs(rep["engine"]["mean_abs_logp_diff"] - float(engine.sum() / mask.sum())) <= TOL
    with torch.no_grad():
        h, kv = exact_states_and_kv(model, batch, mode)
        _, kv_pass = run_pass(model, batch, *last_pass_inputs(model, batch, mode, "exact", prev_hidden=h), True)
    real = batch.attention_mask.bool()[:, None, :, None]
    for (k, v), (k0, v0) in zip(kv, kv_pass):
        for a, b in ((k, k0), (v, v0)):
            assert float(((a - b) * real).norm() / (b * real).norm()) <= TOL


def test_compare_with_prompts_run_once_equals_every_pass_whole(model, rollouts):
    """Soft decoding: the comparison runs each micro-batch's prompts once and the passes over the responses only
    (fused decoding runs every pass whole with or without `share_prompts`).
    Every figure of the report but the times (log-prob errors, KL, top-1 agreement, K/V relative L2 per layer, by
    position) equals the report whose passes run over prompt and response. Tolerance: fp32 in other shapes, the
    same 1e-5 as above (relative for the K/V errors, which are ratios of norms)."""
    from rl.estimators.comparison import compare_estimators

    mode, batch = rollouts  # fused: prompts carry feedback, so every pass runs whole either way
    shared = compare_estimators(model, batch, mode, max_passes=3, micro_batch_size=2)
    whole = compare_estimators(model, batch, mode, max_passes=3, micro_batch_size=2, share_prompts=False)

    def flat(rep, path=""):
        if isinstance(rep, dict):
            return {k2: v2 for k, v in rep.items() if "time" not in k for k2, v2 in flat(v, f"{path}.{k}").items()}
        if isinstance(rep, list):
            return {k2: v2 for i, v in enumerate(rep) for k2, v2 in flat(v, f"{path}[{i}]").items()}
        return {path: rep}

    a, b = flat(shared), flat(whole)
    assert a.keys() == b.keys()
    kv_keys = [k for k in a if "rel_l2" in k]
    assert kv_keys and max(abs(b[k]) for k in kv_keys) > 1e-3  # the K/V errors are not all zero: they compare
    for key in a:
        if isinstance(a[key], (int, float)) and not isinstance(a[key], bool):
            assert abs(a[key] - b[key]) <= TOL * max(1.0, abs(b[key])), (key, a[key], b[key])
        else:
            assert a[key] == b[key], key


TINY_CKPT = TINY_ARITH


@pytest.mark.parametrize("source,mode", [("random", "soft"), ("random", "fused"), ("tiny-arith", "soft")])
def test_compare_likelihood_cli(tmp_path, source, mode):
    """4 samples through `fbrl compare-likelihood`, on a random strong-feedback model (+ the char tokenizer)
    and, once it is committed, on the tiny checkpoint."""
    from actors.cli import main
    from rl.data.tokenizer import save_tokenizer

    if source == "tiny-arith":
        if not (TINY_CKPT / "config.json").exists():
            pytest.skip("checkpoints/tiny-arith is not committed yet")
        ckpt = TINY_CKPT
    else:
        ckpt = tmp_path / "ckpt"
        tiny_model().save_pretrained(ckpt)
        save_tokenizer(ckpt)
    out, png = tmp_path / "cmp.json", tmp_path / "cmp.png"
    assert (
        main(
            [
                "compare-likelihood",
                "--checkpoint",
                str(ckpt),
                "--task",
                "arith",
                "--n-samples",
                "4",
                "--max-passes",
                "3",
                "--decode-mode",
                mode,
                "--max-tokens",
                "12",
                "--json",
                str(out),
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    rep = json.loads(out.read_text())
    assert rep["n_samples"] == 4 and rep["task"] == "arith" and rep["decode_mode"] == mode
    check_report(rep)
    assert png.stat().st_size > 0


def test_fused_prompt_prefill_runs_once_per_distinct_prompt(model, monkeypatch):
    """A GRPO batch repeats each prompt G times: the learner's fused-prompt prefill runs once per distinct prompt
    and gives every row the states it would get alone, so replay still equals exact."""
    engine = TorchEngine(model, eos_token_ids=())
    samples = engine.generate(
        random_prompts(3, seed=5),
        SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=1, decode_mode="fused", record_states=True),
    )
    batch = collate(samples, with_states=True)
    rows_seen = []
    orig = model.run_stack

    def counting(x, *a, **k):
        rows_seen.append(x.shape[0])
        return orig(x, *a, **k)

    monkeypatch.setattr(model, "run_stack", counting)
    with torch.no_grad():
        carried, mask = model.prompt_carried(batch.input_ids, batch.prompt_lens, batch.attention_mask)
    monkeypatch.setattr(model, "run_stack", orig)
    assert rows_seen == [3] * (model.config.fbt_prefill_passes - 1)  # 3 prompts, not 12 rows
    with torch.no_grad():
        for b in range(len(samples)):  # each row alone: the same states on its prompt positions
            c1, m1 = model.prompt_carried(
                batch.input_ids[b : b + 1], batch.prompt_lens[b : b + 1], batch.attention_mask[b : b + 1]
            )
            assert torch.equal(m1[0], mask[b])
            assert (c1[0] - carried[b]).abs().max() <= 1e-6
    assert (
        run(model, batch, "fused", "replay").logprobs - run(model, batch, "fused", "exact").logprobs
    ).abs().max() <= TOL


def test_compare_likelihood_reads_prompts_from_a_jsonl_file(tmp_path):
    """`--task jsonl --data-path FILE`: the prompts a user's data gives (chats rendered), not a generated task's."""
    from actors.cli import main

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(1, 4)))
    out = tmp_path / "cmp.json"
    argv = ["compare-likelihood", "--checkpoint", str(TINY_CKPT), "--task", "jsonl", "--data-path", str(data)]
    assert main([*argv, "--n-samples", "3", "--max-passes", "3", "--max-tokens", "6", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["n_samples"] == 3 and rep["task"] == "jsonl"
    check_report(rep)
    with pytest.raises(SystemExit, match="--task jsonl needs --data-path"):
        main(["compare-likelihood", "--checkpoint", str(TINY_CKPT), "--task", "jsonl"])
