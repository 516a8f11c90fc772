"""One rank's policy update on real rollouts: the step moves probability toward positive-advantage samples,
the same way for every estimator, and a batch with no signal leaves the weights untouched (loop's skip)."""

import copy

import pytest
import torch
from conftest import TINY_ARITH

import rl.model  # noqa: F401
from rl import algos
from rl.config import load_config
from rl.estimators.likelihood import get_estimator
from rl.samples.batch import collate
from rl.samples.request import SamplingParams
from rl.train.policy_update import PolicyUpdater, TorchBackend
from rollout.torch_engine import TorchEngine

CKPT = str(TINY_ARITH)


@pytest.fixture(scope="module")
def rollouts():
    return tiny_arith_rollouts()


def tiny_arith_rollouts():
    """(model, 24 sampled rollouts with recorded states, GRPO advantages) of the committed tiny checkpoint; also
    the starting point of tests/test_updater_terms.py."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(CKPT).eval()
    torch.manual_seed(0)
    prompts = [[1] + torch.randint(4, 90, (6,)).tolist() for _ in range(6)]
    samples = TorchEngine(copy.deepcopy(model)).generate(
        prompts, SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=3, record_states=True)
    )
    # a reward the policy can learn: responses whose first token id is even
    reward = torch.tensor([float(s.response_ids[0] % 2 == 0) for s in samples])
    adv = algos.compute_advantages(reward, torch.tensor([s.group_id for s in samples]), "grpo")
    return model, samples, adv


@pytest.mark.parametrize("estimator", ["replay", "kpass", "exact"])
def test_update_moves_probability_toward_positive_advantages(rollouts, estimator):
    model, samples, adv = rollouts
    assert (adv > 0).any() and (adv < 0).any()
    policy = copy.deepcopy(model).train()
    cfg = load_config("configs/tiny.yaml", [f"likelihood.estimator={estimator}", "learner.micro_batch_size=5"])
    batch = collate(samples, 0, with_states=True)
    logp = lambda: get_estimator(estimator)(policy, batch, "soft").logprobs.sum(-1)  # noqa: E731
    with torch.no_grad():
        before = logp()
    metrics = PolicyUpdater(policy, cfg, pad_id=0).update(samples, adv.tolist(), TorchBackend(policy, lr=1e-5))
    with torch.no_grad():
        delta = logp() - before
    assert metrics["optimizer_steps"] == 1 and metrics["grad_norm"] > 0
    assert delta[adv > 0].mean() > 0 > delta[adv < 0].mean(), (estimator, delta, adv)


def test_an_estimator_registered_as_needing_states_receives_them(rollouts):
    """The capability on the registry entry is all it takes: the training request records states and the
    update's micro-batches carry them, with no edit outside the registration (and an estimator without the
    capability gets none)."""
    from rl.estimators import likelihood
    from rl.train.requests import sampling_params

    model, samples, adv = rollouts
    seen: dict[str, list[bool]] = {"test_with_states": [], "test_without_states": []}
    for name, needs in (("test_with_states", True), ("test_without_states", False)):

        def hidden(model, batch, decode_mode, passes, name=name):
            seen[name].append(batch.states is not None)
            return likelihood.response_hidden(model, batch, decode_mode, "exact", passes)

        likelihood.register_estimator(name, needs_states=needs)(hidden)
    try:
        for name, needs in (("test_with_states", True), ("test_without_states", False)):
            cfg = load_config("configs/tiny.yaml", ["learner.micro_batch_size=5"])
            cfg.likelihood.estimator = name
            assert sampling_params(cfg, eos_id=2).record_states is needs
            policy = copy.deepcopy(model).train()
            PolicyUpdater(policy, cfg, pad_id=0).update(samples, adv.tolist(), TorchBackend(policy, lr=1e-5))
            assert seen[name] and set(seen[name]) == {needs}, (name, seen[name])
    finally:
        for name in seen:
            likelihood.ESTIMATORS.pop(name, None)
