"""Multi-turn continuations and preemption in the vLLM engine: the replay prefill (rollout/vllm_plugin.py).

A continuation prompt is [prompt][turn 1][observation 1]...: its prefill must fuse, at each token the policy
generated, the state recorded for it (rl/samples/continuation.py). Oracles: the torch engine on the same inputs,
and the exact recurrence over the whole multi-turn sequence (the learner's `exact` estimator, which feeds back at
generated positions only). Tolerance: as tests/test_vllm_engine.py (vLLM's kernels round differently at ~1e-6
in fp32; 1e-4 leaves margin over a chain of turns), while prefilling the generated tokens plainly moves the
next turn's log-probs by > 1e-3 (asserted, so the comparison can tell the two apart).
"""

from __future__ import annotations

import glob
import os

import pytest
import torch

pytest.importorskip("vllm")

from test_vllm_engine import ON_GPU, TINY_ARITH, make_prompts, random_tiny_fbt  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import rl.model  # noqa: E402,F401  (registers fbt_llama with the Auto classes)
from rl.estimators.likelihood import response_hidden, token_logprobs  # noqa: E402
from rl.samples.batch import Sample, collate  # noqa: E402
from rl.samples.continuation import Continuation, continuation_of  # noqa: E402
from rl.samples.request import SamplingParams  # noqa: E402
from rollout.torch_engine import TorchEngine  # noqa: E402
from rollout.vllm_engine import VLLMEngine  # noqa: E402

TOL = 1e-4
MAX_LEN = 128
TURN_TOKENS = 8
OBS_TOKENS = 4


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


@pytest.fixture(scope="module")
def engine(ckpt):
    eng = VLLMEngine(ckpt, max_model_len=MAX_LEN, max_num_seqs=16, dtype="float32", seed=0, **ON_GPU)
    yield eng
    eng.close()


def greedy(n: int = 1, max_tokens: int = TURN_TOKENS, mode: str = "soft") -> SamplingParams:
    return SamplingParams(n=n, temperature=0.0, max_tokens=max_tokens, decode_mode=mode, record_states=True)


def observation(vocab: int, turn: int, i: int) -> list[int]:
    """An environment's reply: tokens >= 3 (no pad / eos / bos), different per sequence and turn."""
    g = torch.Generator().manual_seed(1000 * turn + i)
    return torch.randint(3, vocab, (OBS_TOKENS,), generator=g).tolist()


def appended(conv: Sample | None, turn: Sample, obs: list[int]) -> Sample:
    """The multi-turn sample `conv` (None: the turn is the first) with `turn`'s tokens and then `obs` appended."""
    prev_ids = conv.response_ids if conv else []
    prev_lp = conv.logprobs if conv else []
    prev_mask = conv.generated if conv else []
    prev_states = conv.states if conv else turn.states[:0]
    obs_states = turn.states.new_zeros(len(obs), turn.states.shape[1])
    return Sample(
        prompt_ids=conv.prompt_ids if conv else turn.prompt_ids,
        response_ids=prev_ids + turn.response_ids + obs,
        logprobs=prev_lp + turn.logprobs + [0.0] * len(obs),
        finish_reason=turn.finish_reason,
        policy_version=turn.policy_version,
        states=torch.cat([prev_states, turn.states, obs_states]),
        generated_mask=prev_mask + [1] * turn.response_len + [0] * len(obs),
    )


def assert_turns_agree(got: list[Sample], want: list[Sample]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.response_ids == w.response_ids, (g.prompt_ids, g.response_ids, w.response_ids)
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs)) < TOL
        assert (g.states - w.states).abs().max() < TOL


def exact_logprobs(model, conv: Sample) -> torch.Tensor:
    """The learner's exact recurrence over the whole multi-turn sample: [R] log-probs, 0 at observations."""
    batch = collate([conv])
    with torch.no_grad():
        h = response_hidden(model, batch, "soft", "exact")
        return token_logprobs(model, h, batch, temperature=0.0).logprobs[0, : conv.response_len]


def run_turns(engine, hf_model, prompts, n_turns: int):
    """Turn 1 from the prompts, then `n_turns - 1` continuations after an observation each, on vLLM and the torch
    engine fed the same inputs (those built from vLLM's samples). Returns vLLM's multi-turn samples."""
    torch_engine = TorchEngine(hf_model)
    vocab = hf_model.config.vocab_size
    convs = [None] * len(prompts)
    inputs, conts = prompts, None
    for turn in range(n_turns):
        got = engine.generate(inputs, greedy(), continuations=conts)
        assert not any(s.preempted for s in got)
        assert_turns_agree(got, torch_engine.generate(inputs, greedy(), continuations=conts))
        if turn == n_turns - 1:
            return [appended(c, s, []) for c, s in zip(convs, got)]
        convs = [appended(c, s, observation(vocab, turn, i)) for i, (c, s) in enumerate(zip(convs, got))]
        inputs, conts = map(list, zip(*[continuation_of(c) for c in convs]))


def test_continuations_match_torch_engine_and_recurrence(engine, hf_model):
    """Three tool turns after the first: every turn matches the torch engine on the same continuation inputs,
    and the whole multi-turn sequence matches the exact recurrence (feedback at generated tokens only)."""
    prompts = make_prompts(engine.vocab_size, n=6, seed=11)
    convs = run_turns(engine, hf_model, prompts, n_turns=4)
    for conv in convs:
        assert conv.response_len == 4 * TURN_TOKENS + 3 * OBS_TOKENS or conv.finish_reason == "stop"
        gen = torch.tensor(conv.generated, dtype=torch.bool)
        lp = torch.tensor(conv.logprobs)
        assert (exact_logprobs(hf_model, conv)[gen] - lp[gen]).abs().max() < TOL


def test_plain_prefill_of_generated_tokens_is_told_apart(engine, hf_model):
    """The same continuation prefilled plainly (states not fused) gives other log-probs, by far more than TOL:
    the comparisons above would catch a plugin that ignored `fed`."""
    prompts = make_prompts(engine.vocab_size, n=6, seed=12)
    first = engine.generate(prompts, greedy())
    convs = [appended(None, s, observation(engine.vocab_size, 0, i)) for i, s in enumerate(first)]
    inputs, conts = map(list, zip(*[continuation_of(c) for c in convs]))
    plain = [Continuation(c.states, torch.zeros_like(c.fed)) for c in conts]
    fed = engine.generate(inputs, greedy(), continuations=conts)
    unfed = engine.generate(inputs, greedy(), continuations=plain)
    assert_turns_agree(unfed, engine.generate(inputs, greedy()))  # no fed position: an ordinary prompt
    gaps = [abs(a.logprobs[0] - b.logprobs[0]) for a, b in zip(fed, unfed)]
    assert max(gaps) > 1e-3, gaps


def test_group_shares_a_continuation_and_the_file_path(engine, hf_model, monkeypatch):
    """n samples of one continuation all fuse it; a worker in another process gets the states through a
    scratch file (deleted once read) and computes the same."""
    from rollout.vllm_env import scratch_dir

    prompts = make_prompts(engine.vocab_size, n=3, seed=13)
    first = engine.generate(prompts, greedy())
    convs = [appended(None, s, observation(engine.vocab_size, 0, i)) for i, s in enumerate(first)]
    inputs, conts = map(list, zip(*[continuation_of(c) for c in convs]))
    want = TorchEngine(hf_model).generate(inputs, greedy(n=2), continuations=conts)
    assert_turns_agree(engine.generate(inputs, greedy(n=2), continuations=conts), want)
    monkeypatch.setattr(engine, "inline_states", False)
    assert_turns_agree(engine.generate(inputs, greedy(n=2), continuations=conts), want)
    assert glob.glob(os.path.join(scratch_dir(), f"fbrl_*_{engine._uid}_*")) == []


def test_bad_continuations_are_refused(engine):
    prompts = make_prompts(engine.vocab_size, n=3, seed=14)[1:]  # lengths 2 and 24
    d = engine.hidden_size
    fed = Continuation(torch.zeros(2, d), torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="soft mode only"):
        engine.generate(prompts, greedy(mode="fused"), continuations=[fed, None])
    with pytest.raises(ValueError, match=r"continuations\[1\]: 2 positions"):
        engine.generate(prompts, greedy(), continuations=[None, fed])
