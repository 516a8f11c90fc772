"""Grouped-query attention without K/V copies (rl/model/attention.py) against transformers' `sdpa`, fp32 on a tiny
random FBT Llama whose 6 query heads share 2 K/V heads, with left-padded prompts of different lengths.

Tolerance: both paths compute the same fp32 attention from the same K/V; only the kernels' summation order may
differ (the "rows" layout feeds the query heads of a kv head as rows of one matrix). Measured differences are 0
("gqa" on CPU) and ~1e-7 on activations ("rows"), so 1e-5 on log-probs and states (fp32 eps × depth × margin)
separates rounding from a wrong head-to-kv mapping or a leaking mask, which move log-probs by ~1e-1.
"""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import rl.model.attention as attention
from rl.model import convert_to_fbt
from rl.model.attention import SHARED_KV_SDPA, use_shared_kv_attention
from rl.samples.request import SamplingParams
from rollout.torch_engine import TorchEngine

PROMPTS = [[1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41], [1, 7, 3], [30, 31, 32, 33, 34], [1, 44]]
TOL = 1e-5


def gqa_fbt(kv_heads=2, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=kv_heads,
        head_dim=16,
        intermediate_size=128,
        vocab_size=50,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = convert_to_fbt(LlamaForCausalLM(cfg), seed=seed).eval()
    with torch.no_grad():
        for p in model.fusion.parameters():
            p.mul_(3.0)  # feedback visibly changes outputs, so a wrong fed-back state shows
    return model


def record_layouts(monkeypatch, decode_layout=None):
    """Record (query tokens, layout) of every shared-K/V call; `decode_layout` overrides one-token calls' layout
    (the accelerator's "rows" layout, run here on CPU)."""
    seen, choose = [], attention.layout_for

    def pick(query):
        layout = decode_layout if decode_layout and query.shape[2] == 1 else choose(query)
        seen.append((query.shape[2], layout))
        return layout

    monkeypatch.setattr(attention, "layout_for", pick)
    return seen


def generate(model, **engine_kwargs):
    params = SamplingParams(n=2, temperature=0, max_tokens=10, decode_mode="soft", record_states=True)
    # one prefill of all prompts (left-padded: the mask reaches the attention), whatever the model size
    return TorchEngine(model, prefill_split_tokens=float("inf"), **engine_kwargs).generate(PROMPTS, params)


@pytest.mark.parametrize("decode_layout", ["gqa", "rows"])
def test_engine_samples_equal_the_expanded_kv_path(monkeypatch, decode_layout):
    model = gqa_fbt()
    expanded = copy.deepcopy(model)
    old = generate(expanded, shared_kv_attention=False)
    assert expanded.config._attn_implementation == "sdpa"
    seen = record_layouts(monkeypatch, decode_layout)
    new = generate(model)
    assert model.config._attn_implementation == SHARED_KV_SDPA
    # the prefill (several query tokens) and the decode steps all went through the shared-K/V code
    assert {layout for q, layout in seen if q > 1} == {"gqa"}
    assert {layout for q, layout in seen if q == 1} == {decode_layout}
    for a, b in zip(old, new):
        assert a.response_ids == b.response_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= TOL
        assert (a.states - b.states).abs().max() <= TOL
    assert len({tuple(s.response_ids) for s in new}) > 1  # the prompts decode differently: not a degenerate case


def test_training_forward_and_gradients_equal_the_expanded_kv_path():
    """A learner sharing the model with the engine (in one process) trains through the switched attention."""
    model = gqa_fbt().train()
    ids = torch.tensor([[0, 0, 0, 1, 5, 9, 13, 17], [1, 7, 3, 8, 4, 6, 10, 11]])
    mask = (ids != 0).long()
    grads = {}
    for impl in ("sdpa", SHARED_KV_SDPA):
        model.set_attn_implementation(impl)
        model.zero_grad()
        h = model.multipass_forward(ids, 2, attention_mask=mask).last_hidden
        loss = (model.logits_from_hidden(h).log_softmax(-1)[mask.bool()] ** 2).mean()
        loss.backward()
        grads[impl] = (h.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    (h_old, g_old), (h_new, g_new) = grads["sdpa"], grads[SHARED_KV_SDPA]
    assert (h_old - h_new).abs().max() <= TOL
    assert g_old.keys() == g_new.keys() and len(g_old) > 0
    for name, g in g_old.items():  # K/V gradients are summed over the query heads in another order
        assert torch.allclose(g, g_new[name], rtol=1e-4, atol=1e-6), name


def test_switch_only_sdpa_models_with_shared_kv_heads(tmp_path):
    full_heads = gqa_fbt(kv_heads=6)
    assert not use_shared_kv_attention(full_heads) and full_heads.config._attn_implementation == "sdpa"
    eager = gqa_fbt()
    eager.set_attn_implementation("eager")
    assert not use_shared_kv_attention(eager) and eager.config._attn_implementation == "eager"
    model = gqa_fbt()
    assert use_shared_kv_attention(model) and model.config._attn_implementation == SHARED_KV_SDPA
    model.save_pretrained(tmp_path)  # the name is this process's registration: a saved config must not carry it
    assert SHARED_KV_SDPA not in (tmp_path / "config.json").read_text()
