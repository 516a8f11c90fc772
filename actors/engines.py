"""The rollout engines by name (`rollout.engine`): how each is built from the config, and what it supports.

An entry is a builder `build(cfg, index, weight_sync) -> RolloutEngine` (loaded from `model.path`, at policy
version 0, ready for the resolved weight-sync transport) registered with `register_engine(name)`. Every engine
receives weights as a state dict (`RolloutEngine.load_weights`: the `file` and `ray` transports); a transport that
needs more says which engines it serves (`actors.weight_sync.TRANSPORTS`). The config's `rollout.engine` choices
are these names (tests/test_config_choices.py); the rollout actors build with `build_engine`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from rl.registry import lookup


@dataclass(frozen=True)
class EngineKind:
    name: str
    build: Callable  # (cfg, index, weight_sync) -> RolloutEngine


ENGINES: dict[str, EngineKind] = {}


def register_engine(name: str):
    """Decorator: register `build(cfg, index, weight_sync)` as engine `name`; a taken name is an error."""

    def deco(build):
        if name in ENGINES and ENGINES[name].build is not build:
            raise ValueError(f"rollout engine {name!r} is already registered")
        ENGINES[name] = EngineKind(name, build)
        return build

    return deco


def engine_kind(name: str) -> EngineKind:
    """The entry of `rollout.engine` `name`; ValueError listing the valid names otherwise."""
    return lookup(ENGINES, "rollout.engine", name)


def build_engine(cfg, index: int = 0, weight_sync: str = "file"):
    """The engine the config asks for (`rollout.engine`), engine `index` of the fleet."""
    return engine_kind(cfg.rollout.engine).build(cfg, index, weight_sync)


@register_engine("torch")
def _torch_engine(cfg, index: int, weight_sync: str):
    import torch

    from rl.model.files import load_fbt
    from rollout.torch_engine import TorchEngine

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.model.dtype]
    model = load_fbt(cfg.model.path, dtype)
    if cfg.rollout.num_gpus_per_engine > 0:
        model = model.to("cuda")
    return TorchEngine(model, version=0)


@register_engine("vllm")
def _vllm_engine(cfg, index: int, weight_sync: str):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # before vllm is imported
    from rl.data.prompts import vllm_max_model_len  # one rule, shared with the prompt-length limit
    from rl.model.files import load_fbt_config
    from rollout.vllm_engine import VLLMEngine

    if not cfg.logging.verbose:  # the warnings every fbrl engine triggers, dropped before the engine is built
        import vllm  # noqa: F401  (configures vLLM's logging, whose handlers get the filter)

        from actors.console import drop_vllm_noise

        drop_vllm_noise()
    r, v = cfg.rollout, cfg.rollout.vllm
    model_config = load_fbt_config(cfg.model.path)
    extra = {"enable_prefix_caching": v.enable_prefix_caching}
    if not v.enforce_eager:
        extra["enforce_eager"] = False
    if weight_sync in ("nccl", "ipc"):
        extra["weight_transfer_backend"] = weight_sync
    elif weight_sync == "native_ray":
        from vllm.config import WeightTransferConfig

        from rollout import vllm_inline_transfer

        vllm_inline_transfer.register_inline_transfer()
        extra["weight_transfer_config"] = WeightTransferConfig(backend=vllm_inline_transfer.BACKEND)
    return VLLMEngine(
        cfg.model.path,
        decode_mode=r.decode_mode,
        version=0,
        max_model_len=vllm_max_model_len(cfg, model_config),
        max_num_seqs=v.max_num_seqs,
        kv_cache_gib=None if r.num_gpus_per_engine > 0 else v.kv_cache_gib,
        seed=cfg.train.seed + 1000 * index,
        dtype=cfg.model.dtype,
        gpu_memory_utilization=v.gpu_memory_utilization,
        **extra,
    )
