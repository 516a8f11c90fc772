"""What the vLLM path needs on CUDA, checked on CPU (docs/GPU.md): the model-runner choice, the environment of
native IPC weight transfer and fp32 engines, and a decode hot path that reads nothing back from the device.

vLLM 0.32 picks its model runner in `VllmConfig.use_v2_model_runner`: V2 on any machine with Triton (every CUDA
install) unless `VLLM_USE_V2_MODEL_RUNNER` says otherwise. CPU never takes that branch (no Triton backend), so
the tests below run vLLM's own selection with Triton declared present, and pin that the engine's environment turns
it to V1, the runner whose request table the plugin reads.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("vllm")

from test_vllm_engine import ON_GPU, TINY_ARITH, make_prompts, random_tiny_fbt  # noqa: E402
from vllm import envs  # noqa: E402

import rollout.vllm_plugin as plugin  # noqa: E402
from rl.samples.request import SamplingParams  # noqa: E402
from rollout.vllm_engine import VLLMEngine  # noqa: E402
from rollout.vllm_env import apply_environment, engine_environment, engine_options  # noqa: E402

ENV_VARS = (
    "VLLM_USE_V2_MODEL_RUNNER",
    "VLLM_ALLOW_INSECURE_SERIALIZATION",
    "TRITON_F32_DEFAULT",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY",
)


@pytest.fixture
def clean_env(monkeypatch):
    """The engine variables unset (restored afterwards), and vLLM reading the live environment."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    envs.disable_envs_cache()
    yield monkeypatch
    envs.disable_envs_cache()


def cuda_config(monkeypatch):
    """A default VllmConfig on which vLLM's runner selection sees Triton, as on every CUDA machine."""
    import vllm.config.vllm as vllm_config_module
    from vllm.config import VllmConfig

    monkeypatch.setattr(vllm_config_module, "HAS_TRITON", True)
    return VllmConfig()


def test_vllm_would_pick_the_v2_runner_on_cuda_and_the_engine_environment_picks_v1(clean_env):
    cfg = cuda_config(clean_env)
    # vLLM's own default on a CUDA machine: V2 (whose batch has no `input_batch` / `requests`). If this turns
    # False, vLLM changed its default: re-read VllmConfig.use_v2_model_runner before touching the engine.
    assert cfg.use_v2_model_runner is True
    for on_cpu in (False, True):
        for dtype, backend in (("bfloat16", None), ("float32", "ipc"), ("bfloat16", "nccl")):
            required, _ = engine_environment(on_cpu, dtype, None if on_cpu else backend)
            assert required["VLLM_USE_V2_MODEL_RUNNER"][0] == "0"
    apply_environment(*engine_environment(False, "bfloat16", None))
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert cfg.use_v2_model_runner is False


def test_a_v2_runner_request_is_refused_before_vllm_starts(clean_env, tmp_path):
    clean_env.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    random_tiny_fbt(tmp_path)
    with pytest.raises(ValueError, match="VLLM_USE_V2_MODEL_RUNNER='1'.*V1 model runner"):
        VLLMEngine(str(tmp_path), max_model_len=64, max_num_seqs=4, dtype="float32")


def ipc_update_info() -> dict:
    """What IPCTrainerWeightTransferEngine sends through `update_weights` (one unpacked bf16 tensor): the handle is
    torch.multiprocessing's rebuild_cuda_tensor arguments — classes, a dtype, bytes."""
    args = (
        torch.Tensor,
        torch.Size([2, 3]),
        (3, 1),
        0,
        torch.UntypedStorage,
        torch.bfloat16,
        0,
        b"\x01handle",
        12,
        0,
        False,
        b"ref",
        0,
        b"event",
        True,
    )
    return {
        "names": ["model.embed_tokens.weight"],
        "dtype_names": ["bfloat16"],
        "shapes": [[2, 3]],
        "ipc_handles": [{"GPU-0000": args}],
    }


def test_ipc_weight_transfer_environment_lets_the_handles_through_vllms_serializer(clean_env):
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    info = ipc_update_info()
    # What a multiprocess engine's collective_rpc does with the update info: without the variable, vLLM refuses.
    with pytest.raises(TypeError, match="VLLM_ALLOW_INSECURE_SERIALIZATION"):
        MsgpackEncoder().encode(info)
    required, _ = engine_environment(on_cpu=False, dtype="bfloat16", weight_transfer_backend="ipc")
    assert required["VLLM_ALLOW_INSECURE_SERIALIZATION"][0] == "1"
    envs.enable_envs_cache()  # as after an in-process engine started: apply_environment must see through it
    apply_environment(*engine_environment(False, "bfloat16", "ipc"))
    got = MsgpackDecoder().decode(MsgpackEncoder().encode(info))
    handle = got["ipc_handles"][0]["GPU-0000"]  # msgpack hands tuples back as lists; rebuild_cuda_tensor takes them
    sent = ipc_update_info()["ipc_handles"][0]["GPU-0000"]
    assert list(handle) == [list(a) if isinstance(a, tuple) else a for a in sent]
    assert handle[5] is torch.bfloat16 and handle[0] is torch.Tensor


def test_environment_per_engine_kind(clean_env):
    req, dflt = engine_environment(on_cpu=False, dtype="bfloat16", weight_transfer_backend="nccl")
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in req  # NCCL metadata is plain JSON: no pickling
    assert "TRITON_F32_DEFAULT" not in dflt  # bf16 dots have no TF32 question
    req, dflt = engine_environment(on_cpu=False, dtype="float32", weight_transfer_backend=None)
    assert dflt["TRITON_F32_DEFAULT"][0] == "ieee" and "VLLM_ALLOW_INSECURE_SERIALIZATION" not in req
    req, dflt = engine_environment(on_cpu=True, dtype="float32", weight_transfer_backend=None)
    assert "TRITON_F32_DEFAULT" not in dflt and dflt["VLLM_ENABLE_V1_MULTIPROCESSING"][0] == "0"
    assert dflt["ONEDNN_PRIMITIVE_CACHE_CAPACITY"][0] == "64"  # the rollout actor's heap stays bounded

    # defaults yield to the user's choice; required values do not
    clean_env.setenv("TRITON_F32_DEFAULT", "tf32")
    apply_environment(*engine_environment(False, "float32", None))
    assert os.environ["TRITON_F32_DEFAULT"] == "tf32"
    clean_env.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "0")
    with pytest.raises(ValueError, match="VLLM_ALLOW_INSECURE_SERIALIZATION='0'"):
        apply_environment(*engine_environment(False, "bfloat16", "ipc"))


def test_gpu_engine_options_carry_memory_share_and_transfer_backend(tmp_path):
    """The GPU branch of the option builder, without a GPU: the memory share is passed (test engines use a
    small one so several coexist on one GPU) and the native transfer backend is configured."""
    from transformers import AutoConfig

    random_tiny_fbt(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    opts = engine_options(config, False, {}, "soft", 64, 4, 0.5, 0, "float32", 1, 0.05, "ipc", None)
    assert opts["gpu_memory_utilization"] == 0.05
    assert opts["kv_cache_memory_bytes"] == 2**29
    assert opts["weight_transfer_config"].backend == "ipc"
    assert opts["enforce_eager"] is True and "distributed_executor_backend" not in opts


# ---- a live (CPU) engine: the runner it built, and host syncs in the model's forward --------------------------
@pytest.fixture(scope="module")
def small_engine(tmp_path_factory):
    if (TINY_ARITH / "config.json").exists():
        ckpt = str(TINY_ARITH)
    else:
        ckpt = str(tmp_path_factory.mktemp("tiny_fbt"))
        random_tiny_fbt(ckpt)
    eng = VLLMEngine(ckpt, max_model_len=96, max_num_seqs=8, dtype="float32", seed=0, **ON_GPU)
    yield eng
    eng.close()


def test_the_engine_runs_on_the_v1_runner(small_engine):
    import importlib

    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2ModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1ModelRunner

    module, _, name = small_engine.info["model_runner"].rpartition(".")
    runner = getattr(importlib.import_module(module), name)
    # on CPU vLLM's CPUModelRunner, a subclass of V1's GPU runner: the request table the GPU runs once V1 is forced
    assert issubclass(runner, V1ModelRunner) and not issubclass(runner, V2ModelRunner), runner
    assert small_engine.llm.llm_engine.vllm_config.use_v2_model_runner is False


# Tensor methods that read a device tensor back to the host (a stream sync on an accelerator).
SYNCING = ("tolist", "item", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__")


class HostSyncAudit:
    """Counts, per model forward, the syncing calls made from the plugin's own code, and its host-to-device copies
    (`to_device`, asynchronous on an accelerator), split into forwards with and without prefill tokens."""

    def __init__(self, monkeypatch):
        self.inside, self.syncs, self.copies = False, [], []
        self.steps = {"decode": 0, "prefill": 0}
        self.copies_per_kind = {"decode": 0, "prefill": 0}
        self.kind = None
        for name in SYNCING:
            monkeypatch.setattr(torch.Tensor, name, self._spy(name, getattr(torch.Tensor, name)))
        to_device = plugin.to_device

        def counted(*a, **k):
            if self.inside:
                self.copies_per_kind[self.kind] += 1
            return to_device(*a, **k)

        monkeypatch.setattr(plugin, "to_device", counted)

    def _spy(self, name, fn):
        import sys

        def call(t, *a, **k):
            if self.inside and sys._getframe(1).f_code.co_filename == plugin.__file__:
                self.syncs.append(f"{name} at line {sys._getframe(1).f_lineno}")
            return fn(t, *a, **k)

        return call

    def wrap(self, model):
        from vllm.forward_context import get_forward_context

        forward = model.forward

        def audited(*a, **k):
            md = get_forward_context().attn_metadata
            md = md.get(model.fbt_state.prefix) if isinstance(md, dict) else None
            if md is None:
                return forward(*a, **k)
            self.kind = "prefill" if md.num_prefills else "decode"
            self.steps[self.kind] += 1
            self.inside = True
            try:
                return forward(*a, **k)
            finally:
                self.inside = False

        model.forward = audited
        return model


@pytest.mark.parametrize("mode", ["soft", "fused"])
def test_decode_steps_read_nothing_back_from_the_device(small_engine, monkeypatch, mode):
    """Every step of a recorded generate: no device->host read from the plugin's code; host->device copies only
    for a fused prompt's positions (one per prefill step, asynchronous from pinned memory on an accelerator)."""
    audit = HostSyncAudit(monkeypatch)
    small_engine.llm.apply_model(audit.wrap)
    try:
        prompts = make_prompts(small_engine.vocab_size, n=8, seed=4)
        out = small_engine.generate(
            prompts, SamplingParams(temperature=0.0, max_tokens=12, decode_mode=mode, record_states=True)
        )
    finally:
        small_engine.llm.apply_model(lambda m: m.__dict__.pop("forward", None))
    assert all(s.states is not None and s.states.shape[0] == len(s.response_ids) for s in out)
    assert audit.steps["decode"] >= 10 and audit.steps["prefill"] >= 1, audit.steps
    assert audit.syncs == [], audit.syncs
    assert audit.copies_per_kind["decode"] == 0
    assert audit.copies_per_kind["prefill"] == (audit.steps["prefill"] if mode == "fused" else 0)
