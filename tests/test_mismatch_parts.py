"""The rollout / learner mismatch taken apart (rl/estimators/mismatch_parts.py), without a job: the parts by hand,
the diagnostic rows and their token budget, the kept weight versions, and which passes the probe runs (the rows of
the current version share one exact recurrence; in standard decoding the estimator is that same plain forward).
The parts inside real jobs, synchronous and asynchronous: tests/test_async.py."""

import dataclasses

import pytest
import torch
from conftest import ROOT, TINY_ARITH_MIXED

from rl.algos import mismatch_decomposition
from rl.estimators.mismatch_parts import WeightHistory, diagnostic_rows

CKPT = str(TINY_ARITH_MIXED)


# ---- the parts, by hand ------------------------------------------------------------------------------------------


def test_mismatch_decomposition_by_hand():
    # float64 inputs: the hand values below are exact to ~1e-16 (float32 would round 0.001 to ~3e-8 relative)
    D = torch.float64
    engine = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]], dtype=D)
    # kernels: same sign on both tokens, so no part's |Δ| sum equals another mixing of the same differences
    then = engine + torch.tensor([[0.001, 0.002], [0.0, 0.0]], dtype=D)
    now = then + torch.tensor([[0.1, 0.3], [-0.2, 0.0]], dtype=D)  # the policy moved
    est = now + torch.tensor([[0.0, 0.02], [0.01, 0.0]], dtype=D)  # the estimator's error
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # row 1's second token is padding
    out = mismatch_decomposition(engine, then, now, est, mask)
    assert out["engine"] == pytest.approx(0.003 / 3) and out["engine_signed"] == pytest.approx(0.003 / 3)
    assert out["staleness"] == pytest.approx(0.6 / 3) and out["staleness_signed"] == pytest.approx(0.2 / 3)
    assert out["estimator"] == pytest.approx(0.03 / 3) and out["estimator_signed"] == pytest.approx(0.03 / 3)
    assert out["total_signed"] == pytest.approx(
        out["engine_signed"] + out["staleness_signed"] + out["estimator_signed"]
    )
    assert out["total"] == pytest.approx((0.101 + 0.322 + 0.19) / 3)
    # rows whose sampling weights are unknown count in the estimator part and the total only
    out = mismatch_decomposition(engine, then, now, est, mask, then_known=torch.tensor([True, False]))
    assert out["staleness"] == pytest.approx(0.4 / 2) and out["estimator"] == pytest.approx(0.03 / 3)


def test_diagnostic_rows_stay_within_the_token_budget():
    from rl.estimators.mismatch_parts import within_token_budget

    lengths = [10, 40, 30, 5, 50]
    assert within_token_budget([0, 1, 2, 3], lengths, 80) == [0, 1, 2]  # 80 tokens; row 3 would make 85
    assert within_token_budget([4, 0], lengths, 20) == [4]  # the first row always: parts every step
    assert within_token_budget([0, 1, 2], lengths, 0) == [0, 1, 2]  # 0: no budget
    assert within_token_budget([], lengths, 10) == []


def test_weight_history_keeps_the_last_versions():
    h = WeightHistory(2)
    for v in (1, 2, 3):
        h.record(v, {"w": torch.full((1,), float(v))})
    assert h.versions() == [2, 3] and h.get(1) is None and float(h.get(2)["w"]) == 2.0
    h.record(3, {"w": torch.zeros(1)})  # a skipped step records the same version again
    assert h.versions() == [2, 3]
    h.record(6, {"w": torch.zeros(1)})  # versions 4, 5 never trained here (a restore): 2, 3 are too old now
    assert h.versions() == [6]


def test_diagnostic_rows():
    assert diagnostic_rows(256, 0.0625, 0, 3) == diagnostic_rows(256, 0.0625, 0, 3)
    assert len(diagnostic_rows(256, 0.0625, 0, 3)) == 16 and diagnostic_rows(256, 0.0625, 0, 4) != diagnostic_rows(
        256, 0.0625, 0, 3
    )
    assert len(diagnostic_rows(5, 0.01, 0, 1)) == 1 and diagnostic_rows(5, 0.0, 0, 1) == []
    assert diagnostic_rows(0, 0.5, 0, 1) == []


def test_rows_of_the_current_version_run_the_exact_recurrence_once():
    """Rows drawn with the current weights take exact(θ_v) = exact(θ_V) from the one recurrence under those
    weights (their staleness part is exactly 0); a row from an older version still gets its own."""
    from rl.config import load_config
    from rl.estimators.mismatch_parts import MismatchProbe
    from rl.model.files import load_fbt, pad_id_of
    from rl.samples.request import SamplingParams
    from rollout.torch_engine import TorchEngine

    cfg = load_config(str(ROOT / "configs" / "tiny.yaml"), [f"model.path={CKPT}", "train.max_staleness=1"])
    model = load_fbt(CKPT)
    params = SamplingParams(
        n=2, temperature=1.0, max_tokens=8, stop_token_ids=(2,), seed=3, decode_mode="soft", record_states=True
    )
    samples = TorchEngine(model).generate([[1, 5, 6, 7], [1, 8, 9]], params)
    probe = MismatchProbe(cfg, lambda: load_fbt(CKPT), pad_id_of(model))
    calls = []
    run = probe._logprobs
    probe._logprobs = lambda estimator, m, batch: calls.append(estimator) or run(estimator, m, batch)
    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    out = probe.measure(samples, 0, state)
    assert calls == ["exact", "replay"] and out["staleness"] == 0.0 and out["rows_without_weights"] == 0
    calls.clear()
    for s in samples[:2]:  # drawn one version back: their own recurrence under version 0's weights
        s.policy_version = 0
    for s in samples[2:]:
        s.policy_version = 1
    probe.measure(samples, 1, state)
    assert calls == ["exact", "replay", "exact"]
    # standard decoding feeds nothing back: the estimator is the plain forward exact already ran, not run again
    standard = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, decode_mode="standard"))
    plain = TorchEngine(model).generate([[1, 5, 6, 7]], dataclasses.replace(params, decode_mode="standard"))
    probe = MismatchProbe(standard, lambda: load_fbt(CKPT), pad_id_of(model))
    run = probe._logprobs
    probe._logprobs = lambda estimator, m, batch: calls.append(estimator) or run(estimator, m, batch)
    calls.clear()
    out = probe.measure(plain, 0, state)
    assert calls == ["exact"] and out["estimator"] == 0.0 and out["engine"] < 1e-5
