"""One learner's assembly, whatever steps its optimizer: the policy (loaded, its RL decode mode recorded, wrapped in
LoRA adapters when `learner.lora` asks), the backend that steps it, the frozen reference, the policy updater and
the mismatch probe; and what every learner does with its weights: the full state, the exported policy and
adapters, the model half of a checkpoint.

`PolicyLearner` is the base of the DeepSpeed rank (`actors.learner_rank.LearnerRank`, in-process or a Ray actor)
and of the plain-torch learner (`actors.local.TorchLearner`, local and test runs). A subclass provides its backend
(`_make_backend`), its optimizer's half of a checkpoint (`_save_backend_state`, `load_checkpoint`) and its
`update`; under ZeRO-3 it also says how one parameter is gathered (`_gathered`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from rl.decode_modes import record_rl_mode
from rl.estimators.mismatch_parts import MismatchProbe
from rl.model.files import (
    copy_tokenizer_files,
    load_fbt,
    pad_id_of,
    stream_safetensors_atomic,
    write_safetensors_atomic,
)
from rl.model.lora_policy import maybe_wrap, reference_scope
from rl.report.latent_metrics import latent_metrics
from rl.samples.batch import collate
from rl.train.checkpoints import saved_files
from rl.train.policy_update import PolicyUpdater
from rl.train.workers import tensor_checksums

MODEL_SUBDIR = "model"  # a checkpoint's loadable model (save_pretrained + tokenizer)
ADAPTER_SUBDIR = "adapter"  # a LoRA learner's adapters in peft's format, beside model/ (rl/model/lora_policy.py)


def compute_latent_metrics(policy, cfg, samples) -> dict[str, float]:
    """`latent/<name>` metrics of the first `train.latent_metrics_rows` samples, with the policy in eval mode."""
    rows = samples[: cfg.train.latent_metrics_rows]
    if not rows:
        return {}
    was_training = policy.training
    policy.eval()
    try:
        batch = collate(rows, pad_id_of(policy), with_states=all(s.states is not None for s in rows))
        found = latent_metrics(policy, batch, cfg.rollout.decode_mode, len(rows), cfg.rollout.temperature or 1.0)
    finally:
        policy.train(was_training)
    return {f"latent/{k}": v for k, v in found.items()}


class PolicyLearner:
    """The parts and weight handling every learner shares. Only rank 0 writes files; under ZeRO-3 each method that
    touches weights is collective (every rank calls it)."""

    rank, world_size = 0, 1
    updater_class = PolicyUpdater

    def _assemble(self, cfg, reference_dtype=torch.float32) -> None:
        """policy → LoRA → backend (`_make_backend`) → reference → updater, in that order (the reference goes where
        the backend put the policy)."""
        self.cfg = cfg
        self.policy = load_fbt(cfg.model.path)
        record_rl_mode(self.policy.config, cfg.model.path, cfg.rollout.decode_mode)  # saved with checkpoints
        # learner.lora: peft adapters and the fusion train, the rest is frozen (rl/model/lora_policy.py)
        self.policy, self.lora = maybe_wrap(self.policy, cfg.learner.lora, cfg.train.seed)
        self.pad_id = pad_id_of(self.policy)
        self.backend = self._make_backend()
        self.updater = self.updater_class(
            self.policy,
            cfg,
            self.pad_id,
            self._reference(reference_dtype),
            reference_scope(self.lora),
            **self._updater_options(),
        )
        self.probe = None  # rl.estimators.mismatch_parts.MismatchProbe, built at the first mismatch_parts call

    def _make_backend(self):
        """The `rl.train.policy_update.Backend` that steps `self.policy`."""
        raise NotImplementedError

    def _updater_options(self) -> dict:
        return {}

    def _reference(self, dtype):
        """The reference model of `algo.kl_coef > 0`: a LoRA policy itself (adapters off), else a frozen copy of the
        starting policy, never updated, on the policy's device."""
        if self.cfg.algo.kl_coef <= 0:
            return None
        if self.lora is not None:
            return self.policy
        return load_fbt(self.cfg.model.path, dtype).to(self.device).eval().requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return next(self.policy.parameters()).device

    # -- mismatch parts -----------------------------------------------------------------------------------------
    def mismatch_parts(self, samples, version: int) -> dict:
        """The mismatch taken apart on `samples` (rl/estimators/mismatch_parts.py); records the current weights as
        `version`. Rank 0 reports; collective under ZeRO-3 (the full weights are gathered)."""
        state = self.full_state()
        if self.rank != 0:
            return {}
        from actors.state_plane import fetch

        fetch(samples, range(len(samples)))  # states held as object-store references: rank 0 reads every row
        if self.probe is None:
            self.probe = MismatchProbe(self.cfg, lambda: load_fbt(self.cfg.model.path), self.pad_id, self.device)
        return self.probe.measure(samples, version, state)

    # -- weights ------------------------------------------------------------------------------------------------
    def _gathered(self, p):
        """The context in which parameter `p` is whole (ZeRO-3 gathers it)."""
        return contextlib.nullcontext()

    def full_tensors(self):
        """(name, full weight on CPU) per parameter on rank 0, (name, None) on the other ranks, named as in the
        checkpoint (tied weights once). Collective under ZeRO-3: parameters are gathered one at a time (bounding
        memory), so every rank must run it to the end. A LoRA learner's are the merged weights."""
        if self.lora is not None:  # merged tensors are new, the others frozen or stable until the next update
            for name, t in self.lora.merged_tensors():
                yield name, (t.to("cpu") if self.rank == 0 else None)
                del t  # not kept alive while the next layer is merged
            return
        for name, p in self.policy.named_parameters():
            with self._gathered(p):
                yield name, (p.detach().to("cpu", copy=True) if self.rank == 0 else None)

    def full_state(self) -> dict[str, torch.Tensor] | None:
        """Full weights on CPU on rank 0, a snapshot (`full_tensors` as a dict, a LoRA learner's views of its
        parameters copied); None elsewhere. Collective under ZeRO-3."""
        copy = self.lora is not None and self.rank == 0
        out = {name: (t.clone() if copy else t) for name, t in self.full_tensors()}
        return out if self.rank == 0 else None

    def export_weights(self, path: str) -> str | None:
        """Rank 0 writes one safetensors file at `path` (atomically) and returns it; other ranks return None. A LoRA
        learner's merged weights are written one layer at a time."""
        if self.lora is not None:
            return (
                stream_safetensors_atomic(self.lora.metadata(), self.full_tensors(), path) if self.rank == 0 else None
            )
        state = self.full_state()
        return write_safetensors_atomic(state, path) if state is not None else None

    def weight_checksums(self) -> dict[str, float] | None:
        state = self.full_state()
        return tensor_checksums(state.items()) if state is not None else None

    def export_adapter(self, directory: str) -> str | None:
        """A LoRA learner's adapters in peft's format at `directory` (rank 0; None elsewhere or without LoRA)."""
        if self.lora is None or self.rank != 0:
            return None
        self.lora.save_adapter(directory)
        return directory

    # -- checkpoints --------------------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> dict:
        """`directory/model/` (save_pretrained + tokenizer: a loadable checkpoint; a LoRA learner's merged model,
        its adapters in `directory/adapter/`), then the backend's optimizer state (`_save_backend_state`).
        Collective. The caller makes `directory` atomic; the returned `saved_files` let the driver check that it
        sees what every rank wrote."""
        state = self.full_state()
        if self.rank == 0:
            model_dir = Path(directory) / MODEL_SUBDIR
            model_dir.mkdir(parents=True, exist_ok=True)
            self.policy.save_pretrained(str(model_dir), state_dict=state, safe_serialization=True)
            copy_tokenizer_files(self.cfg.model.tokenizer or self.cfg.model.path, str(model_dir))
            self.export_adapter(str(Path(directory) / ADAPTER_SUBDIR))
        self._save_backend_state(directory)
        return saved_files(directory, self.rank)

    def _save_backend_state(self, directory: str) -> None:
        raise NotImplementedError
