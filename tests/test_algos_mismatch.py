"""The train / rollout mismatch in rl/algos: its metrics and the off-policy corrections (TIS, masks, IcePop,
sequence-masked IS) against numbers worked out by hand; the ratio's denominator is the engine's log-prob of the
sampling version. (Split from tests/test_algos.py, whose loader and helpers it uses.)"""

import math

import pytest
import torch
from test_algos import A, D, close

# ---- train / rollout mismatch -------------------------------------------------------------------------------

# Δ = learner − engine per token: seq A [0.1, −0.3], seq B [0.0, 0.2]; ratios 1.105, 0.741, 1.0, 1.221.
ENGINE = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]], dtype=D)
LEARNER = ENGINE + torch.tensor([[0.1, -0.3], [0.0, 0.2]], dtype=D)


def test_mismatch_metrics_by_hand():
    met = A.mismatch_metrics(LEARNER, ENGINE, torch.ones(2, 2))
    close(met["mismatch/abs_logp_diff"], (0.1 + 0.3 + 0.0 + 0.2) / 4)
    k3 = [math.exp(d) - 1 - d for d in (0.1, -0.3, 0.0, 0.2)]
    close(met["mismatch/k3"], sum(k3) / 4)
    close(met["mismatch/ratio_outside_frac"], 2 / 4)  # 0.741 and 1.221 fall outside [0.8, 1.2]
    # sequence weights e^−0.2, e^0.2: ESS/N = (Σw)²/(N Σw²) = cosh²(0.2)/cosh(0.4)
    close(met["mismatch/seq_ess"], math.cosh(0.2) ** 2 / math.cosh(0.4))
    same = A.mismatch_metrics(ENGINE, ENGINE, torch.ones(2, 2))
    assert same["mismatch/abs_logp_diff"] == 0 and same["mismatch/seq_ess"] == pytest.approx(1.0)


def test_tis_and_masking_by_hand():
    ones = torch.ones(2, 2)
    w, m = A.rollout_correction(LEARNER, ENGINE, ones, "truncate", "token", cap=1.15)
    close(w, [[math.exp(0.1), math.exp(-0.3)], [1.0, 1.15]])
    assert m.all()
    w, _ = A.rollout_correction(LEARNER, ENGINE, ones, "truncate", "sequence", cap=1.15)
    close(w, [[math.exp(-0.2)] * 2, [1.15] * 2])
    _, m = A.rollout_correction(LEARNER, ENGINE, ones, "mask", "token", bounds=(0.8, 1.2))
    assert m.tolist() == [[True, False], [True, False]]
    _, m = A.rollout_correction(LEARNER, ENGINE, ones, "mask", "sequence", bounds=(0.8, 1.2))
    assert m.tolist() == [[True, True], [False, False]]  # Π r: e^−0.2 = 0.819 in, e^0.2 = 1.221 out
    _, m = A.rollout_correction(LEARNER, ENGINE, ones, "mask", "geometric", bounds=(0.8, 1.2))
    assert m.all()  # exp(mean): e^∓0.1 both inside

    # applied in the loss: reinforce, A = 1, logp = [[−1, −2], [−0.5, −1.5]] on-policy vs the learner old logp.
    logp = LEARNER.clone().requires_grad_()
    adv = torch.ones(2, dtype=D)
    cfg = A.PolicyLossConfig(loss_type="reinforce", is_mode="truncate", is_cap=1.15)
    loss, met = A.compute_policy_loss(logp, None, adv, ones, cfg, engine_logp=ENGINE)
    wts = [math.exp(0.1), math.exp(-0.3), 1.0, 1.15]
    close(loss, -sum(wi * li for wi, li in zip(wts, LEARNER.flatten().tolist())) / 4)
    close(met["is/weight_mean"], sum(wts) / 4)
    close(met["mismatch/ratio_outside_frac"], 0.5)
    loss.backward()
    close(logp.grad.flatten(), [-wi / 4 for wi in wts])  # weights are constants: no gradient through them

    cfg = A.PolicyLossConfig(loss_type="reinforce", is_mode="mask", is_bounds=(0.8, 1.2))
    loss, met = A.compute_policy_loss(LEARNER, None, adv, ones, cfg, engine_logp=ENGINE)
    close(loss, -(LEARNER[0, 0] + LEARNER[1, 0]) / 4)  # masked tokens weigh 0, denominator unchanged
    close(met["is/masked_frac"], 0.5)


def test_mismatch_on_padded_rows_and_extreme_ratios():
    # row 0 has one real token: padding must add nothing to its sequence log ratio (whatever the fill value)
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    learner = torch.tensor([[-1.0, -5.0], [-1.0, -2.0]], dtype=D)
    engine = torch.tensor([[-1.5, -1.0], [-1.0, -2.5]], dtype=D)
    close(A.sequence_log_ratio(learner - engine, mask), [0.5, 0.5])
    w, _ = A.rollout_correction(learner, engine, mask, "truncate", "sequence", cap=10.0)
    close(w, [[math.exp(0.5), 0.0], [math.exp(0.5)] * 2])
    # geometric: the mean log ratio over each row's own tokens (row 0: one token, so its ratio itself)
    close(A.sequence_log_ratio(learner - engine, mask, "geometric"), [0.5, 0.25])
    # the token metrics average over real tokens only: |0.5|, |0|, |0.5| over 3 tokens
    met = A.mismatch_metrics(learner, engine, mask)
    close(met["mismatch/abs_logp_diff"], 1.0 / 3)
    # the ESS stays finite when sequence weights overflow float64 unshifted (log ratio 900 per sequence)
    big = A.mismatch_metrics(
        torch.full((2, 30), 30.0, dtype=D) * torch.tensor([[1.0], [0.9]], dtype=D),
        torch.zeros(2, 30, dtype=D),
        torch.ones(2, 30),
    )
    close(big["mismatch/seq_ess"], 0.5)  # one sequence's weight is e^90 times the other's: ESS/N = 1/2


def test_mask_mode_keeps_ratios_on_its_bounds():
    # ratios exactly 0.5 and 2.0 (the default bounds, inclusive) are kept; just outside, dropped
    old = torch.log(torch.tensor([[0.5, 2.0, 0.4999, 2.0001]], dtype=D))
    _, keep = A.rollout_correction(old, torch.zeros(1, 4, dtype=D), torch.ones(1, 4), "mask", "token")
    assert keep.tolist() == [[True, True, False, False]]
    # the mismatch metric's "outside" is strict too: ratios exactly on its bounds are inside
    met = A.mismatch_metrics(old, torch.zeros(1, 4, dtype=D), torch.ones(1, 4), bounds=(0.5, 2.0))
    close(met["mismatch/ratio_outside_frac"], 0.5)


def test_icepop_and_sequence_masked_is_by_hand():
    """Masked IS keeps r as the weight inside [a, b] and drops (weight 0) what falls outside: token level is IcePop,
    sequence level seq-MIS. Same Δ as above: token ratios e^0.1, e^−0.3, 1, e^0.2; sequence Π r = e^−0.2, e^0.2."""
    ones = torch.ones(2, 2)
    w, m = A.rollout_correction(LEARNER, ENGINE, ones, "mis", "token", bounds=(0.8, 1.2))
    close(w, [[math.exp(0.1), 0.0], [1.0, 0.0]])  # e^−0.3 = 0.741 < 0.8 and e^0.2 = 1.221 > 1.2 are dropped
    assert m.tolist() == [[True, False], [True, False]]
    w, m = A.rollout_correction(LEARNER, ENGINE, ones, "mis", "token", bounds=(0.5, 5.0))  # IcePop's band
    close(w, [[math.exp(0.1), math.exp(-0.3)], [1.0, math.exp(0.2)]])
    assert m.all()
    w, m = A.rollout_correction(LEARNER, ENGINE, ones, "mis", "sequence", bounds=(0.8, 1.2))
    close(w, [[math.exp(-0.2)] * 2, [0.0, 0.0]])  # sequence B's Π r = 1.221 > 1.2: the whole sequence goes
    assert m.tolist() == [[True, True], [False, False]]
    w, _ = A.rollout_correction(LEARNER, ENGINE, ones, "mis", "geometric", bounds=(0.8, 1.2))
    close(w, [[math.exp(-0.1)] * 2, [math.exp(0.1)] * 2])
    # padding weighs 0 whatever its log-probs say
    pad = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    w, m = A.rollout_correction(LEARNER, ENGINE, pad, "mis", "sequence", bounds=(0.8, 1.2))
    close(w, [[math.exp(0.1), 0.0], [0.0, 0.0]])  # sequence A is only its first token now: Π r = e^0.1
    assert m.tolist() == [[True, False], [False, False]]

    # in the loss: reinforce, A = 1, IcePop at [0.8, 1.2]: −(r·logp) summed over kept tokens / 4 (all tokens count)
    logp = LEARNER.clone().requires_grad_()
    cfg = A.PolicyLossConfig(loss_type="reinforce", is_mode="mis", is_bounds=(0.8, 1.2))
    loss, met = A.compute_policy_loss(logp, None, torch.ones(2, dtype=D), ones, cfg, engine_logp=ENGINE)
    close(loss, -(math.exp(0.1) * LEARNER[0, 0] + 1.0 * LEARNER[1, 0]) / 4)
    close(met["is/masked_frac"], 0.5)
    close(met["is/weight_mean"], (math.exp(0.1) + 1.0) / 4)
    loss.backward()
    close(logp.grad, [[-math.exp(0.1) / 4, 0.0], [-1 / 4, 0.0]])
    # seq-MIS through the loss config
    cfg = A.PolicyLossConfig(loss_type="reinforce", is_mode="mis", is_level="sequence", is_bounds=(0.8, 1.2))
    loss, _ = A.compute_policy_loss(LEARNER, None, torch.ones(2, dtype=D), ones, cfg, engine_logp=ENGINE)
    close(loss, -math.exp(-0.2) * (LEARNER[0, 0] + LEARNER[0, 1]) / 4)


def test_correction_denominator_is_the_engine_of_the_sampling_version():
    """Under staleness the learner's weights moved since the engine sampled: the ratio is learner / engine, and
    the engine's log-prob (of the sampling version) is what divides, never a learner recomputation."""
    ones = torch.ones(1, 2)
    learner_now = torch.tensor([[-1.0, -1.0]], dtype=D)
    engine_then = torch.tensor([[-1.5, -0.9]], dtype=D)
    w, _ = A.rollout_correction(learner_now, engine_then, ones, "truncate", "token", cap=10.0)
    close(w, [[math.exp(0.5), math.exp(-0.1)]])


def test_is_modes_registry_and_config():
    assert {"truncate", "mask", "mis"} <= set(A.IS_CORRECTIONS)
    with pytest.raises(ValueError, match="mis"):
        A.PolicyLossConfig(is_mode="icepopp")
    from rl.config import load_config
    from rl.train.policy_update import policy_loss_config

    off = policy_loss_config(load_config(None, []).algo, 48)
    assert off.is_mode is None  # the default: no correction
    tis = policy_loss_config(load_config(None, ["algo.tis_cap=2"]).algo, 48)
    assert (tis.is_mode, tis.is_cap) == ("truncate", 2.0)
    ice = policy_loss_config(load_config(None, ["algo.tis_mode=mis", "algo.tis_bounds=[0.5, 5.0]"]).algo, 48)
    assert (ice.is_mode, ice.is_level, ice.is_bounds) == ("mis", "token", (0.5, 5.0))
    seq = policy_loss_config(load_config(None, ["algo.tis_mode=mis", "algo.tis_level=sequence"]).algo, 48)
    assert (seq.is_mode, seq.is_level) == ("mis", "sequence")
    from rl.config import ConfigError

    with pytest.raises(ConfigError, match="tis_bounds"):
        load_config(None, ["algo.tis_bounds=[2.0, 0.5]"])
