"""A vLLM weight-transfer backend whose update calls carry the tensors: the engine side of `native_ray`.

vLLM's native weight transfer (`vllm.distributed.weight_transfer`: NCCL broadcast, CUDA IPC) runs a fixed
lifecycle on every worker: `init_transfer_engine` once, then per sync `start_weight_update` (layerwise reload
begins), `update_weights` per chunk (receive, then `model.load_weights`), `finish_weight_update` (layerwise reload
finalized: CPU kernels repacked). This backend runs that same lifecycle with one difference: a chunk's tensors
arrive inside `update_info` (the trainer sends them through Ray, actors/weight_sync.py) instead of over NCCL or
as IPC handles. So on a machine without a GPU the whole native path — the trainer engine protocol, the engines
as vLLM's sync client, the worker's lifecycle, the FBT model's reload and the version tag — is exercised, all but
the GPU data plane (docs/CLUSTER.md).

Registered under `BACKEND` in vLLM's `WeightTransferEngineFactory` by `register_inline_transfer()`; an engine built with
`weight_transfer_config=WeightTransferConfig(backend=BACKEND)` gets it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo

BACKEND = "fbrl_inline"


@dataclass
class InlineInitInfo(WeightTransferInitInfo):
    """Nothing to rendezvous: the tensors come with the update calls."""


@dataclass
class InlineUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    tensors: list = field(default_factory=list)

    def __post_init__(self):
        n = len(self.names)
        if not (len(self.dtype_names) == len(self.shapes) == len(self.tensors) == n):
            raise ValueError(
                f"update info: {n} names, {len(self.dtype_names)} dtypes, {len(self.shapes)} shapes, "
                f"{len(self.tensors)} tensors"
            )
        for name, dt, shape, t in zip(self.names, self.dtype_names, self.shapes, self.tensors):
            if str(t.dtype).removeprefix("torch.") != dt or list(t.shape) != list(shape):
                raise ValueError(f"update info: {name} announced {dt} {list(shape)}, carries {t.dtype} {list(t.shape)}")


class InlineWeightTransferEngine(WeightTransferEngine[InlineInitInfo, InlineUpdateInfo]):
    init_info_cls = InlineInitInfo
    update_info_cls = InlineUpdateInfo

    def init_transfer_engine(self, init_info: InlineInitInfo) -> None:
        self.ready = True

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict) -> None:
        # the base class ends with torch.accelerator.synchronize(), which has nothing to wait for on CPU
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: InlineUpdateInfo) -> None:
        if not getattr(self, "ready", False):
            raise RuntimeError("inline weight transfer not initialized: call init_weight_transfer_engine first")
        pairs = list(zip(update_info.names, (t.to(self.device) for t in update_info.tensors)))
        if getattr(self.model.config, "tie_word_embeddings", False):
            # A tied checkpoint sends the embedding once, but vLLM's CPU layers keep a separately repacked LM head:
            # feed it the embedding too (as rollout.vllm_worker_ext.fbt_load_weights does), or it keeps old weights.
            names = set(update_info.names)
            pairs += [
                ("lm_head.weight", t)
                for n, t in pairs
                if n == "model.embed_tokens.weight" and "lm_head.weight" not in names
            ]
        self.model.load_weights(pairs)

    def shutdown(self) -> None:
        self.ready = False


def register_inline_transfer() -> None:
    """Make `BACKEND` known to vLLM's worker-side factory (idempotent; in the process that builds the engine)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, InlineWeightTransferEngine)
