"""Batch types shared by engines, rewards, the loop and the learner.

`Sample` is one generated completion as an engine returns it (token ids in, token ids out; what a request asks
for is `rl.train.requests.SamplingParams`). `LearnerBatch` is a right-padded tensor view of many samples, aligned for
the likelihood estimators: response token j of row b sits at position `prompt_lens[b] + j`, and its log-prob is read
from the state at position `prompt_lens[b] + j - 1` (row j of the recorded states, docs/DESIGN.md §4).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import rl.samples.states as state_formats
from rl.samples.states import StateRef

FINISH_REASONS = ("stop", "length", "aborted")


@dataclass
class Sample:
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # engine log-probs under the log-prob contract (rl/samples/logprob_contract.py)
    finish_reason: str  # stop | length | aborted
    policy_version: int
    # [R, d] in a storage format of rl/samples/states.py (row j is the state that predicted response_ids[j]), or a
    # StateRef to them when they travel apart from the sample (actors/state_plane.py), or None
    states: torch.Tensor | StateRef | None = None
    group_id: int = 0  # index of the prompt in the request (GRPO groups)
    sample_index: int = 0  # index within the group
    decode_mode: str = "soft"
    preempted: bool = False  # engine recomputed the request: its recurrent state is lost, never train on it
    # multi-turn samples (docs/TOOLS.md): per response token, 1 where the policy sampled it, 0 where an environment
    # wrote it (an observation: no loss, no feedback, log-prob 0). None: every response token was sampled.
    generated_mask: list[int] | None = None
    # multi-turn samples: turns, tool calls, environment reward and failures (rl/train/multiturn.py); None otherwise
    episode: dict | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def response_len(self) -> int:
        return len(self.response_ids)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def generated(self) -> list[int]:
        """Per response token, 1 where the policy sampled it (every token of a single-turn sample)."""
        return self.generated_mask if self.generated_mask is not None else [1] * self.response_len


@dataclass
class LearnerBatch:
    input_ids: torch.Tensor  # [B, L] prompt + response, right-padded with pad_id
    attention_mask: torch.Tensor  # [B, L]
    prompt_lens: torch.Tensor  # [B]
    response_lens: torch.Tensor  # [B]
    # [B, R] float, 1 on response tokens the policy sampled (loss, feedback); 0 on padding and on observation
    # tokens an environment wrote (multi-turn samples), which are still part of the sequence (response_lens)
    response_mask: torch.Tensor
    engine_logprobs: torch.Tensor  # [B, R]
    states: torch.Tensor | None = None  # [B, R, d] recorded states (replay), zero-padded
    extras: dict = field(default_factory=dict)  # advantages, rewards, ... keyed by name, [B] or [B, R]

    @property
    def response_ids(self) -> torch.Tensor:
        """[B, R] response tokens (pad where response_mask is 0)."""
        idx = self.response_positions() + 1
        return torch.gather(self.input_ids, 1, idx.clamp(max=self.input_ids.shape[1] - 1))

    def response_positions(self) -> torch.Tensor:
        """[B, R] position of the state that predicts response token j: prompt_len - 1 + j (clamped)."""
        R = self.response_mask.shape[1]
        pos = self.prompt_lens[:, None] - 1 + torch.arange(R)[None, :]
        return pos.clamp(max=self.input_ids.shape[1] - 1)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows) -> LearnerBatch:
        """A sub-batch (micro-batch or a rank's share) with the same padding."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        pick = lambda t: None if t is None else t[rows]
        return LearnerBatch(
            pick(self.input_ids),
            pick(self.attention_mask),
            pick(self.prompt_lens),
            pick(self.response_lens),
            pick(self.response_mask),
            pick(self.engine_logprobs),
            pick(self.states),
            {k: v[rows] for k, v in self.extras.items()},
        )


def collate(samples: list[Sample], pad_id: int = 0, with_states: bool = False, state_rows=None) -> LearnerBatch:
    """Right-pad samples into a LearnerBatch (states decoded to fp32 for the learner). `state_rows`: only these
    rows' states are read (they must be tensors; the other rows may still hold a `StateRef`) and the other rows'
    stay zero: a learner rank's stand-in row for an empty micro-batch is another rank's, never fetched."""
    if not samples:
        raise ValueError("collate: no samples")
    B = len(samples)
    L = max(s.prompt_len + s.response_len for s in samples)
    R = max(max(s.response_len for s in samples), 1)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(B, L, dtype=torch.long)
    response_mask = torch.zeros(B, R)
    engine_logprobs = torch.zeros(B, R)
    states = None
    read = set(range(B)) if state_rows is None else set(state_rows)
    if with_states:
        missing = [i for i in sorted(read) if samples[i].states is None]
        if missing:
            raise ValueError(
                f"collate: samples {missing[:5]} have no recorded states (rollout.record_states "
                f"must be on for the replay estimator)"
            )
        remote = [i for i in sorted(read) if isinstance(samples[i].states, StateRef)]
        if remote:
            raise ValueError(
                f"collate: samples {remote[:5]} hold a StateRef, not their states: the learner must "
                f"fetch the rows it reads first (actors/state_plane.py)"
            )
        states = torch.zeros(B, R, _state_width(samples, read))
    for b, s in enumerate(samples):
        seq = s.prompt_ids + s.response_ids
        input_ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention_mask[b, : len(seq)] = 1
        response_mask[b, : s.response_len] = torch.tensor(s.generated, dtype=torch.float32)
        engine_logprobs[b, : s.response_len] = torch.tensor(s.logprobs, dtype=torch.float32)
        if states is not None and b in read:
            if s.states.shape[0] != s.response_len:
                raise ValueError(
                    f"collate: sample {b} has {s.states.shape[0]} state rows for {s.response_len} response tokens"
                )
            states[b, : s.response_len] = state_formats.decode(s.states)
    return LearnerBatch(
        input_ids,
        attention_mask,
        torch.tensor([s.prompt_len for s in samples]),
        torch.tensor([s.response_len for s in samples]),
        response_mask,
        engine_logprobs,
        states,
    )


def _state_width(samples: list[Sample], read: set[int]) -> int:
    """d of the batch's states: from a row it reads, else from any row's StateRef (a rank with no rows of its own
    still collates a stand-in row of the right width)."""
    for i in sorted(read) or range(len(samples)):
        st = samples[i].states
        if isinstance(st, StateRef):
            return st.width
        if st is not None:
            return state_formats.width(st)
    raise ValueError("collate: with_states, but no sample has recorded states")


def save_samples(samples: list[Sample], advantages: list[float], path: str) -> None:
    """A rollout batch on disk (benchmarks reuse one batch across processes); `load_samples` reads it back."""
    torch.save({"samples": samples, "advantages": advantages}, path)


def load_samples(path: str) -> tuple[list[Sample], list[float]]:
    """What `save_samples` wrote, unpickled with `weights_only=True`: only tensors, builtins and `Sample` load."""
    with torch.serialization.safe_globals([Sample]):
        saved = torch.load(path, weights_only=True)
    return saved["samples"], saved["advantages"]
