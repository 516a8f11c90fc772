"""Multi-turn rollouts on the torch engine (rl/train/multiturn.py, the engine's replay prefill): the learner's
`replay`, `exact` and K >= length `kpass` log-probs of every sampled token equal the engine's, turn after turn, on
episodes with three and more tool turns; and the check has the power to see a continuation that prefills earlier
generated tokens plainly.

The model is a tiny random FBT whose fusion is scaled up so that feedback visibly changes the outputs (as in
tests/test_torch_engine.py). Tolerance 1e-4 on fp32 log-probs: the replay prefill computes each earlier token's
K/V in one parallel pass where the decode computed them one at a time (same inputs, other summation order);
single-turn engine-vs-recurrence checks hold 1e-5 per token, and a continuation stacks several prefills.
"""

from dataclasses import dataclass

import pytest
import torch

from rl.data.tokenizer import build_tokenizer
from rl.estimators.likelihood import get_estimator
from rl.samples.batch import collate
from rl.samples.request import SamplingParams
from rl.train.multiturn import episode_metrics, run_episodes, stop_token_ids
from rollout.torch_engine import TorchEngine
from tests.test_torch_engine import tiny_fbt

TOL = 1e-4
TOKENIZER = build_tokenizer()
OBSERVATION = "<ok 42>"
STOPS = tuple("abcdefghijklm")  # a random tiny model writes one of these every few tokens: many short turns


@dataclass
class Outcome:
    env: object
    observation: str | None
    reward: float = 0.0
    done: bool = False
    failure: str | None = None
    kind: str = "ok"


class AnswerEveryTurn:
    """Test scaffolding for `step_envs`: answers every turn with the same observation, never ends an episode."""

    stop_strings = STOPS

    def __init__(self):
        self.texts = []

    def step(self, envs, rows, texts):
        self.texts += texts
        return [Outcome((e or 0) + 1, OBSERVATION, reward=0.5) for e in envs]


def model_and_engine():
    model = tiny_fbt(vocab=len(TOKENIZER))
    model.config.max_position_embeddings = 256
    return model, TorchEngine(model, eos_token_ids=(TOKENIZER.eos_token_id,))


def episodes(engine, max_turns=6, seed=3):
    envs = AnswerEveryTurn()
    prompts = [TOKENIZER.encode("What is 2+3?"), TOKENIZER.encode("Q: 7*6"), TOKENIZER.encode("x")]
    params = SamplingParams(
        n=2, temperature=1.0, max_tokens=80, stop_token_ids=(TOKENIZER.eos_token_id,), seed=seed, record_states=True
    )
    samples = run_episodes(
        engine,
        envs.step,
        TOKENIZER,
        prompts,
        [{"prompt": "p"}] * len(prompts),
        params,
        min_version=0,
        max_turns=max_turns,
        max_turn_tokens=12,
        env_stop_ids=stop_token_ids(TOKENIZER, STOPS),
    )
    return samples, envs


def learner_logprobs(model, batch, estimator, passes=3):
    with torch.no_grad():
        return get_estimator(estimator)(model, batch, "soft", passes=passes).logprobs


@pytest.fixture(scope="module")
def rollout():
    model, engine = model_and_engine()
    samples, envs = episodes(engine)
    return model, samples, envs


def test_episodes_take_turns_and_mask_observations(rollout):
    model, samples, envs = rollout
    assert len(samples) == 6 and [s.group_id for s in samples] == [0, 0, 1, 1, 2, 2]
    assert max(s.episode["tool_calls"] for s in samples) >= 3, [s.episode for s in samples]
    obs = TOKENIZER.encode(OBSERVATION, add_special_tokens=False)
    for s in samples:
        assert len(s.generated_mask) == s.response_len == len(s.logprobs) == s.states.shape[0]
        assert s.response_len <= 80 and s.episode["turns"] <= 6
        assert sum(s.generated_mask) + s.episode["tool_calls"] * len(obs) == s.response_len
        # every observation sits right after a turn that ended in a stop string, and carries log-prob 0
        for j in range(s.response_len - len(obs) + 1):
            if s.generated_mask[j : j + len(obs)] == [0] * len(obs) and (j == 0 or s.generated_mask[j - 1]):
                assert s.response_ids[j : j + len(obs)] == obs
                assert TOKENIZER.decode([s.response_ids[j - 1]]) in STOPS
                assert s.logprobs[j : j + len(obs)] == [0.0] * len(obs)
        # 0.5 per step: each observation appended, plus one cut by the token budget (stepped, not appended)
        assert s.episode["env_reward"] in (0.5 * s.episode["tool_calls"], 0.5 * (s.episode["tool_calls"] + 1))
    # the environment saw each turn's own text only (the sampled tokens decoded, no observation inside)
    assert envs.texts and all(OBSERVATION not in t for t in envs.texts)
    m = episode_metrics(samples)
    assert m["env/tool_calls_mean"] == pytest.approx(sum(s.episode["tool_calls"] for s in samples) / 6)
    assert 0 < m["env/observation_token_frac"] < 1


@pytest.mark.parametrize("estimator", ["replay", "exact", "kpass"])
def test_learner_logprobs_equal_the_engines_on_every_turn(rollout, estimator):
    model, samples, _ = rollout
    batch = collate(samples, with_states=True)
    passes = int(batch.response_lens.max()) + 1  # K >= length: kpass is exact
    lp = learner_logprobs(model, batch, estimator, passes)
    mask = batch.response_mask.bool()
    err = (lp - batch.engine_logprobs).abs()[mask]
    assert float(err.max()) <= TOL, (estimator, float(err.max()))
    assert float(lp[~mask].abs().max()) == 0.0  # observation tokens and padding carry no log-prob


def test_a_plain_prefill_of_earlier_turns_is_caught(monkeypatch):
    """The same episodes with the engine's replay prefill switched off (earlier generated tokens prefilled plainly):
    the engine's later turns then come from another context, and the check above fails by orders of magnitude."""
    model, engine = model_and_engine()
    monkeypatch.setattr(TorchEngine, "_replayed", lambda self, rows, P: {})
    samples, _ = episodes(engine)
    batch = collate(samples, with_states=True)
    err = (learner_logprobs(model, batch, "exact") - batch.engine_logprobs).abs()[batch.response_mask.bool()]
    assert float(err.max()) > 100 * TOL


def test_the_turn_cap_and_token_budget_hold():
    _, engine = model_and_engine()
    samples, _ = episodes(engine, max_turns=2, seed=5)
    for s in samples:
        assert s.episode["turns"] <= 2 and s.episode["tool_calls"] <= 1
        assert s.finish_reason in ("stop", "length")


def test_the_latent_channel_after_a_tool_is_measured(rollout):
    from rl.report.latent_metrics import _after_tool, latent_metrics

    model, samples, _ = rollout
    batch = collate(samples, with_states=True)
    after = _after_tool(batch)
    calls = sum(s.episode["tool_calls"] for s in samples)
    assert 0 < int(after.sum()) <= calls  # (an observation may end its episode before an answer)
    for b, s in enumerate(samples):
        for j in after[b].nonzero()[:, 0].tolist():
            assert s.generated_mask[j] == 1 and s.generated_mask[j - 1] == 0
    m = latent_metrics(model, batch, max_rows=len(batch))
    assert m["policy_shift_after_tool"] > 0
    assert ("state_share_after_tool" in m) == (model.fusion.mode != "gate_product")  # (gate_product: no share)
