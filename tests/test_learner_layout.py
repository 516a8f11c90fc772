"""The learner's layout on one machine: how many torch threads a rank runs with, `learner.zero_stage: 0`, and the
bf16 learner on the real stack (Ray actors, DeepSpeed, a rollout engine, weight sync).

Model: the tiny random FBT Llama of tests/test_actors.py (d=128, 2 layers), fp32 engine on CPU.
"""

import os

import pytest
import torch

import rl.model  # noqa: F401  (registers the FBT Auto classes)
from actors.deepspeed_setup import learner_threads
from rl.config import load_config
from tests.test_actors import LR, assert_same_update, make_cfg, params, synthetic_batch, tiny_ckpt  # noqa: F401


# ---- threads ----------------------------------------------------------------------------------------------------
def cfg_with(*overrides):
    return load_config(None, list(overrides))


def test_rank_threads_are_the_cores_it_may_use():
    # explicit: that many, wherever the rank runs
    assert learner_threads(cfg_with("learner.num_threads=3"), 16, 1.0, True) == 3
    # synchronous on one machine: the learner trains alone, every core shared out among the ranks
    assert learner_threads(cfg_with("learner.num_workers=1"), 8, 1.0, True) == 8
    assert learner_threads(cfg_with("learner.num_workers=2"), 8, 1.0, True) == 4
    assert learner_threads(cfg_with("learner.num_workers=3"), 2, 1.0, True) == 1  # never 0
    # asynchronous (engines generate while it trains) or on a cluster: the CPUs Ray reserved for the rank
    assert learner_threads(cfg_with("learner.num_workers=1", "train.max_staleness=1"), 8, 2.0, True) == 2
    assert learner_threads(cfg_with("learner.num_workers=1"), 8, 1.0, False) == 1
    assert learner_threads(cfg_with("learner.num_workers=1"), 8, 0.5, False) == 1  # a colocated half CPU


def test_a_bf16_learner_accumulates_gradients_in_fp32():
    """DeepSpeed's default accumulation dtype is the model's: bf16 sums of many micro-batches lose ~1 %. From ZeRO 1
    fp32 accumulation is asked for; without ZeRO DeepSpeed refuses it, so that layout is refused at load."""
    from actors.deepspeed_setup import deepspeed_config

    for stage in (1, 2, 3):
        ds = deepspeed_config(cfg_with("learner.bf16=true", f"learner.zero_stage={stage}").learner)
        assert ds["bf16"] == {"enabled": True} and ds["data_types"] == {"grad_accum_dtype": "fp32"}
    assert "data_types" not in deepspeed_config(cfg_with("learner.zero_stage=2").learner)  # fp32: nothing to ask
    with pytest.raises(ValueError, match=r"learner\.zero_stage: learner\.bf16 needs learner\.zero_stage >= 1"):
        cfg_with("learner.bf16=true", "learner.zero_stage=0")


def test_num_threads_must_be_positive():
    with pytest.raises(ValueError, match="learner.num_threads: must be >= 1 or null, got 0"):
        load_config(None, ["learner.num_threads=0"])


def test_in_process_rank_sets_its_threads(tiny_ckpt):
    from actors.learner_rank import LearnerRank

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        rank = LearnerRank(make_cfg(tiny_ckpt, "learner.num_threads=2"))
        assert torch.get_num_threads() == 2
        rank.close()
    finally:
        torch.set_num_threads(before)


def test_a_rank_builds_again_after_the_world_group_was_destroyed(tiny_ckpt):
    """An in-process vLLM engine destroys torch's world group when it shuts down; a learner rank built after it
    gets a new world, and DeepSpeed must not hand it the groups it cached from the old one."""
    from actors.learner_rank import LearnerRank

    LearnerRank(make_cfg(tiny_ckpt)).close()
    torch.distributed.destroy_process_group()  # what vLLM's cleanup does
    rank = LearnerRank(make_cfg(tiny_ckpt))
    samples, adv = synthetic_batch(6)
    assert rank.update(samples, adv)["nonfinite_steps"] == 0.0
    rank.close()


# ---- zero_stage 0 -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world_reduce", [False, True])
def test_zero_stage_0_rank_equals_torch_backend(tiny_ckpt, world_reduce):
    """No ZeRO (one rank's fastest layout): DeepSpeed steps `ClippingAdamW` itself. Same grad norm, loss and
    weights as plain torch AdamW, over two steps (the second one moves Adam's moments). `world_reduce`: with
    DeepSpeed's own all-reduce left on (what several ranks use) instead of skipped for one rank."""
    from actors.local import LocalLearner

    cfg = make_cfg(tiny_ckpt, "learner.zero_stage=0")
    samples, adv = synthetic_batch()
    ref, ds = LocalLearner(cfg, "torch"), LocalLearner(cfg, "deepspeed")
    assert ds.rank.engine.enable_backward_allreduce is False  # alone: nothing to reduce with
    ds.rank.engine.enable_backward_allreduce = world_reduce
    for _ in range(2):
        ref_m, m = ref.update(samples, adv), ds.update(samples, adv)
        assert_same_update(ref_m, ref.rank.full_state(), m, ds.rank.full_state())
        assert m["loss"] == pytest.approx(ref_m["loss"], rel=1e-5, abs=1e-6)
    ds.close()


def test_zero_stage_0_skips_a_nonfinite_step(tiny_ckpt):
    from actors.learner_rank import LearnerRank

    rank = LearnerRank(make_cfg(tiny_ckpt, "learner.zero_stage=0"))
    samples, adv = synthetic_batch(6)
    before = rank.full_state()
    m = rank.update(samples, [float("nan")] * len(adv))
    assert m["nonfinite_steps"] == 1.0 and m["grad_norm"] == float("inf")
    assert all(torch.equal(before[k], v) for k, v in rank.full_state().items())
    assert rank.update(samples, adv)["nonfinite_steps"] == 0.0  # the next finite batch steps again
    assert any(not torch.equal(before[k], v) for k, v in rank.full_state().items())
    rank.close()


# ---- Ray: one rank on every core, and the bf16 learner on the real stack ------------------------------------------
@pytest.fixture(scope="module")
def ray_local():
    import ray

    yield
    ray.shutdown()


def ray_rank_threads(group) -> list[int]:
    import ray

    def threads(_self):
        import torch

        return torch.get_num_threads()

    return ray.get([a.__ray_call__.remote(threads) for a in group.actors])


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores to tell all cores from Ray's one")
def test_ray_rank_runs_on_every_core_of_a_synchronous_local_job(tiny_ckpt, ray_local):
    """Ray starts a 1-CPU actor with OMP_NUM_THREADS=1; a synchronous job's only rank takes every core."""
    from actors.placement import create_placement, init_ray, start_learner_group

    cfg = make_cfg(tiny_ckpt, "learner.num_workers=1", "learner.zero_stage=0", "ray.num_cpus=4")
    init_ray(cfg)
    placement = create_placement(cfg)
    group = start_learner_group(cfg, placement)
    try:
        assert ray_rank_threads(group) == [os.cpu_count()]
    finally:
        group.close()
        import ray

        ray.util.remove_placement_group(placement.group)


def test_bf16_learner_on_the_real_stack(tiny_ckpt, ray_local, tmp_path):
    """`learner.bf16: true` (DeepSpeed bf16 weights, fp32 master copy and Adam state) in a Ray learner group fed by
    a Ray torch engine, weights synced back: the learner's log-probs differ from the fp32 engine's by bf16
    rounding (not more, and not fp32-little); a step lowers the loss of the batch it trained on (the next
    update's loss, computed before its step); the engine then holds exactly the learner's weights, bf16 values."""
    from safetensors.torch import load_file

    from actors.placement import create_placement, init_ray, start_learner_group, start_rollout_fleet

    cfg = make_cfg(tiny_ckpt, "learner.num_workers=1", "learner.bf16=true", "ray.num_cpus=4")
    init_ray(cfg)
    placement = create_placement(cfg)
    rollout = start_rollout_fleet(cfg, placement)
    learner = start_learner_group(cfg, placement)
    try:
        prompts = [[1, 5, 6, 7], [1, 8, 9], [1, 10, 11], [1, 12]]
        samples = rollout.generate(prompts, params(n=4, max_tokens=6), min_version=0)
        reward = torch.tensor([float(s.response_ids[0] % 2 == 0) for s in samples])
        adv = (reward - reward.mean()).tolist()
        assert any(a > 0 for a in adv) and any(a < 0 for a in adv)
        first = learner.update(samples, adv)
        # bf16 weights and activations: |learner - engine| ~ 1e-3 per token (an fp32 learner: ~1e-7)
        assert 1e-4 < first["mismatch/abs_logp_diff"] < 0.05, first["mismatch/abs_logp_diff"]
        assert first["grad_norm"] > 0 and first["nonfinite_steps"] == 0.0
        second = learner.update(samples, adv)
        assert second["loss"] < first["loss"] - 1e-3, (first["loss"], second["loss"])
        path = learner.export_weights(str(tmp_path / "w.safetensors"))
        exported = load_file(path)
        assert all(t.dtype == torch.bfloat16 for t in exported.values())
        assert rollout.load_weights(path, 1) == [1]
        assert rollout.weight_checksums() == learner.weight_checksums()
    finally:
        learner.close()
        rollout.close()
        import ray

        ray.util.remove_placement_group(placement.group)
