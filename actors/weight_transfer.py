"""The learner's side of vLLM's native weight transfer (`rollout.weight_sync: nccl | ipc | native_ray`;
actors/weight_sync.py chooses and drives it): the weights as the `WeightSource` vLLM's trainer engines iterate
(`GatheredWeights`, gathered one parameter at a time under ZeRO-3; `MergedWeights` for a LoRA learner), and the
trainer-side engine of each backend (`trainer_transfer`; `InlineTrainerTransfer` for native_ray, which carries the
tensors through Ray and so runs on CPU)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from actors.weight_sync import NATIVE


@dataclass(frozen=True)
class ParamMeta:
    """What vLLM's trainer engines read from `WeightSource.metadata()`: name, dtype, full shape."""

    name: str
    dtype: torch.dtype
    shape: tuple


class GatheredWeights:
    """The `WeightSource` vLLM's trainer engines iterate (duck-typed: `metadata()` and `__iter__`): a learner's
    parameters in `named_parameters()` order (tied weights once), each gathered in full under ZeRO-3 — a collective
    every rank runs in the same order — and yielded as a copy on the learner's device (the gathered storage is
    released when the next parameter is gathered)."""

    def __init__(self, module, gathered):
        self.module, self.gathered = module, gathered  # gathered(p): the learner's ZeRO-3 gather context

    def metadata(self) -> list[ParamMeta]:
        return [
            ParamMeta(n, p.dtype, tuple(getattr(p, "ds_shape", p.shape))) for n, p in self.module.named_parameters()
        ]

    def __iter__(self):
        for name, p in self.module.named_parameters():
            with self.gathered(p):
                t = p.detach().clone()
            yield name, t


def trainer_transfer(backend: str, rank: int, client, source, init: dict, master: tuple[str, int]):
    """vLLM's trainer-side engine for `backend`, set up on learner rank `rank` (every rank calls this; rank 0
    opens the transfer with the engines through `client`)."""
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

        info = NCCLTrainerInitInfo(
            master_address=master[0], master_port=master[1], world_size=init["world_size"], rank=rank
        )
        return NCCLTrainerWeightTransferEngine.trainer_init(info, client=client, source=source)
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo, IPCTrainerWeightTransferEngine

        info = IPCTrainerInitInfo(rank=rank, packed=True, packed_buffer_size_bytes=init["bucket_bytes"])
        return IPCTrainerWeightTransferEngine.trainer_init(info, client=client, source=source)
    if backend == "native_ray":
        return InlineTrainerTransfer(rank, client, source, init["bucket_bytes"])
    raise ValueError(f"no native weight transfer {backend!r} (expected one of {NATIVE})")


class MergedWeights:
    """A LoRA learner's merged weights as the `WeightSource` vLLM's native trainer transfer iterates (duck-typed as
    `GatheredWeights`: `metadata()` and `__iter__`, the same names and order)."""

    def __init__(self, lora):
        self.lora = lora  # rl.model.lora_policy.LoraPolicy

    def metadata(self) -> list:
        return [ParamMeta(n, dtype, shape) for n, dtype, shape in self.lora.metadata()]

    def __iter__(self):
        for name, t in self.lora.merged_tensors():
            yield name, t.clone()


class InlineTrainerTransfer:
    """The trainer side of native_ray, shaped like vLLM's `TrainerWeightTransferEngine`: rank 0 runs vLLM's
    worker-side lifecycle on every engine (init, start, update per bucket, finish) with each bucket's tensors
    inside the update call (through Ray) where NCCL would broadcast them and CUDA IPC would share them; other
    ranks only take part in the gathers. The worker side is `rollout.vllm_inline_transfer`."""

    def __init__(self, rank: int, client, source, bucket_bytes: int):
        self.is_sender, self.client, self.source, self.bucket_bytes = rank == 0, client, source, bucket_bytes
        if self.is_sender:
            client.init_weight_transfer_engine({})

    def send_weights(self) -> None:
        if not self.is_sender:
            for _ in self.source:  # the gathers are collective
                pass
            return
        self.client.start_weight_update()
        bucket, size = [], 0
        for name, t in self.source:
            bucket.append((name, t.to("cpu")))
            size += t.numel() * t.element_size()
            if size >= self.bucket_bytes:
                self._send(bucket)
                bucket, size = [], 0
        if bucket:
            self._send(bucket)
        self.client.finish_weight_update()

    def _send(self, bucket) -> None:
        self.client.update_weights(
            {
                "names": [n for n, _ in bucket],
                "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket],
                "tensors": [t for _, t in bucket],
            }
        )
