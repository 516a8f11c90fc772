"""The workers of the RL loop: DeepSpeed learner ranks, the Ray learner group, rollout fleets, reward actors.

Model: a tiny random FBT Llama (d=128, 2 layers, 2 heads of 64, vocab 64) with the char tokenizer, fp32 on CPU.

Tolerances. The reference is `rl.train.policy_update.TorchBackend` (plain torch AdamW) on the whole batch in one
process.
- Scalars (grad norm, loss metrics): DeepSpeed sums the same per-element gradients in a different order
  (flattened partitions, reductions over ranks), so they agree to fp32 rounding: rel 1e-5.
- Weights after one AdamW step: the first step moves each weight by lr * g / (|g| + eps) with eps = 1e-8, so an
  element whose gradient is ~1e-9 (there are such, from cancellation) turns a rounding-level change of g into a
  visible fraction of lr. Weights must agree within lr / 100 (1% of one step) while the step itself moves them
  by ~lr; a wrong row split or token normalization changes update directions by O(lr).
- Adam's first step is invariant to the gradient's scale, so weights alone cannot tell summed from averaged
  gradients over ranks: the grad norm (pre-clipping, global) does, and every comparison asserts it.
"""

import os

import pytest
import torch
from safetensors.torch import load_file

import rl.model  # noqa: F401  (registers the FBT Auto classes)
from actors.learner_group import merge_rank_metrics
from actors.local import LocalLearner, LocalRewards, LocalRollout
from actors.rollout_fleet import chunk_params, merge_chunks, split_prompts
from rl.config import load_config
from rl.data.tokenizer import build_tokenizer
from rl.samples.batch import Sample
from rl.samples.request import SamplingParams
from rollout.engine import StaleWeightsError

LR = 1e-3
ALPHABET = "0123456789+-*/=()?., \\boxed{}Whatisnum\n"


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    from transformers import LlamaConfig

    from rl.model import FBTLlamaForCausalLM, fbt_config_from

    path = tmp_path_factory.mktemp("tiny_fbt")
    tok = build_tokenizer(alphabet=ALPHABET)
    assert len(tok) <= 64
    base = LlamaConfig(
        vocab_size=64,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    FBTLlamaForCausalLM(fbt_config_from(base, "gate_product")).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return str(path)


def make_cfg(ckpt, *overrides):
    return load_config(
        None,
        [
            f"model.path={ckpt}",
            "rollout.engine=torch",
            f"learner.lr={LR}",
            "likelihood.estimator=replay",
            "learner.micro_batch_size=3",
            "learner.zero_stage=2",
            "reward.num_workers=1",
            *overrides,
        ],
    )


def synthetic_batch(n=9, seed=0, d=128):
    """Samples of mixed prompt/response lengths with recorded states, and their advantages."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        P, R = int(torch.randint(3, 8, (1,), generator=g)), int(torch.randint(1, 10, (1,), generator=g))
        samples.append(
            Sample(
                [1] + torch.randint(4, 40, (P - 1,), generator=g).tolist(),
                torch.randint(4, 40, (R,), generator=g).tolist(),
                (-torch.rand(R, generator=g)).tolist(),
                "stop",
                1,
                states=torch.randn(R, d, generator=g),
                group_id=i // 3,
                sample_index=i % 3,
            )
        )
    return samples, torch.randn(n, generator=g).tolist()


def assert_same_update(ref_metrics, ref_state, metrics, state):
    assert metrics["grad_norm"] == pytest.approx(ref_metrics["grad_norm"], rel=1e-5)
    assert ref_metrics["grad_norm"] > 1e-3  # a real gradient, not an empty batch
    assert set(state) == set(ref_state)
    diff = max(float((state[k] - ref_state[k]).abs().max()) for k in ref_state)
    assert diff < LR / 100, f"weights differ by {diff:.3g} (one step moves them by ~{LR})"


def params(**kw):
    base = dict(n=2, temperature=1.0, max_tokens=6, stop_token_ids=(2,), seed=7, decode_mode="soft", record_states=True)
    return SamplingParams(**{**base, **kw})


# ---- pure helpers --------------------------------------------------------------------------------------------
def test_prompt_split_seeds_and_group_ids():
    assert split_prompts(5, 2) == [(0, 3), (3, 5)]
    assert split_prompts(1, 3) == [(0, 1)]  # no empty chunks
    assert split_prompts(6, 3) == [(0, 2), (2, 4), (4, 6)]
    p = params(n=4, seed=10)
    assert chunk_params(p, 0) is p and chunk_params(p, 3).seed == 10 + 3 * 4  # vLLM: sample j has seed + j
    assert chunk_params(params(seed=None), 3).seed is None
    s = lambda g: Sample([1], [5], [-0.1], "stop", 0, group_id=g)
    merged = merge_chunks([(0, [s(0), s(1)]), (2, [s(0)])])
    assert [x.group_id for x in merged] == [0, 1, 2]


def test_engine_threads_use_the_cores_a_role_may_use(tiny_ckpt):
    from actors.placement import startup_line
    from actors.rollout_fleet import rollout_threads

    cfg = make_cfg(tiny_ckpt)
    assert rollout_threads(cfg, 8, 1.0, one_machine=True) == 8  # synchronous, one machine: every core
    assert rollout_threads(make_cfg(tiny_ckpt, "rollout.num_engines=3"), 8, 1.0, True) == 2
    assert rollout_threads(make_cfg(tiny_ckpt, "rollout.num_engines=3"), 2, 1.0, True) == 1
    assert rollout_threads(cfg, 8, 1.0, one_machine=False) == 1  # a cluster: what Ray reserved
    assert rollout_threads(make_cfg(tiny_ckpt, "train.max_staleness=1"), 8, 2.0, True) == 2  # async: overlaps
    assert rollout_threads(make_cfg(tiny_ckpt, "rollout.num_threads=3"), 8, 1.0, True) == 3
    with pytest.raises(ValueError, match="rollout.num_threads"):
        make_cfg(tiny_ckpt, "rollout.num_threads=0")
    assert (
        startup_line({"reward": 3.0, "learner": 9.04, "rollout": 7.0}, [2])
        == "ready after: rollout engines 7.0 s, learner ranks 9.0 s, reward actor 3.0 s; engine threads 2"
    )


def test_rank_metrics_merge_token_weighted():
    r0 = {"grad_norm": 2.0, "optimizer_steps": 1.0, "entropy": 1.0, "only0": 5.0, "_tokens": 30.0}
    r1 = {"grad_norm": 2.0, "optimizer_steps": 1.0, "entropy": 4.0, "_tokens": 10.0}
    m = merge_rank_metrics([r0, r1])
    assert m["grad_norm"] == 2.0 and m["optimizer_steps"] == 1.0
    assert m["entropy"] == pytest.approx((30 * 1.0 + 10 * 4.0) / 40) and m["only0"] == 5.0
    assert m["tokens"] == 40.0 and "_tokens" not in m


def test_placement_bundles_separate_and_colocated(tiny_ckpt):
    from actors.placement import plan_bundles
    from actors.resources import required_cpus

    cfg = make_cfg(
        tiny_ckpt,
        "rollout.num_engines=2",
        "learner.num_workers=3",
        "rollout.num_gpus_per_engine=1",
        "learner.num_gpus_per_worker=0.5",
    )
    bundles, r_idx, l_idx, share = plan_bundles(cfg)
    assert bundles == [{"CPU": 1.0, "GPU": 1.0}] * 2 + [{"CPU": 1.0, "GPU": 0.5}] * 3
    assert (r_idx, l_idx, share) == ([0, 1], [2, 3, 4], 1.0) and required_cpus(cfg) == 6
    cfg = make_cfg(tiny_ckpt, "rollout.num_engines=2", "learner.num_workers=3", "ray.colocate=true")
    bundles, r_idx, l_idx, share = plan_bundles(cfg)  # engine i and rank i share bundle i, half each
    assert bundles == [{"CPU": 1.0}] * 3 and (r_idx, l_idx, share) == ([0, 1], [0, 1, 2], 0.5)
    assert required_cpus(cfg) == 4


# ---- DeepSpeed in this process (world size 1) ----------------------------------------------------------------
def test_deepspeed_rank_equals_torch_backend(tiny_ckpt, tmp_path):
    """ZeRO-2, one rank, uneven micro-batches (9 rows, micro 3 -> 3 backward calls, one step) against plain
    torch AdamW on the same batch: same loss metrics, grad norm and weights."""
    cfg = make_cfg(tiny_ckpt)
    samples, adv = synthetic_batch()
    ref = LocalLearner(cfg, "torch")
    ref_m = ref.update(samples, adv)
    ds = LocalLearner(cfg, "deepspeed")
    m = ds.update(samples, adv)
    assert_same_update(ref_m, ref.rank.full_state(), m, ds.rank.full_state())
    for k in ("loss", "pg_loss", "entropy", "mismatch/abs_logp_diff"):
        assert m[k] == pytest.approx(ref_m[k], rel=1e-5, abs=1e-6), k
    assert m["optimizer_steps"] == 1.0 and m["tokens"] == ref_m["tokens"] == sum(s.response_len for s in samples)
    # checksums cover the same tensors under the same names as the export
    sums, path = ds.weight_checksums(), ds.export_weights(str(tmp_path / "w.safetensors"))
    assert set(sums) == set(load_file(path))
    ds.close()


def step_save_step_resume(cfg, samples, adv, ckpt_dir):
    """Step 1, save, step 2; then a fresh rank (as a rebuilt learner is) loads the checkpoint and takes step 2:
    the weights at the save, after step 2, and after the resumed step 2."""
    from actors.learner_rank import LearnerRank

    a = LearnerRank(cfg)
    a.update(samples, adv)
    at_save = a.full_state()
    a.save_checkpoint(str(ckpt_dir))
    a.update(samples, adv)
    want = a.full_state()
    a.close()
    b = LearnerRank(cfg)
    b.load_checkpoint(str(ckpt_dir))
    b.update(samples, adv)
    got = b.full_state()
    b.close()
    return at_save, want, got


@pytest.mark.parametrize("stage", [1, 0])
def test_deepspeed_checkpoint_resume_is_exact(tiny_ckpt, tmp_path, stage):
    """Save after step 1, take step 2; a fresh rank that loads the checkpoint takes the identical step 2
    (weights, fp32 master copy and Adam moments restored; loaded with torch.load(weights_only=True)). Stage 0 is
    the one-machine default (no ZeRO: the client optimizer's own state)."""
    from rl.model.files import load_fbt

    cfg = make_cfg(tiny_ckpt, f"learner.zero_stage={stage}")
    at_save, want, got = step_save_step_resume(cfg, *synthetic_batch(6, seed=1), tmp_path / "ckpt")
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert any(not torch.equal(want[k], at_save[k]) for k in want)
    saved = dict(load_fbt(str(tmp_path / "ckpt" / "model")).named_parameters())  # a loadable HF checkpoint
    assert all(torch.equal(saved[k].detach(), at_save[k]) for k in at_save)
    assert (tmp_path / "ckpt" / "model" / "tokenizer.json").is_file()


def test_weight_sync_learner_to_torch_engine(tiny_ckpt, tmp_path):
    """generate v0 -> update -> export -> engine loads v1: its weights equal the learner's, tensor by tensor,
    and a request that needs v2 is refused."""
    cfg = make_cfg(tiny_ckpt)
    rollout, learner = LocalRollout(cfg), LocalLearner(cfg, "deepspeed")
    prompts = [[1, 5, 6, 7], [1, 8, 9], [1, 10]]
    samples = rollout.generate(prompts, params(), min_version=0)
    assert [s.group_id for s in samples] == [0, 0, 1, 1, 2, 2] and all(s.states is not None for s in samples)
    before = rollout.weight_checksums()
    learner.update(samples, [1.0, -1.0, 0.5, -0.5, 1.0, -1.0])
    path = learner.export_weights(str(tmp_path / "weights" / "policy.safetensors"))
    assert rollout.load_weights(path, 1) == [1]
    after, want = rollout.weight_checksums(), learner.weight_checksums()
    assert after == want  # same float64 sums of the same fp32 values
    assert after != before
    with pytest.raises(StaleWeightsError):
        rollout.generate(prompts, params(), min_version=2)
    assert all(s.policy_version == 1 for s in rollout.generate(prompts, params(), min_version=1))
    learner.close()


def test_weight_sync_learner_to_vllm_engine(tiny_ckpt, tmp_path):
    """The same sync into vLLM: checksums read back through vLLM's own (CPU-repacked) linear kernels."""
    cfg = make_cfg(tiny_ckpt, "rollout.engine=vllm", "rollout.vllm.max_num_seqs=8")
    rollout, learner = LocalRollout(cfg), LocalLearner(cfg, "deepspeed")
    before = rollout.weight_checksums()
    assert before == pytest.approx(learner.weight_checksums(), rel=1e-12)
    samples = rollout.generate([[1, 5, 6, 7], [1, 8, 9]], params(), min_version=0)
    learner.update(samples, [1.0, -1.0, 0.5, -0.5])
    assert rollout.load_weights(learner.export_weights(str(tmp_path / "w.safetensors")), 1) == [1]
    after = rollout.weight_checksums()
    assert after == pytest.approx(learner.weight_checksums(), rel=1e-12) and after != before
    rollout.close()
    learner.close()


# ---- Ray: the launcher's build_workers with 2 torch engines, 2 ZeRO-2 learner ranks, 1 reward actor -----------
@pytest.fixture(scope="module")
def ray_workers(tiny_ckpt):
    import ray

    from actors.placement import build_workers

    cfg = make_cfg(
        tiny_ckpt,
        "learner.num_workers=2",
        "rollout.num_engines=2",
        "ray.num_cpus=5",
        "reward.fns=[{fn: math, weight: 1.0}, {fn: format, weight: 0.1}]",
        "rollout.num_threads=2",
    )
    try:
        yield cfg, *build_workers(cfg, use_ray=True)
    finally:
        ray.shutdown()


def test_ray_two_rank_zero2_update_equals_one_rank(ray_workers, tmp_path):
    """The key semantic: 2 ranks x their rows, gradients summed over ranks == 1 rank on the whole batch. 9 rows
    over 2 ranks with micro-batch 3 gives rank 0 five rows and rank 1 four (2 backward calls each). The states go
    to the ranks as references (put here, as an engine actor would), each rank fetching its own rows."""
    import copy

    from actors.state_plane import publish

    cfg, _, learner, _ = ray_workers
    samples, adv = synthetic_batch()
    m = learner.update(publish([copy.copy(s) for s in samples]), adv)
    # each row fetched by the rank that trains on it (+ rank 0's rows for the latent metrics)
    assert m["state_plane/rows"] == sum(map(len, rows_fetched(samples, cfg)))
    ref = LocalLearner(cfg, "torch")
    ref_m = ref.update(samples, adv)
    state = load_file(learner.export_weights(str(tmp_path / "w.safetensors")))
    assert_same_update(ref_m, ref.rank.full_state(), m, state)
    assert m["tokens"] == sum(s.response_len for s in samples)
    assert m["entropy"] == pytest.approx(ref_m["entropy"], rel=1e-5)  # token-weighted merge over ranks


def test_ray_fleet_generates_like_local_engines_and_syncs(ray_workers, tmp_path):
    """Prompts split over 2 engine actors come back in order with their states, identical to the same two
    engines in this process; after a sync both engines hold the learner's weights."""
    cfg, rollout, learner, _ = ray_workers
    import ray

    assert ray.get([a.num_threads.remote() for a in rollout.actors]) == [2, 2]  # rollout.num_threads, not Ray's 1
    prompts = [[1, 5, 6, 7], [1, 8, 9], [1, 10], [1, 11, 12, 13, 14]]
    got = rollout.generate(prompts, params(), min_version=0)
    want = LocalRollout(cfg).generate(prompts, params(), min_version=0)
    assert [(s.group_id, s.sample_index, s.response_ids) for s in got] == [
        (s.group_id, s.sample_index, s.response_ids) for s in want
    ]
    from actors.state_plane import from_carrier

    for a, b in zip(got, want):  # the actor and this process run torch with different thread counts: fp32 rounding
        # the fleet returns references (actors/state_plane.py): one object per engine chunk, this sample's rows in it
        ref = a.states
        states = from_carrier(ray.get(ref.handle))[ref.start : ref.start + ref.rows]
        assert torch.allclose(states, b.states, atol=1e-5) and a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    learner.update(got, [1.0, -1.0] * 4)
    path = learner.export_weights(str(tmp_path / "policy.safetensors"))
    assert rollout.load_weights(path, 1) == [1, 1]
    assert rollout.weight_checksums() == learner.weight_checksums()
    with pytest.raises(Exception, match="version"):
        rollout.generate(prompts, params(), min_version=2)


def rows_fetched(samples, cfg) -> list[set[int]]:
    """Rows each of 2 ZeRO-2 ranks fetches: its rows of the update plan, and on rank 0 the first
    train.latent_metrics_rows rows, which the latent metrics read."""
    from rl.train.update_plan import rows_read

    latent = set(range(min(cfg.train.latent_metrics_rows, len(samples))))
    assert latent  # the default config computes latent metrics
    return [set(rows_read(samples, cfg, 2, 0)) | latent, set(rows_read(samples, cfg, 2, 1))]


def test_states_bypass_the_driver_and_each_rank_fetches_only_its_rows(ray_workers, monkeypatch):
    """Engine actors put each sample's states into the object store; the samples the driver receives carry
    references only (no tensor anywhere), the driver never gets a state object (neither while generating nor
    while updating), each rank fetches exactly the rows it trains on (rows and bytes per rank against
    rl.train.update_plan.rows_read), and once the driver drops the samples the objects are gone (nothing
    accumulates)."""
    import gc
    import time

    import ray

    from rl.samples.states import StateRef
    from rl.train.update_plan import rows_read

    cfg, rollout, learner, _ = ray_workers
    asked, real_get = [], ray.get

    def spy_get(refs, *args, **kwargs):
        asked.extend(refs if isinstance(refs, list) else [refs])
        return real_get(refs, *args, **kwargs)

    monkeypatch.setattr(ray, "get", spy_get)
    prompts = [[1, 5, 6, 7], [1, 8, 9], [1, 10], [1, 11, 12, 13, 14], [1, 15, 16]]
    samples = rollout.generate(prompts, params(max_tokens=8), min_version=0)
    assert all(isinstance(s.states, StateRef) and s.states.rows == s.response_len for s in samples)
    assert not any(isinstance(v, torch.Tensor) for s in samples for v in vars(s).values())
    m = learner.update(samples, [1.0, -1.0] * 5)
    handles = {s.states.handle for s in samples}
    assert not handles & set(asked), "the driver fetched a state object"
    shares = [rows_read(samples, cfg, 2, r) for r in range(2)]
    assert sorted(shares[0] + shares[1]) == list(range(len(samples))) and all(shares)
    assert "latent/policy_shift" in m
    fetched = rows_fetched(samples, cfg)
    rank_bytes = [sum(samples[i].states.nbytes for i in rows) for rows in fetched]
    assert m["state_plane/rows"] == sum(map(len, fetched))  # each rank fetched its rows, nothing else ...
    assert m["state_plane/bytes"] == sum(rank_bytes)
    assert m["state_plane/bytes_max_rank"] == max(rank_bytes)
    assert m["state_plane/bytes"] == sum(4 * 128 * samples[i].response_len for rows in fetched for i in rows)  # fp32
    # one row for two ranks: rank 1 fetches nothing and runs its stand-in micro-batch on zero states of width d
    m = learner.update(samples[:1], [1.0])
    assert m["state_plane/rows"] == 1 and m["state_plane/bytes_max_rank"] == samples[0].states.nbytes
    assert not handles & set(asked)
    monkeypatch.undo()
    del samples, handles

    def owned() -> int:  # the driver owns the state objects (the engines' second return value): its reference
        # table lists each live one; the engine actors' tables hold none of them (see the end)
        table = ray._private.worker.global_worker.core_worker.get_all_reference_counts()
        return sum(1 for k in table if (k.decode() if isinstance(k, bytes) else str(k)) in state_ids)  # hex ids

    state_ids: set[str] = set()
    in_engines = sum(real_get([a.referenced_objects.remote() for a in rollout.actors]))

    def settled(done) -> int:  # Ray frees asynchronously (reference-count messages between processes)
        gc.collect()
        deadline = time.monotonic() + 30
        while not done(owned()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return owned()

    gc.collect()
    time.sleep(2)  # the first part's samples were just dropped: let their frees land before counting
    baseline = owned()
    # over steps, as rl.loop runs them (generate, update, drop the samples): nothing accumulates, not in the
    # engine actor and not in the ranks (a rank that kept a fetched array would keep its object alive)
    for step in range(3):
        samples = rollout.generate(prompts, params(max_tokens=8, seed=step), min_version=0)
        state_ids |= {s.states.handle.hex() for s in samples}
        want = baseline + len({s.states.handle for s in samples})
        stored = lambda n, want=want: n >= want
        assert stored(settled(stored)), f"step {step}: the states are not in the store"  # the step's states ...
        learner.update(samples, [1.0, -1.0] * 5)
        del samples
        freed = lambda n: n <= baseline
        assert freed(settled(freed)), f"step {step}: state objects outlived their samples"  # ... and gone
    # the engine actors' reference tables stay flat: they own none of the states (the soak's memory-store entries)
    assert sum(real_get([a.referenced_objects.remote() for a in rollout.actors])) <= in_engines + 2


def test_engines_and_ranks_hand_freed_heap_back_every_few_batches(ray_workers):
    """RSS that ratchets up to the largest step seen is malloc keeping freed memory (actors/memory.py): each engine
    actor counts its generate calls, each learner rank its updates, and every `ray.trim_heap_every`-th they give
    the freed heap back (set to 1 here, inside the actors); other calls count nothing."""
    import ray

    _, rollout, learner, _ = ray_workers

    def count_trims(actor) -> int:  # in the actor (`__ray_call__`; nested, so Ray ships it by value): trim every
        import actors.memory as memory  # batch, and wrap release_freed_heap with a counter; the count since

        if not hasattr(memory, "trims"):
            memory.trims, real, actor.heap.every = 0, memory.release_freed_heap, 1

            def counted():
                memory.trims += 1
                return real()

            memory.release_freed_heap = counted
        return memory.trims

    actors = rollout.actors + learner.actors
    assert ray.get([a.__ray_call__.remote(count_trims) for a in actors]) == [0] * len(actors)
    samples = rollout.generate([[1, 5, 6], [1, 7], [1, 8, 9, 10]], params(max_tokens=4), min_version=0)
    learner.update(samples, [1.0, -1.0, 0.5] * 3)
    learner.weight_checksums()  # not a batch: no trim
    assert ray.get([a.__ray_call__.remote(count_trims) for a in actors]) == [1] * len(actors)


def test_heap_trimmer_trims_every_nth_batch(monkeypatch):
    import actors.memory as memory

    trims = []
    monkeypatch.setattr(memory, "release_freed_heap", lambda: trims.append(1) or True)
    every3, never = memory.HeapTrimmer(3), memory.HeapTrimmer(0)
    assert [every3.after_batch() for _ in range(7)] == [False, False, True, False, False, True, False]
    assert not any(never.after_batch() for _ in range(7)) and len(trims) == 2
    assert load_config(None, ["ray.trim_heap_every=10"]).ray.trim_heap_every == 10


def test_release_freed_heap_returns_what_malloc_kept():
    """Free every other one of 1,500 64 KiB blocks (below malloc's mmap threshold: they live in its heap; the live
    ones keep the freed ones from being the heap's top, which free() alone would give back): malloc keeps ~47 MiB
    resident until `release_freed_heap` hands it back."""
    from actors.memory import release_freed_heap

    if not release_freed_heap():
        pytest.skip("no glibc malloc_trim here")

    def rss_mib() -> float:
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    blocks = [bytearray(64 * 1024) for _ in range(1500)]  # bytearray writes its zeros: the pages are resident
    del blocks[::2]
    before = rss_mib()
    assert release_freed_heap()
    assert before - rss_mib() > 30, (before, rss_mib())
    del blocks


def test_reward_actor_scores_like_main_thread(ray_workers):
    """The plain reward actor (math-verify in its pool + format reward, weighted) gives the main thread's scores."""
    cfg, _, _, rewards = ray_workers
    prompts = ["What is 2+3?"] * 5
    completions = ["so \\boxed{5}", "\\boxed{6}", "no anchor 5", "\\boxed{5}", "\\boxed{5"]
    answers = ["5"] * 5
    reasons = ["stop", "stop", "stop", "length", "stop"]
    columns = {"difficulty": [1, 2, 3, 1, 2]}  # dataset columns cross to the actor with the batch
    local = LocalRewards(cfg)
    want = local.score(prompts, completions, answers, reasons, columns)
    local.close()
    got = rewards.score(prompts, completions, answers, reasons, columns)
    assert got.rewards == want.rewards == pytest.approx([1.1, 0.1, 0.0, 0.0, 0.0])
    assert got.correct == want.correct == [True, False, False, False, False]  # the math check, not reward > 0
    strip = lambda m: {k: v for k, v in m.items() if "latency" not in k}
    assert strip(got.metrics) == strip(want.metrics)
