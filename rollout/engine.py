"""The one interface every rollout engine implements, the validation they share, and how they read weights
(`load_state_dict_from`: safetensors only).

Token ids in, token ids out: an engine never re-tokenizes text. Each call returns `rl.samples.batch.Sample`s carrying
engine log-probs under the log-prob contract (rl/samples/logprob_contract.py: log-probs of the distribution sampled
from, softmax(logits / T) truncated by top-k / top-p and renormalised; T = 0 means greedy and log-probs of the
untempered logits), the finish reason, the policy version, and, when asked, the recorded states (row j = the state that
predicted response token j).
"""

from __future__ import annotations

import abc
import os
from pathlib import Path

from rl.samples.batch import Sample
from rl.samples.continuation import Continuation
from rl.samples.request import SamplingParams


class StaleWeightsError(RuntimeError):
    """A request required a newer policy version than the engine holds."""


def validate_prompts(prompts: list[list[int]], vocab_size: int) -> None:
    """Raise ValueError naming the prompt index and the bad token id; nothing is generated on bad input."""
    if not prompts:
        raise ValueError("prompts: empty request (no prompts)")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompts[{i}]: empty prompt")
        for j, tok in enumerate(p):
            if not isinstance(tok, int) or not 0 <= tok < vocab_size:
                raise ValueError(f"prompts[{i}][{j}]: token id {tok!r} outside the vocabulary [0, {vocab_size})")


class RolloutEngine(abc.ABC):
    """A versioned generator of `Sample`s. `version` is the policy version of the weights it holds."""

    version: int = 0

    @abc.abstractmethod
    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        min_version: int | None = None,
        continuations: list[Continuation | None] | None = None,
    ) -> list[Sample]:
        """n samples per prompt, flat, ordered by prompt then sample (`group_id`, `sample_index` set).

        `continuations[i]` (rl/samples/continuation.py), when given, makes prompt i the resumption of an earlier
        sequence: its prefill fuses the recorded state at each position the continuation marks (a replay
        prefill), exactly as the decode that produced those tokens did; the other positions run as prompts do."""

    @abc.abstractmethod
    def load_weights(self, weights, version: int) -> None:
        """Install new weights (a state dict, or a path to a safetensors file / save_pretrained dir) as
        policy `version`. Versions must increase."""

    def check_version(self, min_version: int | None) -> None:
        if min_version is not None and self.version < min_version:
            raise StaleWeightsError(
                f"engine holds policy version {self.version}, request requires >= {min_version}; sync weights first"
            )

    def _check_new_version(self, version: int) -> None:
        if version <= self.version and not (version == 0 and self.version == 0):
            raise ValueError(f"load_weights: version {version} is not newer than the engine's {self.version}")


def load_state_dict_from(path: str | os.PathLike) -> dict:
    """Tensors of a safetensors file, or of every `*.safetensors` file of a save_pretrained directory.

    Only safetensors: never torch.load / pickle, which can run code from the file.
    """
    from safetensors.torch import load_file

    path = Path(path)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files or not all(f.suffix == ".safetensors" and f.is_file() for f in files):
        raise ValueError(
            f"load_weights: {str(path)!r} is neither a .safetensors file nor a directory holding *.safetensors files"
        )
    state = {}
    for f in files:
        state.update(load_file(str(f)))
    return state
