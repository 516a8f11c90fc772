"""Acceptance tests of the pure-torch rollout engine (rollout/torch_engine.py), fp32 on tiny random FBT Llamas.

The fusion weights are scaled up so that feedback visibly changes outputs (checked): a wrong feedback path fails.
The ground truth is the model's own single-sequence recurrence, `recurrent_forward`, teacher-forced on what the
engine generated.
"""

import copy

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

from rl.model import convert_to_fbt
from rl.samples.request import SamplingParams
from rollout.engine import StaleWeightsError
from rollout.prompt_batch import prefill_groups
from rollout.torch_engine import TorchEngine

PROMPTS = [[1, 5, 9, 13, 17, 21, 25, 29], [1, 7, 3], [30, 31, 32, 33, 34]]  # different lengths, one without BOS
TOL = 1e-5


def tiny_fbt(seed=0, vocab=50, fusion_mode="gate_product", fusion_scale=3.0, head_scale=1.0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=128,
        vocab_size=vocab,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = convert_to_fbt(LlamaForCausalLM(cfg), fusion_mode=fusion_mode, seed=seed).eval()
    with torch.no_grad():
        for p in model.fusion.parameters():
            p.mul_(fusion_scale)
        model.lm_head.weight.mul_(head_scale)
    return model


@pytest.fixture(scope="module")
def model():
    return tiny_fbt()


def vllm_truncation(scaled, top_k, top_p):
    """vLLM 0.32's `apply_top_k_top_p_pytorch`, restated as the oracle: ascending sort, top-k keeps logits >= the
    k-th largest, then top-p masks the ascending prefix whose cumulative (renormalised) mass is <= 1 - p, keeping
    the largest token."""
    x = scaled.clone()
    srt, idx = x.sort(dim=-1, descending=False)
    if top_k > 0:
        srt = srt.masked_fill(srt < srt[:, -top_k, None], float("-inf"))
    if top_p < 1:
        cum = srt.softmax(-1).cumsum(-1)
        drop = cum <= 1 - top_p
        drop[:, -1] = False
        srt = srt.masked_fill(drop, float("-inf"))
    return x.scatter(-1, idx, srt)


def reference(model, sample, temperature=1.0, top_k=0, top_p=1.0):
    """The recurrence's states rows [R, d] and log-probs [R, V] under the log-prob contract for one sample: the
    distribution sampled from, truncated by top-k / top-p (vLLM's rule) and renormalised."""
    P, R = len(sample.prompt_ids), len(sample.response_ids)
    ids = torch.tensor([sample.prompt_ids + sample.response_ids])
    with torch.no_grad():
        h = model.recurrent_forward(ids, torch.tensor([P]), mode=sample.decode_mode)[0, P - 1 : P - 1 + R]
        logits = model.logits_from_hidden(h)
    return h, torch.log_softmax(vllm_truncation(logits / (temperature or 1.0), top_k, top_p), dim=-1)


def assert_matches_recurrence(model, samples, temperature=0.0, top_k=0, top_p=1.0):
    for s in samples:
        states, logp = reference(model, s, temperature, top_k, top_p)
        resp = torch.tensor(s.response_ids)
        if temperature == 0:
            assert s.response_ids == logp.argmax(-1).tolist(), "greedy tokens differ from the recurrence"
        lp_ref = logp.gather(1, resp[:, None])[:, 0]
        assert (torch.tensor(s.logprobs) - lp_ref).abs().max() <= TOL
        if s.states is not None:
            assert s.states.shape == states.shape
            assert (s.states - states).abs().max() <= TOL


@pytest.mark.parametrize("mode", ["soft", "fused", "standard"])
def test_greedy_matches_recurrence(model, mode):
    params = SamplingParams(n=2, temperature=0, max_tokens=10, decode_mode=mode, record_states=True)
    samples = TorchEngine(model).generate(PROMPTS, params)
    assert [(s.group_id, s.sample_index) for s in samples] == [(i, k) for i in range(3) for k in range(2)]
    assert all(s.decode_mode == mode and s.policy_version == 0 for s in samples)
    assert samples[0].response_ids == samples[1].response_ids  # greedy: both samples equal
    assert_matches_recurrence(model, samples)


@pytest.mark.parametrize("mode", ["soft", "fused"])
def test_grouped_prefill_matches_recurrence(model, mode):
    prompts = PROMPTS + [[1, 40], [1] + list(range(4, 16))]
    assert len(prefill_groups([len(p) for p in prompts], 0)) == 5  # one prefill per distinct length
    params = SamplingParams(n=2, temperature=0, max_tokens=8, decode_mode=mode, record_states=True)
    assert_matches_recurrence(model, TorchEngine(model, prefill_split_tokens=0).generate(prompts, params))


def test_prefill_groups_partition():
    lengths = [5, 30, 6, 5, 29, 12, 31]
    for cost in (0, 3, 10, 1e9):
        groups = prefill_groups(lengths, cost)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        spans = [(min(lengths[i] for i in g), max(lengths[i] for i in g)) for g in groups]
        assert all(hi < lo for (_, hi), (lo, _) in zip(spans, spans[1:]))  # ranges of the sorted lengths
    assert len(prefill_groups(lengths, 1e9)) == 1
    assert [sorted(g) for g in prefill_groups(lengths, 10)] == [[0, 2, 3], [5], [1, 4, 6]]


def test_feedback_visibly_changes_outputs(model):
    engine = TorchEngine(model)
    out = {
        m: engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=10, decode_mode=m))
        for m in ("standard", "soft", "fused")
    }
    for a, b in [("standard", "soft"), ("soft", "fused")]:
        assert any(x.response_ids != y.response_ids for x, y in zip(out[a], out[b])), (a, b)
    # first token: soft = standard (ordinary prompt), fused differs (its prompt takes feedback)
    assert all(abs(x.logprobs[0] - y.logprobs[0]) < TOL for x, y in zip(out["standard"], out["soft"]))


@pytest.mark.parametrize(
    "fusion_mode,tables", [("concat_projection", True), ("linear_addition", True), ("gate_product", False)]
)
def test_fusion_modes_and_untabled_path(fusion_mode, tables):
    model = tiny_fbt(seed=3, fusion_mode=fusion_mode)
    params = SamplingParams(temperature=0, max_tokens=8, decode_mode="soft", record_states=True)
    assert_matches_recurrence(model, TorchEngine(model, fusion_tables=tables).generate(PROMPTS, params))


def test_sampled_logprobs_follow_contract(model):
    params = SamplingParams(n=3, temperature=0.7, max_tokens=10, seed=11, decode_mode="fused", record_states=True)
    assert_matches_recurrence(model, TorchEngine(model).generate(PROMPTS, params), temperature=0.7)
    # Under top-k / top-p the reported log-prob is that of the distribution sampled from (truncated, renormalised),
    # as vLLM's processed log-probs are. Fails on main, which reported full-vocabulary log-probs (gap ~2 here).
    for top_k, top_p in ((5, 1.0), (0, 0.8), (5, 0.9)):
        params = SamplingParams(n=2, temperature=1.3, top_k=top_k, top_p=top_p, max_tokens=8, seed=2)
        samples = TorchEngine(model).generate(PROMPTS, params)
        assert_matches_recurrence(model, samples, temperature=1.3, top_k=top_k, top_p=top_p)
        full = [reference(model, s, 1.3)[1].gather(1, torch.tensor(s.response_ids)[:, None])[:, 0] for s in samples]
        gap = torch.cat([torch.tensor(s.logprobs) - f for s, f in zip(samples, full)])
        assert gap.min() > 1e-3, "truncation should raise every sampled token's log-prob (kept mass < 1)"


def test_stop_tokens_early_exit_and_reset_tokens(model):
    engine = TorchEngine(model, eos_token_ids=())
    base = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=10))
    # a stop token that ends one row early while another row runs to the end
    stop = next(t for t in base[0].response_ids[1:6] if t not in base[1].response_ids)
    params = SamplingParams(temperature=0, max_tokens=10, stop_token_ids=(stop,), record_states=True)
    out = engine.generate(PROMPTS, params)
    first = base[0].response_ids.index(stop)
    assert out[0].response_ids == base[0].response_ids[: first + 1] and out[0].finish_reason == "stop"
    assert out[1].response_ids == base[1].response_ids and out[1].finish_reason == "length"
    assert_matches_recurrence(model, out)  # rows that kept running after the batch shrank are exact
    # a document-start token sampled mid-response keeps the ordinary input (no feedback across documents)
    reset = base[2].response_ids[3]
    model.config.fbt_reset_token_ids = [1, reset]
    try:
        out = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=10, record_states=True))
        assert reset in out[2].response_ids[:-1]
        assert_matches_recurrence(model, out)
    finally:
        model.config.fbt_reset_token_ids = None
    # the tokenizer's / config's eos stops by default
    eos_engine = TorchEngine(model, eos_token_ids=None)
    assert eos_engine.eos_token_ids == (2,)


def test_stopped_rows_left_in_the_batch_change_nothing(model, monkeypatch):
    """Stopped rows stay in the batch until they are COMPACT_FRACTION of it: each sample still ends at its first
    stop token, with the tokens and log-probs it gets when stopped rows leave the batch at once."""
    import rollout.torch_engine as torch_engine

    engine = TorchEngine(model, eos_token_ids=())
    stops = tuple(range(4, model.config.vocab_size, 5))  # a fifth of the vocabulary: rows stop at every step
    params = SamplingParams(n=8, temperature=1.0, max_tokens=12, seed=3, stop_token_ids=stops)
    lazy = engine.generate(PROMPTS, params)
    monkeypatch.setattr(torch_engine, "COMPACT_FRACTION", 0.0)
    eager = engine.generate(PROMPTS, params)
    assert {s.finish_reason for s in lazy} == {"stop", "length"}
    for s in lazy:
        ends = [j for j, t in enumerate(s.response_ids) if t in stops]
        assert ends == ([len(s.response_ids) - 1] if s.finish_reason == "stop" else []), s.response_ids
    assert [(s.response_ids, s.logprobs) for s in lazy] == [(s.response_ids, s.logprobs) for s in eager]


def test_same_seed_same_samples_regardless_of_batch(model):
    engine = TorchEngine(model)
    params = SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=5)
    key = lambda ss: [(s.response_ids, s.logprobs) for s in ss]
    a = engine.generate(PROMPTS, params)
    assert key(a) == key(engine.generate(PROMPTS, params))
    assert key(a) != key(engine.generate(PROMPTS, SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=6)))
    # prompt 0 and 1's samples do not depend on what else is in the batch (batch size, padding, finished rows)
    for rest in ([], [[1] + list(range(4, 20)), [9, 9]]):
        other = engine.generate(PROMPTS[:2] + rest, params)
        assert [s.response_ids for s in a[:6]] == [s.response_ids for s in other[:6]]
    assert len({tuple(s.response_ids) for s in a[:3]}) > 1  # the n samples of one prompt differ


def _first_token_counts(engine, prompt, params, seeds):
    counts = np.zeros(engine.vocab_size)
    for seed in seeds:
        out = engine.generate([prompt], SamplingParams(**{**params, "seed": seed}))
        counts += np.bincount([s.response_ids[0] for s in out], minlength=engine.vocab_size)
    return counts


def _chi2_pvalue(counts, probs):
    """Pearson chi-square p-value; bins with an expected count below 5 are pooled."""
    expected = probs / probs.sum() * counts.sum()
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        assert obs[-1] == 0, "a token with zero probability was sampled"
        obs, exp = obs[:-1], exp[:-1]
    return chisquare(obs, exp).pvalue


def test_chi_square_first_token_distribution():
    model = tiny_fbt(seed=7, vocab=12, head_scale=6.0)  # spread logits: temperatures are distinguishable
    engine, prompt = TorchEngine(model, eos_token_ids=()), [1, 4, 5, 6]
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].double()
    probs = lambda t: torch.softmax(logits / t, -1).numpy()
    base = dict(n=500, max_tokens=1, decode_mode="soft")
    counts = _first_token_counts(engine, prompt, {**base, "temperature": 0.8}, range(8))
    assert _chi2_pvalue(counts, probs(0.8)) > 1e-3
    assert _chi2_pvalue(counts, probs(1.0)) < 1e-6  # the same statistic rejects a wrong temperature
    assert _chi2_pvalue(counts, probs(0.65)) < 1e-6
    # top-k: the renormalized k most likely tokens, nothing else
    p = probs(1.0)
    topk = np.where(p >= np.sort(p)[-3], p, 0)
    counts = _first_token_counts(engine, prompt, {**base, "temperature": 1.0, "top_k": 3}, range(4))
    assert _chi2_pvalue(counts, topk) > 1e-3 and counts[topk == 0].sum() == 0
    # top-p: the smallest set of most likely tokens reaching mass 0.7
    order = np.argsort(-p)
    keep = order[: int(np.searchsorted(np.cumsum(p[order]), 0.7)) + 1]
    topp = np.zeros_like(p)
    topp[keep] = p[keep]
    counts = _first_token_counts(engine, prompt, {**base, "temperature": 1.0, "top_p": 0.7}, range(4))
    assert _chi2_pvalue(counts, topp) > 1e-3 and counts[topp == 0].sum() == 0


@pytest.mark.parametrize(
    "prompts,params,field",
    [
        ([[1, 2], []], {}, r"prompts\[1\]"),
        ([[1, 2, 50]], {}, r"prompts\[0\]\[2\]"),
        ([[1, -1]], {}, r"prompts\[0\]\[1\]"),
        ([[1, 2]], {"max_tokens": 0}, "max_tokens"),
        ([[1, 2]], {"max_tokens": -3}, "max_tokens"),
        ([[1, 2]], {"top_p": 0.0}, "top_p"),
        ([[1, 2]], {"top_p": 1.5}, "top_p"),
        ([[1, 2]], {"max_tokens": 63}, "max_tokens"),  # prompt + max_tokens beyond max_position_embeddings
        ([[1, 2]], {"stop_token_ids": (99,)}, "stop_token_ids"),
        ([[1, 2]], {"decode_mode": "hard"}, "decode_mode"),
    ],
)
def test_bad_input_names_the_field_and_generates_nothing(model, prompts, params, field):
    calls = []
    hook = model.model.register_forward_pre_hook(lambda *a, **k: calls.append(1))
    try:
        with pytest.raises(ValueError, match=field):
            TorchEngine(model).generate(prompts, SamplingParams(**params))
    finally:
        hook.remove()
    assert not calls


def test_stale_version_refused(model):
    engine = TorchEngine(model, version=3)
    with pytest.raises(StaleWeightsError):
        engine.generate(PROMPTS, SamplingParams(max_tokens=2), min_version=4)
    out = engine.generate(PROMPTS, SamplingParams(max_tokens=2), min_version=3)
    assert {s.policy_version for s in out} == {3}
    with pytest.raises(ValueError, match="version"):
        engine.load_weights(model.state_dict(), version=3)


def test_load_weights_changes_outputs(model, tmp_path):
    engine = TorchEngine(copy.deepcopy(model))
    params = SamplingParams(temperature=0, max_tokens=8, decode_mode="soft", record_states=True)
    before = engine.generate(PROMPTS, params)
    other = tiny_fbt(seed=1)
    other.save_pretrained(tmp_path / "ckpt")
    engine.load_weights(str(tmp_path / "ckpt"), version=1)  # save_pretrained dir
    after = engine.generate(PROMPTS, params)
    assert engine.version == 1 and all(s.policy_version == 1 for s in after)
    assert [s.response_ids for s in after] != [s.response_ids for s in before]
    assert_matches_recurrence(other, after)  # the new weights, fusion tables rebuilt
    engine.load_weights(model.state_dict(), version=2)  # state dict
    assert [s.response_ids for s in engine.generate(PROMPTS, params)] == [s.response_ids for s in before]
    save_file({k: v.contiguous() for k, v in other.state_dict().items()}, str(tmp_path / "w.safetensors"))
    engine.load_weights(tmp_path / "w.safetensors", version=3)  # one safetensors file
    assert [s.response_ids for s in engine.generate(PROMPTS, params)] == [s.response_ids for s in after]
    with pytest.raises(ValueError, match="unexpected"):
        engine.load_weights({"nope": torch.zeros(1)}, version=4)
    (tmp_path / "bad.bin").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="safetensors"):
        engine.load_weights(tmp_path / "bad.bin", version=4)


def test_recorded_states_bf16_and_autograd_usable(model):
    engine = TorchEngine(model)
    p32 = SamplingParams(temperature=0, max_tokens=6, record_states=True)
    s32 = engine.generate(PROMPTS, p32)
    s16 = engine.generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=6, record_states=True, states_dtype="bfloat16")
    )
    for a, b in zip(s32, s16):
        assert b.states.dtype == torch.bfloat16 and a.states.dtype == torch.float32
        assert torch.allclose(a.states, b.states.float(), rtol=1e-2, atol=1e-2)
        assert not a.states.is_inference()  # the learner may feed them to a differentiable pass
    assert engine.generate(PROMPTS, SamplingParams(max_tokens=2))[0].states is None
    model.train()  # a model shared with an in-process learner keeps its mode
    engine.generate(PROMPTS, SamplingParams(max_tokens=2))
    assert model.training
    model.eval()
