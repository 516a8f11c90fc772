"""Learner micro-batches by token budget (rl/train/update_plan.py `plan_update`): every rank makes the same calls, no
estimator call (old, reference or policy log-probs) ever sees more than one micro-batch, and splitting the
batch over ranks and micro-batches leaves the summed gradient unchanged.

Model: the committed checkpoints/tiny-arith. The gradient comparison runs in float64: the parts sum the same
per-token terms in another order and over differently padded shapes, which in fp32 moved single entries by
2e-5 of the largest; in float64 that rounding is ~1e-13, so 1e-9 relative to the largest gradient entry is a
tight bound, while a row counted twice, lost, or normalised by a local count changes gradients by O(1/rows).
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import TINY_ARITH
from transformers import AutoModelForCausalLM

import rl.model  # noqa: F401
import rl.train.policy_update as learner_mod
from rl.config import ConfigError, load_config
from rl.samples.batch import Sample
from rl.train.policy_update import PolicyUpdater
from rl.train.update_plan import plan_update

CKPT = str(TINY_ARITH)


def mixed_samples(n=20, seed=0, d=128):
    """GRPO-shaped rows (groups of 4) of very mixed lengths, with recorded states of the right scale."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        P = int(torch.randint(3, 12, (1,), generator=g))
        R = int(torch.randint(1, 40, (1,), generator=g))
        out.append(
            Sample(
                [1] + torch.randint(3, 60, (P - 1,), generator=g).tolist(),
                torch.randint(3, 60, (R,), generator=g).tolist(),
                (-torch.rand(R, generator=g)).tolist(),
                "stop",
                1,
                states=torch.randn(R, d, generator=g),
                group_id=i // 4,
                sample_index=i % 4,
            )
        )
    return out


def test_plan_covers_every_row_once_within_budgets_and_equal_counts():
    lengths = [5, 60, 7, 33, 12, 90, 3, 41, 8, 8, 70, 2, 15]
    responses = [2, 50, 1, 30, 6, 20, 1, 11, 7, 4, 60, 1, 10]
    for world in (1, 2, 3):
        for minis in (1, 2):
            plan = plan_update(
                lengths, minis, world, max_rows=4, max_tokens=120, response_lengths=responses, max_response_tokens=50
            )
            seen = []
            for m, mini in enumerate(plan.minibatches):
                counts = {len(plan.rank_micro_batches(m, r)) for r in range(world)}
                assert len(counts) == 1, f"ranks make different numbers of calls: {counts}"
                for r in range(world):
                    for rows in plan.rank_micro_batches(m, r):
                        assert set(rows) <= set(mini)
                        assert len(rows) <= 4
                        assert len(rows) <= 1 or len(rows) * max(lengths[i] for i in rows) <= 120
                        assert len(rows) <= 1 or sum(responses[i] for i in rows) <= 50
                        seen += rows
            assert sorted(seen) == list(range(len(lengths)))
    # tokens are balanced over ranks: the heaviest rank carries at most the lightest's + one row
    plan = plan_update(lengths, 1, 2, max_rows=None, max_tokens=None)
    loads = [sum(lengths[i] for i in plan.rank_rows(0, r)) for r in range(2)]
    assert max(loads) - min(loads) <= max(lengths)


def test_config_keys():
    for key in ("max_tokens_per_micro_batch", "max_response_tokens_per_micro_batch"):
        assert getattr(load_config(None, [f"learner.{key}=512"]).learner, key) == 512
        assert getattr(load_config(None, [f"learner.{key}=null"]).learner, key) is None
        with pytest.raises(ConfigError, match=key):
            load_config(None, [f"learner.{key}=0"])
    with pytest.raises(ConfigError, match="likelihood.micro_batch_size: removed"):
        load_config(None, ["likelihood.micro_batch_size=8"])


class RecordingBackend:
    """Gradients of each optimizer step, summed over micro-batches (no optimizer: weights stay put)."""

    def __init__(self, model, world_size=1):
        self.model, self.world_size = model, world_size
        self.steps, self.backwards = [], 0

    def backward(self, loss):
        self.backwards += 1
        loss.backward()

    def step(self):
        self.steps.append(
            {
                k: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
                for k, p in self.model.named_parameters()
            }
        )
        self.model.zero_grad(set_to_none=True)
        return 1.0


def cfg_for(*overrides):
    return load_config(
        "configs/tiny.yaml", [f"model.path={CKPT}", "algo.kl_coef=0.05", "algo.mini_batches=2", *overrides]
    )


def test_no_estimator_call_sees_more_than_a_micro_batch(monkeypatch):
    """Old (behaviour), reference and policy log-probs all go through the micro-batches. Fails on main: old and
    reference log-probs were computed on the whole batch in one call ([B, R, V] on every rank)."""
    model = AutoModelForCausalLM.from_pretrained(CKPT, dtype=torch.float32)
    samples = mixed_samples()
    calls = []
    real = learner_mod.get_estimator

    def recording(name):
        est = real(name)

        def wrapped(model, batch, *a, **kw):
            calls.append(
                (name, len(batch), int(batch.attention_mask.sum(-1).max()) * len(batch), int(batch.response_mask.sum()))
            )
            return est(model, batch, *a, **kw)

        return wrapped

    monkeypatch.setattr(learner_mod, "get_estimator", recording)
    adv = torch.randn(len(samples)).tolist()
    cfg = cfg_for("learner.micro_batch_size=4")  # on main too: rows only
    PolicyUpdater(model, cfg, 0, ref_model=copy.deepcopy(model)).update(samples, adv, RecordingBackend(model))
    assert max(c[1] for c in calls) <= 4, calls
    assert {c[0] for c in calls} == {"replay", "exact"}  # policy (old + update) and the exact reference
    calls.clear()
    budget, response_budget = 160, 60
    cfg = cfg_for(
        "learner.micro_batch_size=64",
        f"learner.max_tokens_per_micro_batch={budget}",
        f"learner.max_response_tokens_per_micro_batch={response_budget}",
    )
    PolicyUpdater(model, cfg, 0, ref_model=copy.deepcopy(model)).update(samples, adv, RecordingBackend(model))
    assert all(c[2] <= budget or c[1] == 1 for c in calls), calls
    assert all(c[3] <= response_budget or c[1] == 1 for c in calls), calls
    assert sum(c[1] for c in calls) == 3 * len(samples)  # old, reference and policy: every row once each


def test_ranks_and_micro_batches_sum_to_the_whole(tmp_path):
    """2 simulated ranks x token-budget micro-batches (with KL, two mini-batches, old log-probs) == 1 rank with
    one micro-batch per mini-batch: per optimizer step, the ranks' gradients sum to the single rank's, and both
    ranks make the same number of backward and step calls."""
    samples = mixed_samples(n=11, seed=1)  # odd count: one rank is a row short, so it runs an empty micro-batch
    adv = torch.randn(len(samples), generator=torch.Generator().manual_seed(2)).tolist()
    base = AutoModelForCausalLM.from_pretrained(CKPT, dtype=torch.float64).train()
    ref = copy.deepcopy(base).eval()
    with torch.no_grad():  # the policy differs from the reference, so the KL term has a gradient
        for p in base.parameters():
            p.mul_(1.02)

    def run(world, rank, *overrides):
        model = copy.deepcopy(base)
        backend = RecordingBackend(model, world)
        metrics = PolicyUpdater(model, cfg_for(*overrides), 0, ref_model=ref).update(samples, adv, backend, rank)
        # the weights never move here, so the behaviour log-probs computed up front (this rank's rows, by
        # micro-batch) must equal the policy's at every micro-batch: ratio exactly 1 up to float64 rounding
        assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-9)
        return backend

    plan = plan_update(
        [s.prompt_len + s.response_len for s in samples], 2, 2, 3, 100, [s.response_len for s in samples], 60
    )
    assert any(not rows for m in range(2) for r in range(2) for rows in plan.rank_micro_batches(m, r))
    whole = run(
        1,
        0,
        "learner.micro_batch_size=64",
        "learner.max_tokens_per_micro_batch=null",
        "learner.max_response_tokens_per_micro_batch=null",
    )
    parts = [
        run(
            2,
            r,
            "learner.micro_batch_size=3",
            "learner.max_tokens_per_micro_batch=100",
            "learner.max_response_tokens_per_micro_batch=60",
        )
        for r in (0, 1)
    ]
    assert parts[0].backwards == parts[1].backwards and len(parts[0].steps) == len(parts[1].steps) == 2
    assert parts[0].backwards > 2  # really split
    for step in range(2):
        for k, want in whole.steps[step].items():
            got = parts[0].steps[step][k] + parts[1].steps[step][k]
            scale = float(want.abs().max()) or 1.0
            assert float((got - want).abs().max()) <= 1e-9 * scale, (step, k)
