"""The worker interfaces the RL loop is written against.

The loop (`rl/loop.py`) calls only these methods; `actors/` provides two implementations of each — in-process
objects (one process, real engines and a real learner) and Ray actor groups — so the same loop runs on a laptop
and on a cluster. Arguments and results are plain Python / tensors so they cross Ray unchanged.

Faults: rollout and reward workers replace a dead actor and redo its call themselves; a learner method may raise
`rl.train.faults.LearnerRebuilt` (the group was rebuilt at its initial weights: the caller restores a checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the reward actor imports this module and never handles a tensor: no torch for it
    from rl.samples.batch import Sample


class RolloutWorkers(Protocol):
    def generate(self, prompts: list[list[int]], params, min_version: int, continuations=None) -> list[Sample]:
        """n samples per prompt from every engine together (ordered by prompt, then sample); refuses when
        an engine holds a policy older than `min_version`. `continuations` (one per prompt, or None): prompts
        that resume earlier sequences from their recorded states (rl/samples/continuation.py); the samples then
        carry their states in this process."""

    def sync_weights(self, learner: LearnerWorkers, version: int, weights_path: str) -> list[int]:
        """Move the learner's current weights onto every engine as policy `version`, through the transport the
        workers were built with (`rollout.weight_sync`, actors/weight_sync.py: the safetensors file
        `weights_path`, Ray's object store, or vLLM's native NCCL / IPC transfer driven by learner rank 0). Returns
        each engine's version afterwards (the caller checks they all equal `version`). Until an engine holds
        `version` it refuses requests that need it."""

    def load_weights(self, weights, version: int) -> list[int]:
        """Install exported weights as `version` on every engine: a safetensors file path (what
        `LearnerWorkers.export_weights` wrote) or a transport's handle; returns each engine's version."""

    def check_health(self) -> list[int]:
        """Between calls (the engines idle): ping every engine and replace each one that is dead or does not answer
        in time, as a death during a call is handled; returns the engines replaced (in-process workers: none)."""

    def weight_checksums(self) -> dict[str, float]:
        """Per-tensor checksums of the first engine's weights (the weight-sync test compares them)."""


@dataclass
class Scores:
    """What the reward workers say about a batch of completions.

    `rewards`: the training reward per completion (weighted sum of the configured rewards). `correct`: whether each
    completion is right by the task's correctness check (`reward.accuracy`), which is separate from the reward —
    a format bonus or a penalty never makes an answer right — or None when accuracy is turned off. `metrics`:
    every reward term on its own (`rewards/<name>/mean`, errors, timeouts, counts) and the weighted total.
    `failures`: one line per reward call that failed (raised, timed out, returned a wrong shape), naming it and
    saying why; the loop prints each kind once (the reward may run in another process, whose log nobody reads).
    """

    rewards: list[float]
    correct: list[bool] | None
    metrics: dict[str, float]
    failures: list[str] = field(default_factory=list)
    # per completion: every weighted reward declined to score it (TRL's None): left out of its group's statistics,
    # advantage 0 (empty: all scored)
    unscored: list[bool] = field(default_factory=list)


class RewardWorkers(Protocol):
    def score(
        self,
        prompts: list[str],
        completions: list[str],
        answers: list[str],
        finish_reasons: list[str],
        columns: dict[str, list] | None = None,
    ) -> Scores:
        """Score completions. `columns` are the dataset's other columns, one list per column aligned with the
        completions (`rl.data.loaders.reward_columns`); every reward receives them as keyword arguments."""


class LearnerWorkers(Protocol):
    def update(self, samples: list[Sample], advantages: list[float]) -> dict[str, float]:
        """One rollout batch of policy updates (mini-batches × epochs as configured); returns metrics
        (loss, grad_norm, clip fractions, mismatch, entropy, skipped)."""

    def mismatch_parts(self, samples: list[Sample], version: int) -> dict[str, float]:
        """Record the current weights as policy `version` (kept for `train.max_staleness` more versions) and take
        the rollout/learner mismatch of `samples` apart: engine, staleness, estimator
        (rl/estimators/mismatch_parts.py)."""

    def export_weights(self, path: str) -> str:
        """Rank 0 writes the current weights as one safetensors file at `path` (atomically); returns it."""

    def export_adapter(self, directory: str) -> str | None:
        """A LoRA learner (`learner.lora`) writes its adapters in peft's format at `directory`; returns it."""

    def weight_checksums(self) -> dict[str, float]:
        """Per-tensor checksums of rank 0's weights, same keys as the engine's."""

    def save_checkpoint(self, directory: str) -> list[dict] | None:
        """Model (save_pretrained), optimizer / DeepSpeed state into `directory` (caller makes it atomic); returns
        each rank's `saved_files` (rl/train/run_dir.py), so the caller can check that it sees every file."""

    def load_checkpoint(self, directory: str) -> None: ...


def tensor_checksums(named_tensors) -> dict[str, float]:
    """Checksum per tensor: float64 sum of values and of squares (cheap, order-independent per tensor)."""
    out = {}
    for name, t in named_tensors:
        t = t.detach().double()
        out[name] = float(t.sum()) + 1e-3 * float((t * t).sum())
    return out
