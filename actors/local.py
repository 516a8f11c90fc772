"""In-process implementations of the three worker interfaces (no Ray): for tests and for debugging the loop.

- `LocalRollout`: `RolloutWorkers` over engines living in this process (one by default), with the same prompt
  split, seeds and sample order as the Ray fleet (actors/rollout_fleet.py).
- `LocalLearner`: `LearnerWorkers` with one learner rank — DeepSpeed at world size 1 (`actors.learner_rank.LearnerRank`,
  the same code as each Ray rank) or plain torch (`rl.train.policy_update.TorchBackend`, no DeepSpeed at all).
- `LocalRewards`: `RewardWorkers` scoring in this process (the math reward still uses its process pool).
"""

from __future__ import annotations

from pathlib import Path

import torch

from actors.learner_assembly import ADAPTER_SUBDIR, PolicyLearner, compute_latent_metrics
from actors.learner_group import merge_rank_metrics
from actors.learner_rank import LearnerRank
from actors.reward_workers import RewardHost
from actors.rollout_fleet import EngineHost, chunk_params, merge_chunks, split_prompts
from rl.train.policy_update import TorchBackend


class LocalRollout:
    """`RolloutWorkers` over `EngineHost`s in this process."""

    def __init__(self, cfg, hosts: list[EngineHost] | None = None):
        from actors.weight_sync import FileSync

        self.hosts = hosts if hosts is not None else [EngineHost(cfg, i) for i in range(cfg.rollout.num_engines)]
        self.transport = FileSync()  # in-process: the only transport (actors/weight_sync.py)

    def sync_weights(self, learner, version: int, weights_path: str) -> list[int]:
        return self.transport.push(learner, self, version, weights_path)

    def generate(self, prompts, params, min_version: int, continuations=None):
        chunks = split_prompts(len(prompts), len(self.hosts))
        part = lambda s, e: None if continuations is None else continuations[s:e]  # noqa: E731
        return merge_chunks(
            [
                (s, h.generate(prompts[s:e], chunk_params(params, s), min_version, part(s, e)))
                for h, (s, e) in zip(self.hosts, chunks)
            ]
        )

    def load_weights(self, weights, version: int) -> list[int]:
        return [h.load_weights(weights, version) for h in self.hosts]

    def check_health(self) -> list[int]:
        """In-process engines cannot die apart from this process: nothing to check, none replaced."""
        return []

    def weight_checksums(self) -> dict[str, float]:
        return self.hosts[0].weight_checksums()

    def close(self) -> None:
        for h in self.hosts:
            h.close()


class TorchLearner(PolicyLearner):
    """One rank without DeepSpeed, assembled as every learner is (`actors.learner_assembly.PolicyLearner`) with
    `rl.train.policy_update.TorchBackend` (AdamW, clipping) as its backend; the same files as `LearnerRank`."""

    OPTIMIZER_FILE = "optimizer.pt"

    def __init__(self, cfg):
        self._assemble(cfg)

    def _make_backend(self) -> TorchBackend:
        lcfg = self.cfg.learner
        return TorchBackend(self.policy, lcfg.lr, lcfg.weight_decay, tuple(lcfg.adam_betas), lcfg.grad_clip)

    def update(self, samples, advantages) -> dict:
        latent = (
            compute_latent_metrics(self.policy, self.cfg, samples)
            if self.cfg.train.latent_metrics_rows > 0 and hasattr(self.policy, "fusion")
            else {}
        )
        self.policy.train()
        metrics = self.updater.update(samples, advantages, self.backend, 0)
        metrics.update(latent)
        metrics["_tokens"] = float(self.cfg.algo.ppo_epochs * sum(s.response_len for s in samples))
        return metrics

    def _save_backend_state(self, directory: str) -> None:
        torch.save(self.backend.optimizer.state_dict(), Path(directory) / self.OPTIMIZER_FILE)

    def load_checkpoint(self, directory: str) -> None:
        if self.lora is not None:  # the adapters and the trained fusion; the frozen base is the loaded model's
            self.lora.load_adapter(str(Path(directory) / ADAPTER_SUBDIR))
        else:
            self._load_model(Path(directory) / "model")
        # weights_only: an optimizer state dict is tensors, numbers and containers — nothing to unpickle as code
        opt = torch.load(Path(directory) / self.OPTIMIZER_FILE, map_location="cpu", weights_only=True)
        self.backend.optimizer.load_state_dict(opt)

    def _load_model(self, model_dir: Path) -> None:
        from rollout.engine import load_state_dict_from  # safetensors only, never pickle

        state = load_state_dict_from(model_dir)
        with torch.no_grad():
            missing, unexpected = self.policy.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if self.policy.config.tie_word_embeddings else set()
        if unexpected or set(missing) - tied:
            raise ValueError(
                f"{model_dir.parent}: checkpoint does not fit the model: "
                f"missing={sorted(set(missing) - tied)} unexpected={sorted(unexpected)}"
            )

    def close(self) -> None:
        pass


class LocalLearner:
    """`LearnerWorkers` with one rank in this process: `backend="deepspeed"` (world size 1) or `"torch"`."""

    def __init__(self, cfg, backend: str = "deepspeed"):
        if backend == "deepspeed":
            self.rank = LearnerRank(cfg, 0, 1)
        elif backend == "torch":
            self.rank = TorchLearner(cfg)
        else:
            raise ValueError(f"LocalLearner backend: expected 'deepspeed' or 'torch', got {backend!r}")

    def update(self, samples, advantages) -> dict[str, float]:
        return merge_rank_metrics([self.rank.update(samples, [float(a) for a in advantages])])

    def mismatch_parts(self, samples, version: int) -> dict[str, float]:
        return self.rank.mismatch_parts(samples, version)

    def export_weights(self, path: str) -> str:
        return self.rank.export_weights(path)

    def export_adapter(self, directory: str) -> str | None:
        return self.rank.export_adapter(directory)

    def weight_checksums(self) -> dict[str, float]:
        return self.rank.weight_checksums()

    def save_checkpoint(self, directory: str) -> list[dict]:
        return [self.rank.save_checkpoint(directory)]

    def load_checkpoint(self, directory: str) -> None:
        self.rank.load_checkpoint(directory)

    def close(self) -> None:
        self.rank.close()


class LocalRewards(RewardHost):
    """`RewardWorkers` in this process (the reward set of `reward.fns`)."""

    def __init__(self, cfg, base_dir: str | None = None, python_fns: dict | None = None):
        super().__init__(cfg.reward, base_dir, cfg.data.task, python_fns, cfg.env)


def build_local_workers(cfg, learner_backend: str = "deepspeed", python_fns: dict | None = None):
    """`(rollout, learner, rewards)` in this process; a multi-worker learner config runs as one rank.
    `python_fns`: reward functions handed to `actors.api.train` (`python:NAME` in reward.fns)."""
    return LocalRollout(cfg), LocalLearner(cfg, learner_backend), LocalRewards(cfg, python_fns=python_fns)
