"""`PolicyUpdater` off the default path: PPO epochs and mini-batches, a KL to a reference, TIS and an entropy
bonus, each checked for what it does to the update, on real rollouts of the committed tiny checkpoint.

The default job runs one update per batch (the REINFORCE loss, no reference, no TIS, no entropy), so before
these tests the learner passed the suite with old log-probs never computed for ppo_epochs > 1, the reference
replaced by the current policy, the entropy bonus's sign flipped or TIS switched off. Gradients are read from a
backend that records the summed micro-batch gradients before its step (no clipping in between).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import TINY_ARITH
from test_learner import tiny_arith_rollouts

import rl.model  # noqa: F401
from rl import algos
from rl.config import load_config
from rl.estimators.likelihood import get_estimator
from rl.samples.batch import collate
from rl.train.policy_update import PolicyUpdater, TorchBackend

CKPT = str(TINY_ARITH)


@pytest.fixture(scope="module")
def rollouts():
    model, samples, adv = tiny_arith_rollouts()
    # the reference: the policy with 5 % relative weight noise, so KL(policy || ref) is far from 0
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * p.abs().mean() * torch.randn(p.shape, generator=g))
    return model, samples, adv, ref.requires_grad_(False)


class RecordingBackend(TorchBackend):
    """TorchBackend that keeps each step's gradient (before clipping) as one flat vector."""

    def __init__(self, model, lr, apply=True):
        super().__init__(model, lr=lr, grad_clip=0.0)
        self.grads, self.apply = [], apply

    def step(self):
        self.grads.append(
            torch.cat(
                [p.grad.flatten() if p.grad is not None else torch.zeros(p.numel()) for p in self.model.parameters()]
            ).clone()
        )
        if self.apply:
            return super().step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(self.grads[-1].norm())


def update(rollouts, overrides, samples=None, advantages=None, lr=1e-3, apply=True):
    model, base_samples, adv, ref = rollouts
    policy = copy.deepcopy(model).train()
    cfg = load_config("configs/tiny.yaml", [f"model.path={CKPT}", "learner.micro_batch_size=5", *overrides])
    backend = RecordingBackend(policy, lr, apply)
    a = adv.tolist() if advantages is None else advantages
    metrics = PolicyUpdater(policy, cfg, pad_id=0, ref_model=ref if cfg.algo.kl_coef > 0 else None).update(
        samples or base_samples, a, backend
    )
    return metrics, backend.grads, policy


def with_engine_shift(samples, shift):
    """Copies whose engine log-probs are the behaviour log-probs + `shift`: TIS weight exp(-shift) per token."""
    out = []
    for s in samples:
        s2 = copy.copy(s)
        s2.logprobs = [lp + shift for lp in s.logprobs]
        out.append(s2)
    return out


def token_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def cosine(a, b):
    return float(a @ b / (a.norm() * b.norm()))


def test_ppo_epochs_mini_batches_kl_tis_entropy_together(rollouts):
    model, samples, adv, ref = rollouts
    overrides = [
        "algo.ppo_epochs=2",
        "algo.mini_batches=2",
        "algo.kl_coef=0.05",
        "algo.tis_cap=2.0",
        "algo.entropy_coef=0.01",
        "algo.eps_low=0.05",
        "algo.eps_high=0.05",
    ]
    # engine log-probs log 2 above the behaviour ones: every TIS weight is exactly exp(-log 2) = 0.5.
    # lr 1e-5 (Adam's first steps move every weight ~lr): measured approx_kl 0.003, clipped 0.037 + 0.013,
    # kl_loss 0.062 against the starting k3 0.074
    metrics, grads, _ = update(rollouts, overrides, with_engine_shift(samples, math.log(2.0)), lr=1e-5)
    assert metrics["optimizer_steps"] == 4 and len(grads) == 4
    # old log-probs are the behaviour policy's, fixed over the 4 steps: after the first step the ratio moves
    # (0 clipped and approx_kl 0 exactly when the loss compares the policy with itself)
    assert metrics["approx_kl"] > 1e-4, metrics["approx_kl"]
    assert metrics["pg_clipfrac_low"] + metrics["pg_clipfrac_high"] > 0, metrics
    # KL against the true reference: ~ the k3 of the starting policy vs ref (the policy moves a little in 4
    # steps); against the current policy it would be of the order of approx_kl, 25x smaller
    batch = collate(samples, 0, with_states=True)
    with torch.no_grad():
        lp0 = get_estimator("exact")(model, batch, "soft").logprobs
        lpr = get_estimator("exact")(ref, batch, "soft").logprobs
    kl0 = float(token_mean(algos.kl_k3(lp0, lpr), batch.response_mask))
    assert kl0 > 10 * metrics["approx_kl"], (kl0, metrics["approx_kl"])
    assert 0.5 * kl0 < metrics["kl_loss"] < 1.5 * kl0, (metrics["kl_loss"], kl0)
    # TIS applied: the mean weight is 0.5 (1.0 when off); the engine/learner gap is the shift
    assert metrics["is/weight_mean"] == pytest.approx(0.5, abs=1e-3)
    assert metrics["mismatch/abs_logp_diff"] == pytest.approx(math.log(2.0), abs=1e-3)
    assert metrics["entropy"] > 0


def test_tis_weights_scale_the_policy_gradient(rollouts):
    _, samples, _, _ = rollouts
    _, (g_off,), _ = update(rollouts, [], with_engine_shift(samples, math.log(2.0)), apply=False)
    _, (g_tis,), _ = update(rollouts, ["algo.tis_cap=2.0"], with_engine_shift(samples, math.log(2.0)), apply=False)
    # every weight is 0.5, so the whole gradient halves (tolerance: the torch engine's log-probs are ~1e-5
    # from the learner's, so the weights are 0.5 to ~1e-5)
    assert float(g_tis.norm() / g_off.norm()) == pytest.approx(0.5, abs=1e-3)
    assert cosine(g_tis, g_off) > 0.9999
    # a weight above 1 (engine below the learner) is capped at tis_cap
    _, (g_cap,), _ = update(rollouts, ["algo.tis_cap=1.5"], with_engine_shift(samples, -math.log(4.0)), apply=False)
    assert float(g_cap.norm() / g_off.norm()) == pytest.approx(1.5, abs=2e-3)


def test_entropy_bonus_gradient_raises_entropy(rollouts):
    model, samples, _, _ = rollouts
    zero = [0.0] * len(samples)  # no policy-gradient term: the step is the entropy bonus alone
    _, (g,), _ = update(rollouts, ["algo.entropy_coef=0.1"], advantages=zero, apply=False)
    policy = copy.deepcopy(model).train()
    batch = collate(samples, 0, with_states=True)
    out = get_estimator("replay")(policy, batch, "soft", with_entropy=True, entropy_grad=True)
    token_mean(out.entropy, batch.response_mask).backward()
    grad_entropy = torch.cat(
        [p.grad.flatten() if p.grad is not None else torch.zeros(p.numel()) for p in policy.parameters()]
    )
    # loss = -0.1 * mean entropy: its gradient is -0.1 x the entropy's (descending it raises the entropy)
    assert cosine(g, grad_entropy) < -0.999
    assert float(g.norm() / grad_entropy.norm()) == pytest.approx(0.1, rel=1e-3)


def test_kl_gradient_pulls_toward_the_reference(rollouts):
    model, samples, _, ref = rollouts
    zero = [0.0] * len(samples)
    _, (g,), _ = update(rollouts, ["algo.kl_coef=0.1"], advantages=zero, apply=False)
    policy = copy.deepcopy(model).train()
    batch = collate(samples, 0, with_states=True)
    with torch.no_grad():
        lpr = get_estimator("exact")(ref, batch, "soft").logprobs
    lp = get_estimator("replay")(policy, batch, "soft").logprobs
    token_mean(algos.kl_k3(lp, lpr), batch.response_mask).backward()
    grad_kl = torch.cat(
        [p.grad.flatten() if p.grad is not None else torch.zeros(p.numel()) for p in policy.parameters()]
    )
    # loss = 0.1 * k3(policy, ref): its gradient is +0.1 x the KL's (descending it lowers the KL)
    assert cosine(g, grad_kl) > 0.999
    assert float(g.norm() / grad_kl.norm()) == pytest.approx(0.1, rel=1e-3)
