"""The KL reference (algo.kl_coef > 0) is scored with its own recurrence, not the policy's recorded states.

An FBT's latent states belong to the model that computed them. Before this, with the replay estimator the
learner fed the policy's recorded states to the reference model, and k3 came out biased low (0.070 against a
true 0.349 at 5 % weight noise). Here the policy is the committed checkpoints/tiny-arith with 5 % multiplicative
weight noise, the reference the checkpoint itself; "true" is k3 of the two models' exact recurrences.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import TINY_ARITH
from transformers import AutoModelForCausalLM

import rl.model  # noqa: F401
from rl.config import ConfigError, load_config
from rl.estimators.likelihood import get_estimator
from rl.samples.batch import collate
from rl.samples.request import SamplingParams
from rl.train.policy_update import PolicyUpdater
from rollout.torch_engine import TorchEngine

CKPT = str(TINY_ARITH)


class NoStep:
    """A backend that accumulates gradients and drops them: the update's metrics without moving the policy."""

    world_size = 1

    def __init__(self, model):
        self.model = model

    def backward(self, loss):
        loss.backward()

    def step(self):
        self.model.zero_grad(set_to_none=True)
        return 1.0


@pytest.fixture(scope="module")
def setup():
    ref = AutoModelForCausalLM.from_pretrained(CKPT, dtype=torch.float32).eval()
    policy = copy.deepcopy(ref)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(1 + 0.05 * torch.randn_like(p))
    g = torch.Generator().manual_seed(1)
    prompts = [
        [1] + torch.randint(3, 60, (int(torch.randint(4, 10, (1,), generator=g)),), generator=g).tolist()
        for _ in range(6)
    ]
    samples = TorchEngine(policy, eos_token_ids=()).generate(
        prompts, SamplingParams(n=2, temperature=1.0, max_tokens=12, seed=3, record_states=True)
    )
    batch = collate(samples, 0, with_states=True)
    exact = get_estimator("exact")
    with torch.no_grad():
        pol, refp = exact(policy, batch, "soft").logprobs, exact(ref, batch, "soft").logprobs
    d = refp - pol
    true_k3 = float(((d.exp() - d - 1) * batch.response_mask).sum() / batch.response_mask.sum())
    return policy, ref, samples, true_k3


def kl_metric(policy, ref, samples, *overrides):
    cfg = load_config(
        "configs/tiny.yaml",
        [f"model.path={CKPT}", "algo.kl_coef=0.1", "algo.kl_estimator=k3", "learner.micro_batch_size=4", *overrides],
    )
    adv = [0.0] * len(samples)
    return PolicyUpdater(policy, cfg, pad_id=0, ref_model=ref).update(samples, adv, NoStep(policy))


@pytest.mark.parametrize("estimator", ["replay", "kpass", "exact"])
def test_k3_matches_the_true_kl(setup, estimator):
    """Fails on main with replay: the reference scored on the policy's states gave k3 ≈ 0.070 vs 0.349."""
    policy, ref, samples, true_k3 = setup
    assert true_k3 > 0.05  # the two models really differ
    # kpass with K > R (every position exact): the policy side must be exact for k3 to be comparable
    m = kl_metric(policy, ref, samples, f"likelihood.estimator={estimator}", "likelihood.passes=13")
    # the policy side is exact up to fp32 rounding carried along 12 tokens (~1e-5 per log-prob), the reference
    # side exact: 1 % relative is far inside the bias of before (-80 %)
    assert m["kl_loss"] == pytest.approx(true_k3, rel=1e-2), (m["kl_loss"], true_k3)


def test_kpass_reference_reports_its_error(setup):
    policy, ref, samples, true_k3 = setup
    one = kl_metric(policy, ref, samples, "likelihood.ref_estimator=kpass", "likelihood.passes=1")
    many = kl_metric(policy, ref, samples, "likelihood.ref_estimator=kpass", "likelihood.passes=13")
    assert one["ref_kpass_abs_err"] > 1e-3  # one pass is no recurrence at all
    assert many["ref_kpass_abs_err"] < 1e-4  # K > R: every position exact
    assert many["kl_loss"] == pytest.approx(true_k3, rel=1e-2)
    assert "ref_kpass_abs_err" not in kl_metric(policy, ref, samples)  # exact reference: nothing to report


def test_k1_as_a_loss_is_refused():
    with pytest.raises(ConfigError, match="zero expected gradient"):
        load_config(None, ["algo.kl_coef=0.1", "algo.kl_estimator=k1"])
    load_config(None, ["algo.kl_coef=0", "algo.kl_estimator=k1"])
