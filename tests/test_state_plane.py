"""Recorded states on their way to the learner, without Ray: storage formats (rl/samples/states.py), the carrier
arrays Ray stores (actors/state_plane.py), collation of a batch whose unread rows still hold references, and the rows a
rank reads (`rl.train.update_plan.rows_read`) against what `PolicyUpdater.update` actually reads. The Ray path (engine
actors put, the driver holds references only, each rank fetches its rows) is tested in tests/test_actors.py; the vLLM
engine's handover (in-process tensor, or a scratch file deleted once read) in tests/test_vllm_engine.py.

Codec bounds (per element): bf16 keeps 8 significant bits, so |err| <= 2^-8 |x| (round to nearest). fp8 e4m3 keeps
4 significant bits above its smallest normal 2^-6, so |err| <= 2^-4 |x| there, and below it the subnormal step is
2^-9, so |err| <= 2^-10 in units of the row's scale (row max / 448).
"""

import copy

import numpy as np
import pytest
import torch
from conftest import TINY_ARITH

import rl.model  # noqa: F401
import rl.samples.states as sf
from actors.state_plane import fetch, from_carrier, to_carrier
from rl.config import load_config
from rl.estimators.likelihood import get_estimator
from rl.samples.batch import Sample, collate
from rl.samples.request import SamplingParams
from rl.train.policy_update import PolicyUpdater, TorchBackend
from rl.train.update_plan import plan_for, rows_read
from rollout.torch_engine import TorchEngine

CKPT = str(TINY_ARITH)


def rows(n=7, d=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * torch.logspace(-3, 2, n)[:, None]  # rows of very different norms
    x[1] = 0.0  # an all-zero row (padding-like): must decode to zeros, not NaN
    return x


def test_formats_round_trip_within_their_rounding():
    x = rows()
    assert torch.equal(sf.decode(sf.encode(x, "float32")), x)
    b = sf.decode(sf.encode(x, "bfloat16"))
    assert ((b - x).abs() <= x.abs() * 2**-8).all()
    stored = sf.encode(x, "float8_rowscale")
    assert stored.dtype == torch.uint8 and stored.shape == (7, 96 + 4) and sf.width(stored) == 96
    y = sf.decode(stored)
    scale = x.abs().amax(-1, keepdim=True) / 448
    assert ((y - x).abs() <= torch.maximum(x.abs() * 2**-4, scale * 2**-10) * (1 + 1e-6)).all()
    assert torch.equal(y[1], torch.zeros(96)) and torch.isfinite(y).all()
    # the per-row scale is what keeps small rows: one scale for the whole tensor would flush row 0 (norm 1e-3)
    assert (y[0] - x[0]).norm() < 0.1 * x[0].norm()
    assert sf.encode(x, "bfloat16").nbytes * 2 == sf.encode(x, "float32").nbytes
    with pytest.raises(ValueError, match="states dtype"):
        sf.encode(x, "float16")
    with pytest.raises(TypeError, match="storage format"):
        sf.decode(torch.zeros(2, 3, dtype=torch.int32))


def test_config_names_and_auto():
    assert sf.params_states_dtype("auto", engines_on_gpu=False) == "float32"
    assert sf.params_states_dtype("auto", engines_on_gpu=True) == "bfloat16"
    assert sf.params_states_dtype("fp8", engines_on_gpu=False) == "float8_rowscale"
    with pytest.raises(ValueError, match="record_states_dtype"):
        sf.params_states_dtype("fp16", engines_on_gpu=True)
    assert load_config(None, []).rollout.record_states_dtype == "auto"
    assert set(sf.CONFIG_NAMES.values()) == set(sf.STATE_DTYPES)
    SamplingParams(states_dtype="float8_rowscale").validate()


@pytest.mark.parametrize("dtype", sf.STATE_DTYPES)
def test_carrier_arrays_hold_the_same_bytes(dtype):
    """What the engine actor puts (numpy: bf16 as int16 bits, fp8 as its uint8 packing) is what a rank gets back,
    bit for bit, even from a read-only buffer (Ray's shared memory)."""
    stored = sf.encode(rows(), dtype)
    array = to_carrier(stored)
    assert isinstance(array, np.ndarray) and array.nbytes == stored.nbytes
    array.setflags(write=False)
    back = from_carrier(array)
    assert back.dtype == stored.dtype and torch.equal(back.view(torch.uint8), stored.view(torch.uint8))


def fake_samples(n=9, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        R = int(torch.randint(1, 6, (1,), generator=g))
        out.append(
            Sample(
                [1, 5, 6][: 1 + i % 3],
                torch.randint(4, 30, (R,), generator=g).tolist(),
                [-0.5] * R,
                "stop",
                1,
                states=torch.randn(R, d, generator=g),
                group_id=i // 3,
                sample_index=i % 3,
            )
        )
    return out


def test_collate_reads_only_the_rows_asked_and_names_unfetched_ones():
    samples = fake_samples()
    full = collate(samples, with_states=True)
    away = copy.copy(samples)
    for i in (0, 4, 8):  # rows another rank reads: still references
        away[i] = copy.copy(samples[i])
        away[i].states = sf.StateRef(None, samples[i].response_len, 32, 0)
    mine = [1, 2, 3, 5, 6, 7]
    part = collate(away, with_states=True, state_rows=mine)
    assert torch.equal(part.states[mine], full.states[mine]) and not part.states[[0, 4, 8]].any()
    with pytest.raises(ValueError, match=r"samples \[4\] hold a StateRef"):
        collate(away, with_states=True, state_rows=mine + [4])
    stored = copy.copy(samples[1])
    stored.states = sf.encode(stored.states, "bfloat16")  # any storage format is decoded to fp32
    assert collate([stored], with_states=True).states.dtype == torch.float32
    # a rank with no rows of its own (more ranks than rows) reads nothing, yet its stand-in row has the width d
    none_read = collate([away[0], away[4]], with_states=True, state_rows=[])
    assert none_read.states.shape == (2, max(away[0].response_len, away[4].response_len), 32)
    assert not none_read.states.any()


def test_fetch_leaves_rows_that_hold_tensors_alone():
    """In one process (no references) a rank's fetch moves nothing; Ray is not even imported for it."""
    import sys

    samples = fake_samples()
    before = [s.states for s in samples]
    stats = fetch(samples, range(len(samples)))
    assert (stats.rows, stats.nbytes) == (0, 0) and all(s.states is t for s, t in zip(samples, before))
    assert stats.metrics()["state_plane/bytes"] == 0.0
    if "ray" not in sys.modules:  # this process never needed Ray (other test modules may have imported it)
        assert fetch(samples, [0]).rows == 0 and "ray" not in sys.modules


def test_pack_puts_a_chunk_in_one_array_and_fetch_slices_each_row_back(monkeypatch):
    """The fleet's form: an engine chunk's states are one array (the actor call's second return value), each sample a
    (start, rows) slice of it; a rank's fetch gets each object once and puts exactly each sample's rows back."""
    import ray

    from actors import state_plane as plane

    samples = fake_samples()
    want = [s.states.clone() for s in samples]
    packed, array = plane.pack(samples)
    assert array.shape[0] == sum(t.shape[0] for t in want)
    assert [s.states.start for s in packed] == [sum(t.shape[0] for t in want[:i]) for i in range(len(want))]
    plane.attach(packed, "object-1")
    store, asked = {"object-1": array}, []
    monkeypatch.setattr(ray, "get", lambda handles: asked.append(list(handles)) or [store[h] for h in handles])
    stats = plane.fetch(packed, [1, 3, 3])
    assert asked == [["object-1"]] and stats.rows == 2
    assert stats.nbytes == want[1].numel() * 4 + want[3].numel() * 4
    for i in (1, 3):
        assert torch.equal(packed[i].states, want[i])
    assert isinstance(packed[0].states, sf.StateRef) and packed[0].states.handle == "object-1"
    assert plane.pack([s for s in fake_samples() if False]) == ([], None)


OVERRIDES = [[], ["algo.mini_batches=2"], ["algo.kl_coef=0.1"], ["algo.ppo_epochs=2"]]


@pytest.mark.parametrize("overrides", OVERRIDES)
def test_rows_read_partition_the_batch_over_ranks(overrides):
    """Every row is read by exactly one rank, whatever the update does (behaviour and reference log-probs are
    computed on a rank's own micro-batches too), and a rank reads the rows of its micro-batches."""
    cfg = load_config("configs/tiny.yaml", ["learner.micro_batch_size=2", *overrides])
    samples = fake_samples(11)
    per_rank = [rows_read(samples, cfg, 3, r) for r in range(3)]
    assert sorted(r for share in per_rank for r in share) == list(range(11))  # each row on exactly one rank
    plan = plan_for(samples, cfg, 3)
    for rank, share in enumerate(per_rank):
        trained = {r for m in range(len(plan.minibatches)) for mb in plan.rank_micro_batches(m, rank) for r in mb}
        assert set(share) == trained


class TwoRankBackend(TorchBackend):
    """Plain torch playing one of two ranks (no reduction): enough to see which rows a rank's update reads."""

    world_size = 2


@pytest.fixture(scope="module")
def tiny_rollouts():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(CKPT).eval()
    torch.manual_seed(0)
    prompts = [[1] + torch.randint(4, 90, (5,)).tolist() for _ in range(4)]
    samples = TorchEngine(copy.deepcopy(model)).generate(
        prompts, SamplingParams(n=2, temperature=1.0, max_tokens=6, seed=3, record_states=True)
    )
    return model, samples


@pytest.mark.parametrize("overrides", OVERRIDES)
def test_a_rank_updates_with_only_its_rows_fetched(tiny_rollouts, overrides):
    """Rank 1 of 2 trains with every other row still a reference (mini-batches, several epochs and a KL term
    included): `rows_read` names every row its update reads. Dropping one of them from what was fetched makes the
    update fail by name (mutation check of rows_read)."""
    model, samples = tiny_rollouts
    cfg = load_config("configs/tiny.yaml", ["learner.micro_batch_size=3", *overrides])
    mine = rows_read(samples, cfg, 2, 1)
    assert 0 < len(mine) < len(samples)
    away = [copy.copy(s) for s in samples]
    for i, s in enumerate(away):
        if i not in mine:
            s.states = sf.StateRef(None, s.response_len, s.states.shape[-1], 0)
    adv = [1.0, -1.0] * (len(samples) // 2)
    policy = copy.deepcopy(model).train()
    ref = copy.deepcopy(model).eval() if cfg.algo.kl_coef > 0 else None
    m = PolicyUpdater(policy, cfg, 0, ref).update(away, adv, TwoRankBackend(policy, lr=1e-5), rank=1)
    assert m["optimizer_steps"] == cfg.algo.ppo_epochs * cfg.algo.mini_batches and m["grad_norm"] > 0
    away[mine[0]].states = sf.StateRef(None, away[mine[0]].response_len, 128, 0)
    with pytest.raises(ValueError, match="StateRef"):
        PolicyUpdater(policy, cfg, 0, ref).update(away, adv, TwoRankBackend(policy, lr=1e-5), rank=1)
    # one row over two ranks: rank 1 reads nothing, and its stand-in micro-batches (row 0, another rank's, still
    # a reference) run on zero states (mutation 'stand-in collated with its states' caught here)
    one = [copy.copy(samples[0])]
    one[0].states = sf.StateRef(None, one[0].response_len, one[0].states.shape[-1], 0)
    assert rows_read(one, cfg, 2, 1) == []
    m = PolicyUpdater(policy, cfg, 0, ref).update(one, adv[:1], TwoRankBackend(policy, lr=1e-5), rank=1)
    assert m["optimizer_steps"] == cfg.algo.ppo_epochs * 1 and m["grad_norm"] == 0.0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_replay_logprobs_through_the_plane_equal_the_old_path(tiny_rollouts, dtype):
    """What a rank replays after the state plane equals what it replayed when the whole batch arrived with its
    tensors (the old path), micro-batch by micro-batch, bit for bit. Tolerance 0 on purpose: the plane moves the
    stored bytes unchanged (numpy carrier, Ray copies or maps them; test_carrier_arrays_hold_the_same_bytes), the
    batch is padded to the same length, and a micro-batch holds only rows this rank fetched, so the forward runs on
    identical tensors in the same process; any difference is a wrong row, a lost byte or a changed padding."""
    model, samples = tiny_rollouts
    cfg = load_config("configs/tiny.yaml", ["learner.micro_batch_size=3", "likelihood.estimator=replay"])
    stored = [copy.copy(s) for s in samples]
    for s in stored:
        s.states = sf.encode(s.states, dtype)  # as the engine stores them (rollout.record_states_dtype)
    replay = get_estimator("replay")
    plan = plan_for(stored, cfg, 2)
    for rank in range(2):
        mine = rows_read(stored, cfg, 2, rank)
        plane = [copy.copy(s) for s in stored]  # the new path: StateRefs; only this rank's rows come back
        for i, s in enumerate(plane):
            s.states = (
                from_carrier(to_carrier(s.states))
                if i in mine
                else sf.StateRef(None, s.response_len, sf.width(s.states), 0)
            )
        micro = [mb for m in range(len(plan.minibatches)) for mb in plan.rank_micro_batches(m, rank) if mb]
        assert sorted(r for mb in micro for r in mb) == mine
        for mb in micro:  # the old path: the rows' own tensors; the new: what this rank fetched
            a = collate([stored[i] for i in mb], with_states=True)
            b = collate([plane[i] for i in mb], with_states=True)
            assert torch.equal(a.states, b.states)
            la = replay(model, a, "soft", 1, 1.0).logprobs
            lb = replay(model, b, "soft", 1, 1.0).logprobs
            assert torch.equal(la, lb) and la.abs().sum() > 0
