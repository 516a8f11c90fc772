"""One DeepSpeed learner rank: the policy, its optimizer state, and the `rl.train.policy_update.Backend` that
DeepSpeed is.

`LearnerRank` works in-process (world_size 1, e.g. `actors/local.py` and the tests) and as a Ray actor
(`actors/learner_group.py` wraps it with `ray.remote`). Each rank is assembled as every learner is
(`actors.learner_assembly.PolicyLearner`: the FBT checkpoint, LoRA, reference, updater), the policy wrapped in a
DeepSpeed engine (ZeRO stage 0–3 from `learner.zero_stage`, torch AdamW, gloo on CPU / NCCL on GPU) and runs
`rl.train.policy_update.PolicyUpdater` on the WHOLE rollout batch: the updater picks this rank's rows from a plan
computed on the whole batch, so every rank makes the same number of backward/step calls. Stage 0 (no ZeRO: the shipped
one-machine layout, one rank on every core, `learner_threads`) steps `ClippingAdamW` as the client optimizer. Under
ZeRO-2 DeepSpeed reduces gradients in the backward hooks of every micro-batch (bucket copies, an all-reduce of the whole
fp32 gradient over the ranks); stages 0 and 1 reduce once, at `step()`.

Gradient semantics (the contract of `rl.train.policy_update.Backend`): each micro-batch loss is already divided by the
GLOBAL token count, so the gradients of all micro-batches on all ranks must be SUMMED. DeepSpeed 0.19.8 instead
(a) averages gradients over the data-parallel ranks and (b) divides the loss by `gradient_accumulation_steps`
when `scale_wrt_gas=True`, and (c) decides by itself, from a micro-step counter, which backward is the
accumulation boundary. So: the loss is multiplied by world_size before `engine.backward` (undoes a),
`scale_wrt_gas=False` with `gradient_accumulation_steps: 1` (no b), and `managed_gradient_accumulation: false`
(0.19.8 config) makes every `engine.step()` the boundary, whatever the number of micro-batches (no c): the
updater's plan, not DeepSpeed's config, decides how many backwards make one step.

DeepSpeed only knows a backward has started through hooks it attaches to the outputs of `engine.forward`
(its `_backward_prologue`: ZeRO's enter_backward, boundary flag, ZeRO-3 bookkeeping). The estimators call
methods of the model (`multipass_forward`, `recurrent_forward`, ...) rather than its `forward`, so the engine
wraps `_Routed`, a module whose forward runs a given function, and each micro-batch's loss is computed through
`engine(fn, ...)` (see `_EngineUpdater`).

JIT compiles (docs/DESIGN.md §9): DeepSpeed's first `init_distributed` builds its shared-memory allreduce op
(`deepspeed_shm_comm`, 70–120 s of g++ in a fresh environment). That op only serves `inference_all_reduce`
(tensor-parallel inference); training collectives go through torch.distributed. `disable_shm_comm_jit()` marks
the op incompatible in `deepspeed.ops.__compatible_ops__` (DeepSpeed caches that dict on first access precisely
so edits persist), so nothing is compiled. Likewise `torch_adam: true` avoids the CPU FusedAdam build (~200 s).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import torch
from torch import nn

from actors.deepspeed_setup import (
    ClippingAdamW,
    DeepSpeedBackend,
    client_optimizer,
    deepspeed_config,
    disable_shm_comm_jit,
    dist_backend,
    free_port,
    init_loopback_process_group,
    is_loopback,
    safe_checkpoint_engine,
    set_dist_env,
    use_gpu,
)
from actors.learner_assembly import ADAPTER_SUBDIR, MODEL_SUBDIR, PolicyLearner, compute_latent_metrics
from rl.train.faults import injected
from rl.train.policy_update import PolicyUpdater
from rl.train.update_plan import rows_read

log = logging.getLogger(__name__)

DS_SUBDIR, DS_TAG = "deepspeed", "state"
__all__ = ["ADAPTER_SUBDIR", "MODEL_SUBDIR", "DS_SUBDIR", "LearnerRank", "compute_latent_metrics"]


class _Routed(nn.Module):
    """The module the engine wraps: `forward(fn, *args)` returns `fn(*args)`.

    Running a micro-batch's whole loss computation inside `engine.forward` gives DeepSpeed the hooks it needs on
    the outputs (backward prologue, ZeRO-3 parameter fetch/release bookkeeping) even though the estimators call
    the policy's own methods rather than its `forward`.
    """

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)


class _EngineUpdater(PolicyUpdater):
    """`PolicyUpdater` whose micro-batch losses are computed through `engine.forward` (see `_Routed`)."""

    def __init__(self, model, cfg, pad_id: int, ref_model=None, ref_scope=contextlib.nullcontext, *, engine):
        super().__init__(model, cfg, pad_id, ref_model, ref_scope)
        self.engine = engine

    def _micro_loss(self, micro, tokens, seqs, empty=False):
        if empty:
            # This rank has no rows in this micro-batch. It still runs a real forward (the stand-in row the updater
            # passes, loss x 0): under ZeRO-3 every module call all-gathers its parameters, a collective the other
            # ranks are making now, and every parameter gets a (zero) gradient, as on the ranks with rows.
            # rl.train.policy_update's own fallback, sum(p.sum()) x 0, fails on ZeRO-3's partitioned (empty) parameters.
            loss, _ = self.engine(super()._micro_loss, micro, tokens, seqs)
            return loss * 0.0, {}
        return self.engine(super()._micro_loss, micro, tokens, seqs)


# ---- one rank ---------------------------------------------------------------------------------------------------
class LearnerRank(PolicyLearner):
    """One data-parallel rank, assembled as every learner is (`actors.learner_assembly.PolicyLearner`) with
    DeepSpeed as its backend. Every method that touches weights is collective under ZeRO-3 (parameters are
    partitioned), so a group calls it on every rank; only rank 0 writes files."""

    updater_class = _EngineUpdater

    def __init__(
        self,
        cfg,
        rank: int = 0,
        world_size: int = 1,
        master_addr: str = "127.0.0.1",
        master_port: int | None = None,
        local_rank: int | None = None,
        num_threads: int | None = None,
    ):
        lcfg = cfg.learner
        threads = num_threads or lcfg.num_threads
        if threads:  # this process's torch pool (a Ray actor starts with OMP_NUM_THREADS = its CPUs)
            torch.set_num_threads(threads)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.zero3 = lcfg.zero_stage == 3
        gpu = use_gpu(lcfg)
        if not gpu:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read once, at DeepSpeed's first accelerator query
        # A Ray actor with a GPU sees only that GPU (CUDA_VISIBLE_DEVICES), so its local device is 0.
        local_rank = (0 if gpu else rank) if local_rank is None else local_rank
        master_port = master_port or free_port()
        set_dist_env(rank, world_size, master_addr, master_port, local_rank)

        import deepspeed

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        disable_shm_comm_jit()
        if not torch.distributed.is_initialized():
            # Groups DeepSpeed cached belong to a world that is gone (an in-process vLLM engine destroys the world
            # group when it shuts down): a new engine on the new world would hit "Group ... is not registered".
            from deepspeed.utils import groups

            groups._release_process_group_references()
            if is_loopback(master_addr):  # DeepSpeed then adopts the initialized group
                init_loopback_process_group(dist_backend(lcfg), rank, world_size, master_port)
            deepspeed.init_distributed(dist_backend=dist_backend(lcfg), auto_mpi_discovery=False)

        self._assemble(cfg, torch.bfloat16 if lcfg.bf16 else torch.float32)
        self.updates = 0  # update() calls on this rank (fault injection counts them)

    def _make_backend(self) -> DeepSpeedBackend:
        """The policy inside a DeepSpeed engine (`self.engine`), its optimizer over the trainable parameters."""
        import deepspeed

        lcfg = self.cfg.learner
        routed = _Routed(self.policy)
        # only trainable parameters get optimizer state (and ZeRO's flat fp32 copy): all of them, unless LoRA
        trainable = [p for p in routed.parameters() if p.requires_grad]
        optimizer = (
            ClippingAdamW(
                trainable,
                lcfg.grad_clip,
                lr=lcfg.lr,
                betas=tuple(lcfg.adam_betas),
                eps=1e-8,
                weight_decay=lcfg.weight_decay,
            )
            if client_optimizer(lcfg)
            else None
        )
        self.engine, *_ = deepspeed.initialize(
            model=routed, model_parameters=trainable, optimizer=optimizer, config=deepspeed_config(lcfg)
        )
        if lcfg.zero_stage == 0 and self.world_size == 1:
            # Alone, nothing to reduce with; DeepSpeed would still flatten every gradient into buckets and copy it
            # back at each step (its all-reduce over a group of one).
            self.engine.enable_backward_allreduce = False
        self.engine.checkpoint_engine = safe_checkpoint_engine(self.engine)
        return DeepSpeedBackend(self.engine, self.world_size)

    def _updater_options(self) -> dict:
        return {"engine": self.engine}

    @property
    def device(self) -> torch.device:
        return self.engine.device

    # -- training ---------------------------------------------------------------------------------------------
    def update(self, samples, advantages, rows=None) -> dict:
        """This rank's share of one rollout batch. `rows`: the rows whose states this rank reads, as its group
        assigned them (`rl.train.update_plan.rows_read`; computed here when not given); their states, and those of the
        rows the latent metrics read on this rank, are fetched first when the samples carry references
        (actors/state_plane.py). Returns the updater's metrics (token-weighted means over this rank's micro-batches),
        the latent metrics, `_tokens`, the response tokens this rank trained on (the weight a group
        uses to merge ranks), and what the fetch moved (`state_plane/...`)."""
        from actors.state_plane import fetch

        if rows is None:
            rows = rows_read(samples, self.cfg, self.world_size, self.rank)
        fetched = fetch(samples, [*rows, *self._latent_rows(samples)])
        latent = self._latent_metrics(samples)  # before the update: the weights that drew the samples
        self.updates += 1
        if self.updates in injected("NONFINITE_UPDATES"):  # fault injection: a NaN loss (docs/RELIABILITY.md)
            advantages = [float("nan")] * len(advantages)
        self.engine.train()
        metrics = self.updater.update(samples, advantages, self.backend, self.rank)
        metrics.update(latent)
        metrics.update(fetched.metrics())
        return metrics

    def _latent_rows(self, samples) -> list[int]:
        """Rows the latent metrics read on this rank (the first `train.latent_metrics_rows`; none where this rank
        does not compute them)."""
        n = self.cfg.train.latent_metrics_rows
        if n <= 0 or not hasattr(self.policy, "fusion") or (self.rank != 0 and not self.zero3):
            return []
        return list(range(min(n, len(samples))))

    def _latent_metrics(self, samples) -> dict:
        """`latent/*` metrics (rl/report/latent_metrics.py), reported by rank 0. Under ZeRO-3 every rank runs the same
        forwards (each module call gathers its parameters collectively) and the fusion weights are gathered."""
        if not self._latent_rows(samples):
            return {}
        with self._gathered_all(list(self.policy.fusion.parameters())):
            out = compute_latent_metrics(self.policy, self.cfg, samples)
        return out if self.rank == 0 else {}

    def _gathered_all(self, params):
        if not self.zero3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=None)

    # -- weights ----------------------------------------------------------------------------------------------
    def _gathered(self, p):
        if not self.zero3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters([p], modifier_rank=None)

    # -- weight sync over the network (actors/weight_sync.py) -----------------------------------------------------
    def export_buckets(self, bucket_bytes: int) -> list | None:
        """Rank 0 puts its full weights into Ray's object store, about `bucket_bytes` per object, and returns the
        references (other ranks: None). Collective under ZeRO-3."""
        from actors.weight_sync import put_buckets

        refs = put_buckets(self.full_tensors(), bucket_bytes)
        return refs if self.rank == 0 else None

    def start_native_sync(self, backend: str, client, init: dict, master: tuple[str, int]) -> None:
        """Set up vLLM's trainer-side weight transfer (`backend`: nccl, ipc, native_ray) on this rank; rank 0 opens
        it with the engines (`client`) and is the sender; every rank iterates the same `GatheredWeights`."""
        from actors.weight_transfer import GatheredWeights, MergedWeights, trainer_transfer

        source = MergedWeights(self.lora) if self.lora is not None else GatheredWeights(self.policy, self._gathered)
        self.transfer = trainer_transfer(backend, self.rank, client, source, init, master)

    def native_send(self) -> None:
        """One native transfer of the current weights (every rank: the gathers are collective)."""
        self.transfer.send_weights()

    # -- checkpoints -----------------------------------------------------------------------------------------
    def _save_backend_state(self, directory: str) -> None:
        """`directory/deepspeed/`: DeepSpeed's own state (module, fp32 master weights and optimizer partitions of
        every rank). With several nodes `directory` must be on a shared filesystem."""
        # a LoRA learner's frozen base comes from `model.path` at load (and model/ holds the merged weights):
        # DeepSpeed's copy of it would be a second full base in every checkpoint
        self.engine.save_checkpoint(
            str(Path(directory) / DS_SUBDIR),
            tag=DS_TAG,
            save_latest=False,
            exclude_frozen_parameters=self.lora is not None,
        )

    def load_checkpoint(self, directory: str) -> None:
        """Restore weights and optimizer state written by `save_checkpoint` (same world size and ZeRO stage)."""
        ds_dir = Path(directory) / DS_SUBDIR
        if not (ds_dir / DS_TAG).is_dir():
            raise FileNotFoundError(f"{directory}: no DeepSpeed state under {ds_dir / DS_TAG}")
        path, _ = self.engine.load_checkpoint(
            str(ds_dir),
            tag=DS_TAG,
            load_optimizer_states=True,
            load_lr_scheduler_states=True,
            load_module_strict=self.lora is None,  # LoRA: the frozen base is not in it (save_checkpoint)
        )
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load the checkpoint in {ds_dir}")

    def close(self) -> None:
        """Drop the engine and models. The process group stays: DeepSpeed caches its groups per process, so a
        later in-process `LearnerRank` (world size 1) reuses it; a Ray rank's group ends with its actor."""
        self.updater = self.backend = self.engine = self.policy = self.probe = None
