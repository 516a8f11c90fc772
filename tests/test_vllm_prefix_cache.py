"""Prefix caching in the vLLM engine: on by default, and exact. An engine with caching on must give the same
tokens, log-probs and states as one with caching off (tests/test_vllm_engine.py's tolerance: both are vLLM, so
the gap is batch-shape rounding, ~1e-6), while its prompts really do hit the cache (counted at the scheduler).

Cases: many samples of prompts sharing a few-shot prefix (soft, standard), a prompt whose uncached rest is one
token (vLLM schedules it as a decode: it must stay a plain prompt token), fused prompts (never shared), a second
call after new weights (no stale hit), and a fed continuation beside the same tokens prefilled plainly (their
K/V differ at the fed positions, so they must not share blocks). Blocks of 16 tokens so that short prompts hit.
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("vllm")

from test_vllm_engine import ON_GPU, TINY_ARITH, perturb, random_tiny_fbt  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import rl.model  # noqa: E402,F401  (registers fbt_llama with the Auto classes)
from rl.samples.continuation import Continuation  # noqa: E402
from rl.samples.request import SamplingParams  # noqa: E402
from rollout.vllm_engine import VLLMEngine  # noqa: E402
from rollout.vllm_requests import cache_salts  # noqa: E402

TOL = 1e-4
MAX_LEN = 128
BLOCK = 16


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    if (TINY_ARITH / "config.json").exists():
        return str(TINY_ARITH)
    path = tmp_path_factory.mktemp("tiny_fbt")
    random_tiny_fbt(path)
    return str(path)


@pytest.fixture(scope="module")
def hf_model(ckpt):
    return AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()


def make_engine(ckpt, caching: bool) -> VLLMEngine:
    return VLLMEngine(
        ckpt,
        max_model_len=MAX_LEN,
        max_num_seqs=32,
        dtype="float32",
        seed=0,
        block_size=BLOCK,
        enable_prefix_caching=caching,
        **ON_GPU,
    )


@pytest.fixture(scope="module")
def engines(ckpt):
    cached, plain = make_engine(ckpt, True), make_engine(ckpt, False)
    yield cached, plain
    cached.close()
    plain.close()


def count_hits(engine: VLLMEngine, monkeypatch) -> list[int]:
    """Per scheduled request, the prompt tokens its prefix-cache lookup found (the in-process scheduler's)."""
    manager = engine.llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager
    hits, lookup = [], manager.get_computed_blocks

    def counted(request):
        found = lookup(request)  # (blocks, number of hit tokens, ...)
        hits.append(found[1])
        return found

    monkeypatch.setattr(manager, "get_computed_blocks", counted)
    return hits


def few_shot_prompts(vocab: int, n: int, seed: int = 0) -> list[list[int]]:
    """A shared 40-token prefix (<bos> first) and a 3..12-token question each; the last prompt is the prefix's
    first 32 tokens and one other token: after a hit on two blocks, one token is left, which vLLM schedules as a
    decode."""
    g = torch.Generator().manual_seed(seed)
    prefix = [1] + torch.randint(3, vocab, (39,), generator=g).tolist()
    prompts = [prefix + torch.randint(3, vocab, (int(k),), generator=g).tolist() for k in torch.randint(3, 13, (n,))]
    prompts[-1] = prefix[: 2 * BLOCK] + [3 + (prefix[2 * BLOCK] - 2) % (vocab - 3)]
    return prompts


def greedy(mode: str, n: int = 1, max_tokens: int = 16) -> SamplingParams:
    return SamplingParams(n=n, temperature=0.0, max_tokens=max_tokens, decode_mode=mode, record_states=True)


def assert_same(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.response_ids == w.response_ids, (g.prompt_ids, g.response_ids, w.response_ids)
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs)) < TOL
        assert (g.states - w.states).abs().max() < TOL


@pytest.mark.parametrize("mode", ["soft", "standard"])
def test_shared_prefixes_hit_and_stay_exact(engines, monkeypatch, mode):
    """Four samples each of prompts that share a prefix: the same as without caching, and most prompts hit."""
    cached, plain = engines
    prompts = few_shot_prompts(cached.vocab_size, n=8)
    hits = count_hits(cached, monkeypatch)
    got = cached.generate(prompts, greedy(mode, n=4))
    assert_same(got, plain.generate(prompts, greedy(mode, n=4)))
    assert sum(h >= 2 * BLOCK for h in hits) >= 4 * len(prompts) - 1, hits
    assert all(g.response_len for g in got)


def test_fused_prompts_never_hit(engines, monkeypatch):
    """Fused prompts run their passes over the whole prompt: each gets a salt of its own, and stays exact."""
    cached, plain = engines
    prompts = few_shot_prompts(cached.vocab_size, n=4, seed=1)
    hits = count_hits(cached, monkeypatch)
    assert_same(cached.generate(prompts, greedy("fused", n=3)), plain.generate(prompts, greedy("fused", n=3)))
    assert hits and not any(hits), hits


def test_new_weights_never_hit_old_entries(hf_model, engines, monkeypatch):
    """The same prompts after a weight update: computed afresh (no hit on the old weights' K/V)."""
    cached, plain = engines
    prompts = few_shot_prompts(cached.vocab_size, n=6, seed=2)
    before = cached.generate(prompts, greedy("soft"))
    new = copy.deepcopy(hf_model)
    perturb(new, seed=3)
    for engine in engines:
        engine.load_weights(new.state_dict(), engine.version + 1)
    hits = count_hits(cached, monkeypatch)
    got = cached.generate(prompts, greedy("soft"))
    assert_same(got, plain.generate(prompts, greedy("soft")))
    assert max(abs(a.logprobs[0] - b.logprobs[0]) for a, b in zip(got, before)) > 1e-3
    assert max(hits) >= 2 * BLOCK, hits  # the new call's prompts do share among themselves


def test_fed_continuation_does_not_share_with_plain_tokens(engines):
    """One call with the same tokens twice: as a continuation feeding states at positions 8..15 (inside the
    first block), and as a plain prompt. Their first blocks' K/V differ; each must match the uncached engine."""
    cached, plain = engines
    g = torch.Generator().manual_seed(4)
    tokens = [1] + torch.randint(3, cached.vocab_size, (3 * BLOCK,), generator=g).tolist()
    fed = torch.zeros(len(tokens), dtype=torch.bool)
    fed[8:16] = True
    states = torch.randn(len(tokens), cached.hidden_size, generator=g)
    conts = [Continuation(states, fed), None]
    got = cached.generate([tokens, tokens], greedy("soft"), continuations=conts)
    assert_same(got, plain.generate([tokens, tokens], greedy("soft"), continuations=conts))
    assert (got[0].states[0] - got[1].states[0]).abs().max() > 1e-3  # the feeding matters


def test_cache_salts():
    """Shared per call for plain prompts; None (a salt per sample) for fused prompts, fed continuations and a
    prompt that extends another prompt of the call (it could hit blocks holding that one's generated tokens)."""
    a, b = [1, 5, 6], [1, 5, 7]
    assert cache_salts([a, b, a], "soft", None, "c") == ["c", "c", "c"]
    assert cache_salts([a, b], "fused", None, "c") == [None, None]
    assert cache_salts([a, a + [9], b], "soft", None, "c") == ["c", None, "c"]
    assert cache_salts([a, a + [9]], "standard", None, "c") == ["c", "c"]  # generated tokens are plain
    fed = Continuation(torch.zeros(3, 4), torch.tensor([False, True, False]))
    unfed = Continuation(torch.zeros(3, 4), torch.zeros(3, dtype=torch.bool))
    assert cache_salts([a, b, a], "soft", [fed, unfed, None], "c") == [None, "c", "c"]
