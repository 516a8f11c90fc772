"""What a vLLM engine needs around it to decode an FBT with latent feedback: the `vllm.LLM` options it forces
(`FORCED_OPTIONS`, each with the reason), the process environment it sets before vLLM starts
(`engine_environment`, `apply_environment`), the eager token-rank count on CPU (`use_eager_token_ranks`),
where scratch files go (`scratch_dir`), and the options an engine is built with (`engine_options`, with the KV
cache size `kv_gib_needed`)."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `fbrl train`'s input checks use this module (the KV cache's size) before torch is needed
    import torch

WORKER_EXTENSION = "rollout.vllm_worker_ext.FBTWorkerExtension"

# Options latent-feedback decoding cannot run with: name -> (forced value, why).
# Prefix caching stays available (on by default, `engine_options`): a plain prompt token's K/V hold no recurrent
# state, and the state slot only needs h at the last computed position, which the uncached rest of the prompt
# writes. The plugin keeps the slot in mamba cache mode "none" out of prefix caching (vLLM's default for hybrid
# models, mode "align", would chunk prompts at block boundaries and checkpoint a state per block) and decides
# plain vs fused per token by its position; the engine gives every request a cache salt that keeps apart what
# must not be shared (rollout/vllm_requests.py `cache_salts`: fused prompts, fed continuations, other calls' weights).
FORCED_OPTIONS = {
    "enable_chunked_prefill": (False, "a fused prompt's passes must see the whole prompt in one step"),
    "speculative_config": (None, "draft tokens would be fed without their latent state"),
    "async_scheduling": (False, "the recorded states and slots assume one step at a time"),
    "enforce_eager": (
        True,
        "the per-request modes and recorded states are host-side bookkeeping a captured CUDA "
        "graph would replay stale (docs/GPU.md)",
    ),
    "logprobs_mode": ("processed_logprobs", "engine log-probs must be those of the distribution sampled from"),
    "worker_extension_cls": (WORKER_EXTENSION, "weights and recorded states travel through it"),
    "skip_tokenizer_init": (True, "the engine is token-in, token-out"),
    "pipeline_parallel_size": (1, "layer 0 needs the top layer's state"),
    "mamba_cache_mode": ("none", "the state slot must hold only the latest h_prev, never a cached one"),
}


def engine_environment(on_cpu: bool, dtype: str, weight_transfer_backend: str | None):
    """(required, defaults): environment variables the engine sets before vLLM starts, name -> (value, why).

    A required variable the user set to another value is an error; a default yields to the user's value. They
    are process-wide and inherited by vLLM's engine and worker processes (docs/GPU.md).
    """
    required = {
        # vLLM 0.32 picks the V2 model runner on CUDA whenever Triton is installed (VllmConfig.use_v2_model_runner).
        # The plugin finds each request's decode mode, key and prompt length in the V1 runner's request table
        # (`input_batch.req_ids`, `requests`, `query_start_loc`), which V2 does not have; and the V1 runner is the
        # one CI exercises (the CPU runner subclasses it). tests/test_vllm_gpu_ready.py pins this choice.
        "VLLM_USE_V2_MODEL_RUNNER": ("0", "the FBT plugin reads the V1 model runner's request table"),
    }
    defaults = {}
    if on_cpu:
        # In-process engine: up in seconds, and no process to orphan (docs/DESIGN.md §9).
        defaults["VLLM_ENABLE_V1_MULTIPROCESSING"] = ("0", "in-process engine on CPU")
        # vLLM's CPU GEMMs (onednn_mm) build a oneDNN primitive per batch size M, and oneDNN keeps up to 1024 of them
        # in its process-wide cache: a rollout actor's heap grew by ~250 MiB over its first ~40 steps (a new M at
        # almost every decode step) before it levelled off. vLLM's per-layer handlers keep their own 32 per weight
        # shape, so a small global cache costs no speed (tools/engine_memory.py; docs/RELIABILITY.md, "What grew
        # in the rollout actor"). Read by oneDNN at its first primitive, i.e. when vLLM builds the model.
        defaults["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = ("64", "bounds the memory oneDNN's primitive cache holds")
    else:
        if weight_transfer_backend == "ipc":
            # The IPC update info (CUDA IPC handles: storage classes, dtypes) crosses collective_rpc to a worker in
            # another process; vLLM's msgpack serializer refuses such objects unless pickling is allowed. The
            # sockets are vLLM's own local IPC channels between this process and its engine core.
            required["VLLM_ALLOW_INSECURE_SERIALIZATION"] = ("1", "CUDA IPC handles cross collective_rpc pickled")
        if str(dtype).removeprefix("torch.") in ("float32", "float"):
            # fp32 attention on GPU runs in Triton kernels whose tl.dot defaults to TF32 (10-bit mantissa, ~1e-3
            # relative error per product): an fp32 engine then is not fp32. "ieee" makes those dots true fp32.
            defaults["TRITON_F32_DEFAULT"] = ("ieee", "dtype=float32 means fp32 attention too")
    return required, defaults


def apply_environment(required: dict, defaults: dict) -> None:
    """Set `engine_environment`'s variables; ValueError naming a required one the user set otherwise."""
    for name, (value, why) in required.items():
        current = os.environ.get(name)
        if current is not None and current.strip() != value:
            raise ValueError(
                f"VLLMEngine: environment variable {name}={current!r} is incompatible with "
                f"latent-feedback decoding ({why}); unset it or set it to {value!r}"
            )
    for name, (value, _) in required.items():
        os.environ[name] = value
    for name, (value, _) in defaults.items():
        os.environ.setdefault(name, value)
    # An in-process engine core freezes vLLM's view of the environment (vllm.envs.enable_envs_cache); a later
    # engine in this process must see the values set above.
    from vllm import envs

    envs.disable_envs_cache()


def count_at_least(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Per row of `x`, how many entries are >= that row's value: vLLM's sampled-token rank, eagerly."""
    return (x >= values).sum(-1)


def use_eager_token_ranks() -> None:
    """On CPU, vLLM's sampler computes every sampled token's rank (`Logprob.rank`, which fbrl never reads) with
    a `torch.compile`d function whose first call in a process JIT-compiles a C++ kernel through Inductor: ~10 s of
    the first `generate` of every engine process on a 2-core machine (a profile of the first call: 80 % in
    Inductor). The compiled kernel saves a [tokens, vocab] bool temporary, which matters on a GPU's memory, not
    on a CPU's; the same count runs eagerly instead, with the same result."""
    import vllm.v1.sample.sampler as sampler

    sampler.batched_count_greater_than = count_at_least


def scratch_dir() -> str:
    """Shared memory when the machine has it (files there never touch a disk)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def sweep_scratch(directory: str | None = None) -> list[str]:
    """Delete the weight and state files (`fbrl_<kind>_<pid>_...`) that engine processes which no longer exist
    left in the scratch directory: a killed engine never removes its copy, and in /dev/shm it holds memory until
    the machine reboots. Run when an engine starts (a replacement starts on the node its predecessor died on)."""
    from rl.atomic_files import pid_alive

    gone = []
    for path in Path(directory or scratch_dir()).glob("fbrl_*_*_*.safetensors"):
        pid = path.name.split("_")[2]
        if pid.isdigit() and not pid_alive(int(pid)):
            path.unlink(missing_ok=True)
            gone.append(str(path))
    return gone


def engine_options(
    config,
    on_cpu: bool,
    extra,
    decode_mode,
    max_model_len,
    max_num_seqs,
    kv_cache_gib,
    seed,
    dtype,
    tp,
    gpu_util,
    wt_backend,
    blocks_override,
) -> dict:
    """The `vllm.LLM` options of a `VLLMEngine` (rollout/vllm_engine.py has what each argument means): the forced
    ones, the KV cache size (on CPU: what `max_num_seqs` full-length sequences need), the executor and the
    native weight transfer; `extra` (more `vllm.LLM` options) last. An option that contradicts `FORCED_OPTIONS`,
    or a transfer backend on CPU, is a ValueError naming it."""
    for name, value in extra.items():
        if name in FORCED_OPTIONS and value != FORCED_OPTIONS[name][0]:
            forced, why = FORCED_OPTIONS[name]
            raise ValueError(
                f"VLLMEngine: engine option {name}={value!r} is incompatible with latent-feedback "
                f"decoding ({why}); it must be {forced!r}"
            )
    mnbt = extra.pop("max_num_batched_tokens", max(max_model_len, 4096))
    if mnbt < max_model_len:
        raise ValueError(
            f"VLLMEngine: engine option max_num_batched_tokens={mnbt} is incompatible with "
            f"latent-feedback decoding: it must be >= max_model_len={max_model_len} so no prompt "
            f"is chunked"
        )
    hf_overrides = dict(extra.pop("hf_overrides", None) or {})
    for key in ("architectures", "model_type"):
        if key in hf_overrides:
            raise ValueError(
                f"VLLMEngine: engine option hf_overrides[{key!r}] is incompatible: the checkpoint's "
                f"own {key} selects the FBT plugin"
            )
    hf_overrides["fbt_decode_mode"] = decode_mode
    opts = {name: forced for name, (forced, _) in FORCED_OPTIONS.items()}
    opts.update(
        enable_prefix_caching=True,  # a group's samples and prompts with a shared prefix prefill it once
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=mnbt,
        seed=seed,
        dtype=dtype,
        tensor_parallel_size=tp,
        hf_overrides=hf_overrides,
    )
    if kv_cache_gib is None and on_cpu:
        kv_cache_gib = kv_gib_needed(config, max_model_len, max_num_seqs, dtype)
    if kv_cache_gib is not None:  # on GPU, None: vLLM sizes the cache from gpu_memory_utilization
        opts["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
    if blocks_override is not None:
        opts["num_gpu_blocks_override"] = int(blocks_override)
    if on_cpu:
        opts["distributed_executor_backend"] = "uni"
        if wt_backend is not None:
            raise ValueError(
                f"VLLMEngine: weight_transfer_backend={wt_backend!r} needs a GPU; on CPU weights "
                f"go through load_weights(path, version)"
            )
    else:
        opts["gpu_memory_utilization"] = gpu_util
        if wt_backend is not None:
            from vllm.config import WeightTransferConfig

            opts["weight_transfer_config"] = WeightTransferConfig(backend=wt_backend)
    opts.update(extra)
    return opts


def kv_sequences_fit(config, max_model_len: int, kv_cache_gib: float, dtype) -> float:
    """How many sequences of `max_model_len` tokens a CPU KV cache of `kv_cache_gib` holds, as vLLM pages a
    hybrid model's cache: ceil(L / 128) + 1 blocks of 128 tokens each (measured: it predicts vLLM's own
    `kv_cache_max_concurrency` to the digit shown in the engine's refusal)."""
    per_token = _kv_bytes_per_token(config, dtype)
    return kv_cache_gib * 2**30 / (per_token * (math.ceil(max_model_len / 128) + 1) * 128)


def _kv_bytes_per_token(c, dtype) -> int:
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    half = dtype in ("bfloat16", "float16", "half") or (
        dtype == "auto" and str(getattr(c, "dtype", "float32")) in ("bfloat16", "float16")
    )
    return (
        2
        * c.num_hidden_layers
        * (getattr(c, "num_key_value_heads", None) or c.num_attention_heads)
        * head_dim
        * (2 if half else 4)
    )


def kv_gib_needed(config, max_model_len, max_num_seqs, dtype) -> float:
    """KV bytes for max_num_seqs full-length sequences, with head-room for vLLM's hybrid page padding and
    the state slots."""
    per_token = _kv_bytes_per_token(config, dtype)
    # vLLM CPU pages a hybrid model's KV in 128-token blocks, and each request also holds one state page of a
    # block's size: ceil(L / 128) + 1 blocks (2 x L alone fell short at L = 140: 53 of 64 sequences fit)
    tokens = max(2 * max_model_len, (math.ceil(max_model_len / 128) + 1) * 128)
    need = per_token * tokens * max_num_seqs
    return max(0.25, math.ceil(1.1 * need / 2**30 * 8) / 8)
