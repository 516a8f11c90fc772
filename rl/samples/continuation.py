"""Resuming a sequence from its recorded states: the prompt of a later turn (docs/TOOLS.md).

A multi-turn sample is [prompt][turn 1][observation 1][turn 2]... Its generated tokens were consumed by the
engine's recurrent decode, each fused with the state that predicted it (`F(row_j, e(y_j))`); prompt and
observation tokens were consumed plainly (soft mode). To continue such a sequence after an observation, an engine
prefills it again, and must fuse the *recorded* state at every generated position: that is what the decode did, up
to numerics, and it runs in parallel (a "replay prefill"). Prefilling those positions plainly would build another
KV cache than the one that produced the tokens, and the learner could not reproduce the next turn.

`Continuation` says which positions of a prompt fuse which state. Engines take one per prompt
(`RolloutEngine.generate(..., continuations=...)`); `continuation_of` builds it from a sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import rl.samples.states as state_formats
from rl.samples.batch import Sample


@dataclass
class Continuation:
    """Prefill a prompt of length L fusing `states[t]` into position t's input wherever `fed[t]`.

    states: [L, d] fp32; rows where `fed` is False are never read. fed: [L] bool. Position 0 and document-start
    tokens keep the ordinary input whatever `fed` says (the model's reset rule).
    """

    states: torch.Tensor
    fed: torch.Tensor

    def __post_init__(self):
        self.fed = torch.as_tensor(self.fed, dtype=torch.bool)
        if self.states.dim() != 2 or self.fed.dim() != 1 or self.states.shape[0] != self.fed.shape[0]:
            raise ValueError(
                f"Continuation: states {tuple(self.states.shape)} and fed {tuple(self.fed.shape)} must be [L, d] and [L]"
            )

    def __len__(self) -> int:
        return int(self.fed.shape[0])

    def extended(self, n: int) -> Continuation:
        """The same continuation with `n` more positions (observation tokens) that fuse nothing."""
        d = self.states.shape[1]
        return Continuation(
            torch.cat([self.states, self.states.new_zeros(n, d)]),
            torch.cat([self.fed, torch.zeros(n, dtype=torch.bool)]),
        )


def check_continuations(prompts: list[list[int]], continuations, hidden_size: int, decode_mode: str) -> None:
    """ValueError naming the prompt whose continuation does not fit it (length, width) or the mode."""
    if continuations is None:
        return
    if len(continuations) != len(prompts):
        raise ValueError(f"continuations: {len(continuations)} given for {len(prompts)} prompts")
    for i, (p, c) in enumerate(zip(prompts, continuations)):
        if c is None:
            continue
        if len(c) != len(p):
            raise ValueError(f"continuations[{i}]: {len(c)} positions for a prompt of {len(p)} tokens")
        if c.states.shape[1] != hidden_size:
            raise ValueError(f"continuations[{i}]: states of width {c.states.shape[1]}, the model's is {hidden_size}")
        if bool(c.fed.any()) and decode_mode != "soft":
            raise ValueError(
                f"continuations[{i}]: a prompt that fuses recorded states is decoded in soft mode only, not "
                f"{decode_mode!r} (fused mode prefills prompts twice; standard mode feeds nothing back)"
            )


def continuation_of(sample: Sample) -> tuple[list[int], Continuation]:
    """(token ids, continuation) that resume `sample` after its last token: its generated tokens fuse their
    recorded states (row j at position P + j), its prompt and observation tokens fuse nothing."""
    if sample.states is None or not isinstance(sample.states, torch.Tensor):
        raise ValueError("continuation_of: the sample carries no recorded states (generate with record_states=True)")
    states = state_formats.decode(sample.states)
    P, R = sample.prompt_len, sample.response_len
    if states.shape[0] != R:
        raise ValueError(f"continuation_of: {states.shape[0]} state rows for {R} response tokens")
    full = torch.zeros(P + R, states.shape[1])
    full[P:] = states
    fed = torch.zeros(P + R, dtype=torch.bool)
    fed[P:] = torch.tensor(sample.generated, dtype=torch.bool)
    return sample.prompt_ids + sample.response_ids, Continuation(full, fed)
