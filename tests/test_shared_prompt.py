"""Each distinct prompt computed once (rl/estimators/shared_prompt.py) against the row-by-row forward.

Model: a tiny random FBT Llama whose fusion value weights are scaled up (feedback moves log-probs by ~0.1 nats, so
a wrong carried state or a wrong position shows). Batch: groups of G = 4 rows sharing a prompt, prompts of
different lengths (right-padded prompts of another length share the micro-batch), ragged responses, a reset token
inside a response, a multi-turn row with observation tokens and a row whose prompt no other row shares.

Tolerances. Log-probs and entropies in fp32: the two forwards compute the same sums over differently shaped
matmuls and attention (another summation order), which moves log-probs by ~1e-6 here; 1e-5 is the estimators' own
fp32 tolerance (tests/test_likelihood.py), while a wrong prompt, position or carried state moves them by >1e-2.
Gradients and loss in fp64: the RMS norms (the backbone's and the fusion's) still compute in fp32 inside an fp64
model, so a last-bit difference at their input can flip one fp32 rounding (relative 6e-8); the largest difference
seen is 1e-7 of the largest gradient entry, so 1e-6 of it is the bound, while a prompt's gradient taken from one row
instead of the group's sum, or a row reading another prompt's keys, is off by O(1).
"""

from __future__ import annotations

import copy

import pytest
import torch

from rl.estimators import shared_prompt
from rl.estimators.likelihood import get_estimator
from rl.model import FBTLlamaConfig, FBTLlamaForCausalLM
from rl.samples.batch import Sample, collate

ESTIMATORS = [("replay", 1), ("kpass", 3), ("exact", 1), ("standard", 1)]
LOGP_TOL = 1e-5
GRAD_TOL = 1e-6
VOCAB = 101
D = 64


def tiny_model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    cfg = FBTLlamaConfig(
        vocab_size=VOCAB,
        hidden_size=D,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = FBTLlamaForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():
        model.fusion.w_u.weight.mul_(4.0)
    return model


def group_samples(seed=0):
    """3 groups of 4 (prompt lengths 5, 11, 8) and a lone row; ragged responses; a BOS (reset token) inside one
    response; a multi-turn row whose tokens 3-5 are an observation."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(3, VOCAB, (n,), generator=g).tolist()  # noqa: E731
    out = []
    for gid, plen in enumerate((5, 11, 8, 6)):
        prompt = [1] + rand(plen - 1)
        for i in range(4 if gid < 3 else 1):
            R = int(torch.randint(2, 12, (1,), generator=g))
            resp = rand(R)
            s = Sample(prompt, resp, [0.0] * R, "stop", 1, states=torch.randn(R, D, generator=g), group_id=gid)
            s.sample_index = i
            out.append(s)
    out[1].response_ids[1] = 1  # a document start inside a response: no feedback there
    multi = out[5]
    multi.response_ids = multi.response_ids + rand(9 - multi.response_len)
    multi.states = torch.randn(9, D, generator=g)
    multi.logprobs = [0.0] * 9
    multi.generated_mask = [1, 1, 1, 0, 0, 0, 1, 1, 1]
    return out


def estimate(model, batch, mode, name, passes, share, **kw):
    return get_estimator(name)(model, batch, mode, passes=passes, with_entropy=True, share_prompts=share, **kw)


@pytest.mark.parametrize("mode", ["soft", "standard"])
@pytest.mark.parametrize("name,passes", ESTIMATORS)
def test_logprobs_equal_row_by_row(mode, name, passes):
    model = tiny_model()
    batch = collate(group_samples(), with_states=True)
    assert shared_prompt.can_share(model, batch, mode, name)
    with torch.no_grad():
        rows = estimate(model, batch, mode, name, passes, share=False, temperature=0.7)
        shared = estimate(model, batch, mode, name, passes, share=True, temperature=0.7)
    assert (shared.logprobs - rows.logprobs).abs().max() <= LOGP_TOL
    assert (shared.entropy - rows.entropy).abs().max() <= LOGP_TOL
    assert (shared.logprobs * (1 - batch.response_mask)).abs().max() == 0  # padding and observations stay 0
    if mode == "soft" and name != "standard":  # feedback matters: a plain pass is far off
        plain = estimate(model, batch, mode, "standard", 1, share=False, temperature=0.7)
        assert (plain.logprobs - rows.logprobs).abs().max() > 1e-2


def grads(model, batch, mode, name, passes, share, adv):
    model.zero_grad(set_to_none=True)
    out = estimate(model, batch, mode, name, passes, share, entropy_grad=True)
    mask = batch.response_mask.to(out.logprobs.dtype)
    loss = -((adv[:, None] * out.logprobs - 0.01 * out.entropy) * mask).sum() / mask.sum()
    loss.backward()
    return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(got, want):
    assert got.keys() == want.keys()
    scale = max(g.abs().max() for g in want.values())
    for k in want:
        assert (got[k] - want[k]).abs().max() <= GRAD_TOL * scale, k


@pytest.mark.parametrize("mode", ["soft", "standard"])
@pytest.mark.parametrize("name,passes", ESTIMATORS)
def test_loss_and_gradients_equal_row_by_row(mode, name, passes):
    model = tiny_model(torch.float64).train()
    batch = collate(group_samples(1), with_states=True)
    adv = torch.randn(len(batch), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    loss_rows, want = grads(model, batch, mode, name, passes, False, adv)
    loss_shared, got = grads(model, batch, mode, name, passes, True, adv)
    assert abs(float(loss_shared - loss_rows)) <= GRAD_TOL * abs(float(loss_rows))
    assert "model.embed_tokens.weight" in got and "model.layers.0.self_attn.k_proj.weight" in got
    assert_same_grads(got, want)


def test_lora_gradients_equal_row_by_row():
    """A LoRA policy (peft layers inside the backbone, rl/model/lora_policy.py) takes the same path."""
    from rl.config.lora import LoraConfig
    from rl.model.lora_policy import LoraPolicy

    lora = LoraPolicy.wrap(tiny_model(torch.float64), LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    model = lora.model.train()
    with torch.no_grad():  # B = 0 at the start: give the adapters a value so their gradients flow both ways
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(5))
    batch = collate(group_samples(2), with_states=True)
    adv = torch.randn(len(batch), generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    _, want = grads(model, batch, "soft", "replay", 1, False, adv)
    _, got = grads(model, batch, "soft", "replay", 1, True, adv)
    assert any("lora_A" in k for k in got)
    assert_same_grads(got, want)


def test_where_it_does_not_apply():
    model = tiny_model()
    samples = group_samples()
    batch = collate(samples, with_states=True)
    assert not shared_prompt.can_share(model, batch, "fused", "replay")  # prompts prefilled with feedback, per row
    lone = collate([samples[0], samples[4], samples[12]], with_states=True)
    assert not shared_prompt.can_share(model, lone, "soft", "replay")  # nothing shared: row by row
    dropout = copy.deepcopy(model)
    dropout.config.attention_dropout = 0.1
    assert not shared_prompt.can_share(dropout.train(), batch, "soft", "kpass")
    assert shared_prompt.can_share(dropout.eval(), batch, "soft", "kpass")
    # fused mode falls back to the row-by-row forward: the same numbers either way
    with torch.no_grad():
        a = estimate(model, batch, "fused", "kpass", 2, share=False).logprobs
        b = estimate(model, batch, "fused", "kpass", 2, share=True).logprobs
    assert torch.equal(a, b)


def test_prompt_groups():
    ids = torch.tensor([[1, 5, 6, 9, 9], [1, 5, 6, 7, 0], [1, 5, 8, 8, 0], [1, 5, 6, 3, 3]])
    inverse, rep = shared_prompt.prompt_groups(ids, torch.tensor([3, 3, 3, 2]))
    assert inverse[0] == inverse[1] != inverse[2]  # the same 3 prompt tokens; responses differ
    assert inverse[3] not in (inverse[0], inverse[2])  # a prefix of a prompt is another prompt
    assert len(rep) == 3 and torch.equal(inverse[rep], torch.arange(3))


def test_plan_keeps_a_prompts_rows_together():
    from rl.train.update_plan import plan_update

    samples = group_samples()
    lengths = [s.prompt_len + s.response_len for s in samples]
    keys = [tuple(s.prompt_ids) for s in samples]
    for world in (1, 2):
        plan = plan_update(lengths, 1, world, 8, None, prompt_keys=keys)
        seen = []
        for r in range(world):
            for rows in plan.rank_micro_batches(0, r):
                seen += rows
                # every prompt of a micro-batch has all its rows there (8 rows hold two groups of 4)
                assert all(
                    sum(keys[i] == keys[j] for i in range(len(samples))) == sum(keys[i] == keys[j] for i in rows)
                    for j in rows
                )
        assert sorted(seen) == list(range(len(samples)))
    # the padded-token budget holds although a later prompt's rows may be longer than a micro-batch's first row
    plan = plan_update(lengths, 1, 1, None, 60, prompt_keys=keys)
    assert all(len(rows) == 1 or len(rows) * max(lengths[i] for i in rows) <= 60 for rows in plan.micro[0][0])


def test_learner_update_equal_with_shared_prompts():
    """The whole policy update (plan, old log-probs, loss, backward) with `learner.share_prompts` on and off."""
    from rl.config import load_config
    from rl.train.policy_update import PolicyUpdater

    base = tiny_model(torch.float64).train()
    samples = group_samples(4)
    adv = torch.randn(len(samples), generator=torch.Generator().manual_seed(6)).tolist()
    steps = {}
    for share in (True, False):
        cfg = load_config(
            None,
            [
                "rollout.decode_mode=soft",
                "likelihood.estimator=kpass",
                "likelihood.passes=3",
                "algo.ppo_epochs=2",  # old log-probs too
                "learner.micro_batch_size=8",
                f"learner.share_prompts={str(share).lower()}",
            ],
        )
        model = copy.deepcopy(base)
        backend = GradRecorder(model)
        metrics = PolicyUpdater(model, cfg, 0).update(samples, adv, backend)
        assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # the weights do not move here
        steps[share] = backend.steps
    assert len(steps[True]) == len(steps[False]) == 2
    for got, want in zip(steps[True], steps[False]):
        assert_same_grads(got, want)


class GradRecorder:
    """A backend that keeps each step's summed gradients and leaves the weights alone."""

    world_size = 1

    def __init__(self, model):
        self.model, self.steps = model, []

    def backward(self, loss):
        loss.backward()

    def step(self):
        self.steps.append({k: p.grad.clone() for k, p in self.model.named_parameters() if p.grad is not None})
        self.model.zero_grad(set_to_none=True)
        return 1.0
