"""The FBT model against its equations and against the exact recurrence (docs/DESIGN.md §3).

Tolerances: fp32 on CPU. A K-pass forward and the token-by-token recurrence compute the same function with
different kernel shapes (one [L]-long attention vs L cached single-token steps), so they agree to float
rounding, ~1e-6 here; 1e-5 leaves margin without hiding a wrong position (those differ by O(1)).
"""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import rl.model  # noqa: F401  (registers the Auto classes)
from rl.model import FUSION_MODES, Fusion, convert_to_fbt, shift_right

TOL = 1e-5
BOS = 1


def tiny_backbone(kind="llama", seed=0):
    torch.manual_seed(seed)
    common = dict(
        vocab_size=61,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        bos_token_id=BOS,
        eos_token_id=2,
    )
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(head_dim=32, **common)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**common)).eval()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request):
    stock = tiny_backbone(request.param)
    return stock, convert_to_fbt(stock, "gate_product").eval()


def batch_ids(B=3, L=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 61, (B, L), generator=g)
    ids[:, 0] = BOS
    return ids


@torch.no_grad()
def test_feedback_off_is_bit_identical_to_backbone(pair):
    stock, fbt = pair
    ids = batch_ids()
    ref = stock(ids).logits
    assert torch.equal(fbt(ids).logits, ref)
    one_pass = fbt.logits_from_hidden(fbt.multipass_forward(ids, 1).last_hidden)
    assert torch.equal(one_pass, ref)
    standard = fbt.logits_from_hidden(fbt.recurrent_forward(ids, mode="standard"))
    assert (standard - ref).abs().max() < TOL


@pytest.mark.parametrize("mode", FUSION_MODES)
def test_fusion_matches_equation(mode):
    torch.manual_seed(0)
    d = 16
    fusion = Fusion(d, mode)
    h, e = torch.randn(4, d), torch.randn(4, d) * 3

    def rms(x):  # parameter-free RMSNorm, written out
        return x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6)

    if mode == "gate_product":
        want = rms((h @ fusion.w_u.weight.T) * torch.sigmoid(rms(e) @ fusion.w_g.weight.T))
    elif mode == "concat_projection":
        want = rms(torch.cat([rms(h), rms(e)], -1) @ fusion.w_c.weight.T)
    else:
        want = rms(h @ fusion.w_u.weight.T + rms(e) @ fusion.w_t.weight.T)
    assert torch.allclose(fusion(h, e), want, atol=1e-6)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("mode", FUSION_MODES)
def test_converted_fused_inputs_sit_at_embedding_scale(kind, mode):
    stock = tiny_backbone(kind)
    with torch.no_grad():  # a real checkpoint's embeddings are far from unit RMS; make that so here
        stock.model.embed_tokens.weight.mul_(0.05)
    fbt = convert_to_fbt(stock, mode).eval()
    ids = batch_ids()
    with torch.no_grad():
        e = fbt.embed(ids)
        h = fbt.multipass_forward(ids, 1).last_hidden
        x = fbt.fuse(shift_right(h), e)
    ratio = (x.pow(2).mean() / e.pow(2).mean()).sqrt().item()
    assert 1 / 1.5 <= ratio <= 1.5, ratio
    # and the fusion weights got the paper's init: uniform with std 1/sqrt(fan_in)
    w = next(fbt.fusion.parameters())
    assert abs(w.std().item() * w.shape[1] ** 0.5 - 1) < 0.1


def kpass_inputs(fbt, ids, prompt_lens, mode):
    fb = fbt.feedback_mask(ids, no_feedback_before=prompt_lens)
    if mode == "fused":
        carried, fixed = fbt.prompt_carried(ids, prompt_lens)
        return dict(feedback_mask=fb, fixed_carried=carried, fixed_mask=fixed)
    return dict(feedback_mask=fb)


@pytest.mark.parametrize("mode", ["soft", "fused"])
@torch.no_grad()
def test_kpass_converges_to_recurrence(pair, mode):
    _, fbt = pair
    ids, P = batch_ids(L=12), torch.tensor([4, 6, 3])
    exact = fbt.recurrent_forward(ids, P, mode)
    kw = kpass_inputs(fbt, ids, P, mode)
    full = fbt.multipass_forward(ids, ids.shape[1], **kw).last_hidden
    assert (full - exact).abs().max() < TOL
    assert (fbt.logits_from_hidden(full) - fbt.logits_from_hidden(exact)).abs().max() < TOL
    for k in (1, 2, 3):
        h = fbt.multipass_forward(ids, k, **kw).last_hidden
        for b, p in enumerate(P.tolist()):
            # states at p-1 .. p-2+k predict response tokens 0..k-1: exact after k passes
            assert (h[b, p - 1 : p - 1 + k] - exact[b, p - 1 : p - 1 + k]).abs().max() < TOL
            # the next one is not (this is what makes the check able to fail)
            assert (h[b, p - 1 + k] - exact[b, p - 1 + k]).abs().max() > 1e-3


@torch.no_grad()
def test_recurrent_step_with_cache_equals_recurrence_without_cache(pair):
    _, fbt = pair
    ids, p = batch_ids(B=1, L=10), 4
    h_prompt, cache = fbt.prefill(ids[:, :p], mode="soft")
    h_steps, cache = fbt.step(ids[:, p:], h_prompt[:, -1], cache)
    with_cache = torch.cat([h_prompt, h_steps], 1)
    # no cache: rebuild every fused input from earlier outputs and rerun the whole prefix each time
    states = list(fbt.run_stack(fbt.embed(ids[:, :p]))[0][0])
    for t in range(p, ids.shape[1]):
        e = fbt.embed(ids[:, : t + 1])
        carried = torch.zeros_like(e)
        carried[0, p : t + 1] = torch.stack(states[p - 1 : t])
        mask = torch.zeros(1, t + 1, dtype=torch.bool)
        mask[0, p:] = True
        x = torch.where(mask[..., None], fbt.fuse(carried, e), e)
        states.append(fbt.run_stack(x)[0][0, -1])
    assert (with_cache[0] - torch.stack(states)).abs().max() < TOL
    assert cache.get_seq_length() == ids.shape[1]


@torch.no_grad()
def test_soft_first_token_equals_standard_and_fused_cache_is_prompt_length(pair):
    _, fbt = pair
    ids = batch_ids(B=2, L=7)
    h_std, _ = fbt.prefill(ids, mode="standard")
    h_soft, _ = fbt.prefill(ids, mode="soft")
    assert torch.equal(
        fbt.logits_from_hidden(h_soft[:, -1]).argmax(-1), fbt.logits_from_hidden(h_std[:, -1]).argmax(-1)
    )
    h_fused, cache = fbt.prefill(ids, mode="fused")
    assert cache.get_seq_length() == ids.shape[1]
    assert (h_fused - h_soft).abs().max() > 1e-3  # the fused prompt really differs


@torch.no_grad()
def test_left_padded_batched_prefill_and_step_match_single_rows(pair):
    _, fbt = pair
    rows = [batch_ids(1, 5, seed=s)[0] for s in (3, 4)] + [batch_ids(1, 8, seed=5)[0]]
    L = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), L, dtype=torch.long)
    am = torch.zeros(len(rows), L, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, L - len(r) :], am[b, L - len(r) :] = r, 1
    nxt = torch.randint(3, 61, (len(rows), 3))
    for mode in ("soft", "fused"):
        h, cache = fbt.prefill(ids, am, mode=mode)
        am_full = torch.cat([am, torch.ones(len(rows), 3, dtype=torch.long)], 1)
        hs, _ = fbt.step(nxt, h[:, -1], cache, attention_mask=am_full)
        for b, r in enumerate(rows):
            seq = torch.cat([r, nxt[b]])[None]
            ref = fbt.recurrent_forward(seq, torch.tensor([len(r)]), mode)[0, -3:]
            assert (hs[b] - ref).abs().max() < TOL, (mode, b)


def test_save_load_roundtrip_through_automodel(pair, tmp_path):
    _, fbt = pair
    fbt.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(fbt)
    ids = batch_ids()
    P = torch.tensor([4, 6, 3])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, fbt(ids).logits)
        kw = kpass_inputs(fbt, ids, P, "soft")
        assert torch.equal(
            loaded.multipass_forward(ids, 3, **kw).last_hidden, fbt.multipass_forward(ids, 3, **kw).last_hidden
        )
    assert loaded.config.fbt_fusion_mode == "gate_product"
    assert loaded.config.architectures[0].startswith("FBT")


def test_bad_fusion_mode_names_the_field():
    with pytest.raises(ValueError, match="fbt_fusion_mode"):
        convert_to_fbt(tiny_backbone(), "sum")
