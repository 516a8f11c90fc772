"""The process and DeepSpeed set-up of a learner rank: the rendezvous (loopback-only on one machine), the rank's
torch threads, the DeepSpeed config, and the pieces `actors.learner_rank.LearnerRank` hands DeepSpeed (the stage-0 client
optimizer, the `rl.train.policy_update.Backend` a DeepSpeed engine is, a checkpoint engine that loads with
`weights_only=True`). The gradient and accumulation contract these settings implement is in `actors.learner_rank`'s
docstring."""

from __future__ import annotations

import os
import socket

import torch

from actors.resources import role_threads


# ---- process setup ------------------------------------------------------------------------------------------
def free_port() -> int:
    """A TCP port free on this node right now (the OS picks it; the rendezvous binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def use_gpu(lcfg) -> bool:
    return lcfg.num_gpus_per_worker > 0 and torch.cuda.is_available()


def dist_backend(lcfg) -> str:
    if lcfg.dist_backend != "auto":
        return lcfg.dist_backend
    return "nccl" if use_gpu(lcfg) else "gloo"


def set_dist_env(rank: int, world_size: int, master_addr: str, master_port: int, local_rank: int) -> None:
    """The env:// rendezvous variables. Without them deepspeed.init_distributed tries MPI discovery (mpi4py)."""
    os.environ.update(
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=os.environ.get("LOCAL_WORLD_SIZE", str(world_size)),
    )


def is_loopback(addr: str) -> bool:
    return addr == "localhost" or addr.startswith("127.") or addr == "::1"


def init_loopback_process_group(backend: str, rank: int, world_size: int, port: int) -> None:
    """torch.distributed for ranks that all run on this machine (a local run, rendezvous at 127.0.0.1), over a
    TCPStore listening on 127.0.0.1 only: `init_method="env://"` would bind the store to every interface. Rank 0
    binds the socket itself and hands it to the store (`master_listen_fd`; detached, so the store owns and closes
    it). gloo's own sockets follow GLOO_SOCKET_IFNAME (`lo` in a local run, actors/placement.py)."""
    if rank == 0:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        store = torch.distributed.TCPStore("127.0.0.1", port, world_size, True, master_listen_fd=sock.detach())
    else:
        store = torch.distributed.TCPStore("127.0.0.1", port, world_size, False)
    torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=world_size)


def learner_threads(cfg, cores: int, reserved_cpus: float, one_machine: bool) -> int:
    """torch threads of each learner rank (`learner.num_threads`; the rule: `actors.resources.role_threads`)."""
    return role_threads(
        cfg.learner.num_threads, cfg.learner.num_workers, cfg.train.max_staleness, cores, reserved_cpus, one_machine
    )


def disable_shm_comm_jit() -> None:
    """Keep DeepSpeed from JIT-compiling its shm allreduce op (only used by inference_all_reduce)."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def client_optimizer(lcfg) -> bool:
    """Whether the rank hands DeepSpeed its own optimizer (`ClippingAdamW`) rather than naming one in the config:
    with no ZeRO and fp32 weights DeepSpeed steps a torch optimizer as it is and computes no gradient norm."""
    return lcfg.zero_stage == 0 and not lcfg.bf16


def deepspeed_config(lcfg) -> dict:
    """The DeepSpeed config of a learner rank (see the module docstring for the accumulation settings)."""
    zero = {"stage": lcfg.zero_stage}
    if lcfg.zero_stage == 3:
        # Export and checkpoints gather full weights explicitly; no 16-bit consolidation at save time.
        zero["stage3_gather_16bit_weights_on_model_save"] = False
    cfg = {
        "train_micro_batch_size_per_gpu": lcfg.micro_batch_size,  # bookkeeping only: the plan decides
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "zero_optimization": zero,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": lcfg.lr,
                "betas": list(lcfg.adam_betas),
                "eps": 1e-8,
                "weight_decay": lcfg.weight_decay,
                "torch_adam": lcfg.torch_adam,
            },
        },
        "gradient_clipping": lcfg.grad_clip,
        "bf16": {"enabled": lcfg.bf16},
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }
    if lcfg.bf16:  # DeepSpeed's default sums micro-batch gradients in the model's dtype
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    if client_optimizer(lcfg):  # ClippingAdamW clips and reports the norm itself
        del cfg["optimizer"]
        cfg["gradient_clipping"] = 0.0
    if lcfg.warmup_steps > 0:
        cfg["scheduler"] = {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": lcfg.lr,
                "warmup_num_steps": lcfg.warmup_steps,
                "warmup_type": "linear",
            },
        }
    return cfg


# ---- DeepSpeed pieces -----------------------------------------------------------------------------------------
class ClippingAdamW(torch.optim.AdamW):
    """The optimizer of `learner.zero_stage: 0` in fp32, which DeepSpeed steps unwrapped once it has reduced the
    gradients (its own clipping there computes a norm it throws away): torch AdamW that clips to `max_norm`, keeps
    the global norm as `_global_grad_norm` (what the engine's `get_global_grad_norm` then reports), and skips a
    non-finite step, setting `overflow` (read by the engine and `DeepSpeedBackend` as a skipped step)."""

    def __init__(self, params, max_norm: float, **kwargs):
        super().__init__(params, **kwargs)
        self.max_norm = max_norm
        self._global_grad_norm = None
        self.overflow = False

    @torch.no_grad()
    def step(self, closure=None):
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        norm = float(torch.nn.utils.clip_grad_norm_(params, self.max_norm or float("inf")))
        self._global_grad_norm, self.overflow = norm, not torch.isfinite(torch.tensor(norm))
        return None if self.overflow else super().step(closure)


class DeepSpeedBackend:
    """`rl.train.policy_update.Backend` on a DeepSpeed engine: gradients summed over ranks and micro-batches."""

    def __init__(self, engine, world_size: int):
        self.engine = engine
        self.world_size = world_size

    def backward(self, loss: torch.Tensor) -> None:
        # x world_size: DeepSpeed averages over ranks, the contract sums. scale_wrt_gas=False: no division by
        # gradient_accumulation_steps (it is 1 anyway; the updater's plan owns accumulation).
        self.engine.backward(loss * self.world_size, scale_wrt_gas=False)

    def step(self) -> float:
        self.engine.step()  # managed_gradient_accumulation=False: every step() is the boundary
        if getattr(self.engine.optimizer, "overflow", False):
            # ZeRO found an inf/NaN gradient and skipped the step (weights and optimizer state unchanged); under
            # ZeRO-3 get_global_grad_norm() would still report the previous step's norm.
            return float("inf")
        norm = self.engine.get_global_grad_norm()
        if norm is None:  # a DeepSpeed path that computes no norm (stage 0 in fp32 uses ClippingAdamW, which does)
            raise RuntimeError(
                "DeepSpeed reported no gradient norm after step() (learner.zero_stage "
                f"{self.engine.zero_optimization_stage()})"
            )
        return float(norm)


# ---- loading our own checkpoints without unpickling code --------------------------------------------------------
def safe_checkpoint_engine(engine):
    """DeepSpeed's torch checkpoint engine, loading with `weights_only=True` (tensors, containers and the few
    DeepSpeed/Python types its files hold), so loading the learner state of a run directory runs no code. (The
    resume still imports the reward files the run's config.yaml names: docs/RELIABILITY.md, Security.)"""
    from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine

    class SafeLoadCheckpointEngine(TorchCheckpointEngine):
        def load(self, path: str, map_location=None):
            with torch.serialization.safe_globals(_checkpoint_safe_globals()):
                return torch.load(path, map_location=map_location, weights_only=True)

    if type(engine.checkpoint_engine) is not TorchCheckpointEngine:
        return engine.checkpoint_engine  # a configured non-default engine (e.g. decoupled/nebula): keep it
    return SafeLoadCheckpointEngine(engine._config)


def _checkpoint_safe_globals() -> list:
    """The non-tensor classes DeepSpeed 0.19.8 pickles into ZeRO 1-3 checkpoints (fp32 and bf16; found by loading
    each with weights_only=True). Allow-listed classes are rebuilt from their fields; no other code runs."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]
