"""The full-bandwidth transformer (FBT) on Hugging Face backbones (Llama, Qwen2, Qwen3 and Mistral families).

An FBT fuses the previous position's final-normalized top-layer state into the next input:
`x_t = F(h_{t-1}, e_t)`. The backbone is used unchanged through `inputs_embeds`; what this module adds is the
fusion `F`, and three ways to run the model (docs/DESIGN.md §3):

1. `multipass_forward` — K parallel passes, pass k fusing pass k-1's states shifted one position right
   (training, K-pass likelihood, replay of recorded states);
2. `step` — the recurrence with a KV cache, carrying `h_prev` per sequence (decoding);
3. `prefill` — a prompt in `standard`, `soft` or `fused` mode (fused = the prompt prefilled again from a fresh
   cache, fused with the previous prefill pass's states).

`recurrent_forward` runs the exact token-by-token recurrence teacher-forced on given tokens: the ground truth
every parallel shortcut is tested against. The checkpoint is a normal `save_pretrained` directory whose
`model_type` is `fbt_llama` / `fbt_qwen2` / ...: the config and model class of each backbone, registered with the
Auto classes, are rl/model/fbt_backbones.py. The fusion itself is rl/model/fusion.py; making an FBT from a plain
checkpoint is rl/model/conversion.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as hf_init

from rl.decode_modes import DECODE_MODES
from rl.model.fusion import (
    FUSION_MODES,
    INPUT_SCALES,
    Fusion,
    dropout_off,
    positions_from_mask,
    rms_value,
    shift_right,
)


@dataclass
class MultiPassOutput:
    hidden: list[torch.Tensor]  # per pass, [B, L, d] final-normalized top states

    @property
    def last_hidden(self) -> torch.Tensor:
        return self.hidden[-1]


class FBTMixin:
    """Latent feedback on top of a Hugging Face causal LM whose `.model` takes `inputs_embeds`."""

    def _init_fbt(self, config):
        for field in ("fbt_fusion_mode", "fbt_input_scale"):
            allowed = FUSION_MODES if field == "fbt_fusion_mode" else INPUT_SCALES
            if getattr(config, field) not in allowed:
                raise ValueError(f"config.{field}: expected one of {allowed}, got {getattr(config, field)!r}")
        self.fusion = Fusion(config.hidden_size, config.fbt_fusion_mode, config.fbt_rms_eps)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear) and getattr(module, "_fbt_fusion", False):
            bound = math.sqrt(3.0 / module.in_features)  # uniform with std 1/sqrt(fan_in)
            hf_init.uniform_(module.weight, -bound, bound)
        else:
            super()._init_weights(module)

    # ---- building blocks -------------------------------------------------------------------------------
    @property
    def reset_token_ids(self) -> list[int]:
        ids = self.config.fbt_reset_token_ids
        if ids is None:
            ids = [self.config.bos_token_id] if self.config.bos_token_id is not None else []
        return list(ids)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def fuse(self, h_prev: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """The fused layer-0 input `F(h_prev, e)` at the scale the backbone expects."""
        x = self.fusion(h_prev.to(e.dtype), e)
        return x * rms_value(e, self.fusion.eps) if self.config.fbt_input_scale == "embedding_rms" else x

    def run_stack(self, inputs_embeds, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False):
        """The backbone's decoder stack + final norm: returns (h [B,L,d], cache)."""
        out = self.model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
        )
        return out.last_hidden_state, out.past_key_values

    def logits_from_hidden(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(h)

    def feedback_mask(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        no_feedback_before: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[B, L] bool: positions whose input fuses the previous position's state.

        Position 0, document starts (reset tokens), padding, the first real token of a left-padded row, and
        positions < `no_feedback_before[b]` (the prompt in `soft` mode) keep the ordinary input.
        """
        B, L = input_ids.shape
        mask = torch.ones(B, L, dtype=torch.bool, device=input_ids.device)
        mask[:, 0] = False
        for tok in self.reset_token_ids:
            mask &= input_ids != tok
        if attention_mask is not None:
            am = attention_mask.bool()
            mask &= am & F.pad(am[:, :-1], (1, 0), value=False)
        if no_feedback_before is not None:
            pos = torch.arange(L, device=input_ids.device)[None, :]
            mask &= pos >= no_feedback_before.to(input_ids.device)[:, None]
        return mask

    def _fused_inputs(self, e, carried, mask):
        if not bool(mask.any()):
            return e  # bit-identical ordinary input: nothing to fuse
        return torch.where(mask[..., None], self.fuse(carried, e), e)

    # ---- 1. K-pass parallel forward --------------------------------------------------------------------
    def multipass_forward(
        self,
        input_ids,
        num_passes: int,
        attention_mask=None,
        feedback_mask=None,
        fixed_carried=None,
        fixed_mask=None,
        jitter: float = 0.0,
        prefix_mixin: float = 0.0,
        no_grad_until_last: bool = False,
        generator: torch.Generator | None = None,
    ) -> MultiPassOutput:
        """Run K passes in parallel. Pass 1 is ordinary except at `fixed_mask` positions, which always fuse
        `fixed_carried` (recorded states for replay, or the fused-prompt states). Pass k ≥ 2 fuses pass k-1's
        states shifted right at `feedback_mask` positions.

        jitter: uniform noise in [-jitter, jitter] on the carried states, fresh per pass (training only).
        prefix_mixin: per row and pass, with this probability a random-length prefix keeps the plain input.
        no_grad_until_last: passes 1..K-1 under no_grad, in eval mode (no dropout: they reconstruct states, they
        do not train), and the last pass fed their detached states (kpass).
        """
        if num_passes < 1:
            raise ValueError(f"num_passes must be >= 1, got {num_passes}")
        if feedback_mask is None:
            feedback_mask = self.feedback_mask(input_ids, attention_mask)
        position_ids = positions_from_mask(attention_mask) if attention_mask is not None else None
        e = self.embed(input_ids)
        has_fixed = fixed_mask is not None and bool(fixed_mask.any())
        hidden, h = [], None
        for k in range(num_passes):
            last = k == num_passes - 1
            frozen_pass = no_grad_until_last and not last
            with torch.set_grad_enabled(torch.is_grad_enabled() and not frozen_pass), dropout_off(self, frozen_pass):
                if k == 0:
                    carried = fixed_carried if has_fixed else None
                    mask = fixed_mask if has_fixed else torch.zeros_like(feedback_mask)
                else:
                    carried = shift_right(h.detach() if no_grad_until_last else h)
                    if jitter > 0:
                        carried = (
                            carried
                            + (
                                torch.rand(
                                    carried.shape, generator=generator, device=carried.device, dtype=carried.dtype
                                )
                                * 2
                                - 1
                            )
                            * jitter
                        )
                    mask = feedback_mask
                    if prefix_mixin > 0:
                        mask = mask & ~self._random_prefix(mask, prefix_mixin, generator)
                    if has_fixed:
                        carried = torch.where(fixed_mask[..., None], fixed_carried.to(carried.dtype), carried)
                        mask = mask | fixed_mask
                x = self._fused_inputs(e, carried, mask) if carried is not None else e
                h, _ = self.run_stack(x, attention_mask, position_ids)
            hidden.append(h)
        return MultiPassOutput(hidden)

    @staticmethod
    def _random_prefix(mask, prob, generator):
        B, L = mask.shape
        use = torch.rand(B, generator=generator) < prob
        cut = (torch.rand(B, generator=generator) * L).long()
        prefix = torch.arange(L)[None, :] < cut[:, None]
        return (prefix & use[:, None]).to(mask.device)

    def prompt_carried(self, input_ids, prompt_lens, attention_mask=None, prefill_passes: int | None = None):
        """Fixed carried states of a `fused` prompt: [B, L, d] and the [B, L] mask of prompt positions they feed.

        The engine prefills the prompt `prefill_passes` times; the last prefill pass is fed the states of the
        one before, so here we run the first `prefill_passes - 1` passes over the prompts (right-padded rows).
        """
        passes = prefill_passes or self.config.fbt_prefill_passes
        if passes <= 1:  # one prefill pass is the plain prompt: nothing is fused into it
            d = self.config.hidden_size
            return (
                torch.zeros(*input_ids.shape, d, device=input_ids.device, dtype=self.dtype),
                torch.zeros_like(input_ids, dtype=torch.bool),
            )
        P = int(prompt_lens.max())
        ids = input_ids[:, :P]
        am = attention_mask[:, :P] if attention_mask is not None else None
        in_prompt = torch.arange(P, device=ids.device)[None, :] < prompt_lens.to(ids.device)[:, None]
        fb = self.feedback_mask(ids, am) & in_prompt
        # A GRPO batch holds each prompt G times: run the prefill passes once per distinct prompt. Positions past
        # a row's prompt (its response) cannot reach the prompt's states through causal attention, so the key
        # masks them out.
        key = torch.where(in_prompt, ids, torch.full_like(ids, -1))
        uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
        # one row per distinct prompt (any row of a group will do: they agree on every prompt position)
        rep = torch.zeros(len(uniq), dtype=torch.long, device=ids.device).scatter_(
            0, inverse, torch.arange(len(key), device=ids.device)
        )
        prev = self.multipass_forward(
            ids[rep], passes - 1, None if am is None else am[rep], feedback_mask=fb[rep]
        ).last_hidden[inverse]
        carried = torch.zeros(*input_ids.shape, prev.shape[-1], dtype=prev.dtype, device=prev.device)
        # zero where nothing is fed (past a row's prompt the states are another row's response's, with dedup)
        carried[:, :P] = shift_right(prev).masked_fill(~fb[..., None], 0.0)
        fixed = torch.zeros_like(input_ids, dtype=torch.bool)
        fixed[:, :P] = fb
        return carried, fixed

    # ---- 2. recurrence with a KV cache -----------------------------------------------------------------
    def step(
        self,
        token_ids,
        h_prev,
        past_key_values,
        attention_mask=None,
        position_ids=None,
        feedback: torch.Tensor | bool = True,
    ):
        """Consume new tokens [B, T] one at a time, each fused with the state before it.

        h_prev [B, d] is the state that predicted token_ids[:, 0]; `feedback` (bool or [B] tensor) switches
        fusion off per row (standard decoding). `attention_mask` covers cache + new tokens ([B, past+T]).
        Returns (h [B, T, d], cache); logits are `logits_from_hidden(h)`.
        """
        B, T = token_ids.shape
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            if attention_mask is not None:
                position_ids = positions_from_mask(attention_mask)[:, past : past + T]
            else:
                position_ids = torch.arange(past, past + T, device=token_ids.device)[None].expand(B, T)
        fb = torch.as_tensor(feedback, device=token_ids.device).expand(B).clone()
        resets = torch.tensor(self.reset_token_ids, device=token_ids.device, dtype=token_ids.dtype)
        outs = []
        for t in range(T):
            tok = token_ids[:, t : t + 1]
            e = self.embed(tok)
            mask = (fb & ~torch.isin(tok[:, 0], resets))[:, None]
            x = self._fused_inputs(e, h_prev[:, None, :], mask)
            am = attention_mask[:, : past + t + 1] if attention_mask is not None else None
            h, past_key_values = self.run_stack(x, am, position_ids[:, t : t + 1], past_key_values, use_cache=True)
            h_prev = h[:, 0]
            outs.append(h)
        return torch.cat(outs, dim=1), past_key_values

    # ---- 3. prompt prefill -----------------------------------------------------------------------------
    def prefill(
        self,
        input_ids,
        attention_mask=None,
        mode: str = "soft",
        prefill_passes: int | None = None,
        carried=None,
        carried_mask=None,
    ):
        """Prefill prompts (left-padded for batches). Returns (h [B, P, d], cache).

        standard / soft: one ordinary pass. fused: `prefill_passes` passes, each from a fresh cache, the
        last one kept — so the cache holds the prompt once, not twice. `carried` [B, P, d] / `carried_mask` [B, P]
        (soft mode): the replay prefill of a continuation — those positions fuse the given recorded states, as the
        decode that produced them did (rl/samples/continuation.py); the reset rule still applies.
        """
        if mode not in DECODE_MODES:
            raise ValueError(f"decode_mode: expected one of {DECODE_MODES}, got {mode!r}")
        position_ids = positions_from_mask(attention_mask) if attention_mask is not None else None
        e = self.embed(input_ids)
        x = e
        if carried_mask is not None and bool(carried_mask.any()):
            if mode != "soft":
                raise ValueError(f"prefill: recorded states are fused in soft mode only, not {mode!r}")
            fed = carried_mask & self.feedback_mask(input_ids, attention_mask)
            x = self._fused_inputs(e, carried, fed)
        if mode == "fused":
            passes = prefill_passes or self.config.fbt_prefill_passes
            fb = self.feedback_mask(input_ids, attention_mask)
            for _ in range(passes - 1):
                h, _ = self.run_stack(x, attention_mask, position_ids)
                x = self._fused_inputs(e, shift_right(h), fb)
        return self.run_stack(x, attention_mask, position_ids, use_cache=True)

    # ---- the exact recurrence, teacher-forced ----------------------------------------------------------
    def recurrent_forward(
        self,
        input_ids,
        prompt_lens=None,
        mode: str = "soft",
        fixed_carried=None,
        fixed_mask=None,
        feedback_mask=None,
        return_cache: bool = False,
    ):
        """Ground truth: token by token with a KV cache over right-padded rows, teacher-forced on input_ids.

        mode soft: no feedback before prompt_lens[b]; fused: prompt positions fuse the fused-prompt states
        (`prompt_carried`); standard: no feedback. Rows are right-padded, so padding never reaches a real
        position through causal attention. Returns h [B, L, d] (differentiable if grad is enabled), and with
        `return_cache` also the recurrence's KV cache over all L positions: (h, cache).
        """
        B, L = input_ids.shape
        if prompt_lens is None:
            prompt_lens = torch.ones(B, dtype=torch.long)
        if feedback_mask is None:
            feedback_mask = self.feedback_mask(input_ids, no_feedback_before=prompt_lens)
            if mode == "standard":
                feedback_mask = torch.zeros_like(feedback_mask)
        if mode == "fused" and fixed_mask is None:
            fixed_carried, fixed_mask = self.prompt_carried(input_ids, prompt_lens)
        e = self.embed(input_ids)
        # Positions before the first feedback position of every row do not depend on the recurrence.
        any_fb = feedback_mask.any(0).nonzero()
        start = int(any_fb[0]) if len(any_fb) else L
        x = e[:, :start]
        if fixed_mask is not None and start > 0:
            x = self._fused_inputs(x, fixed_carried[:, :start], fixed_mask[:, :start])
        outs, cache = [], None
        if start > 0:
            h, cache = self.run_stack(x, use_cache=True)
            outs.append(h)
        for t in range(start, L):
            e_t = e[:, t : t + 1]
            carried = outs[-1][:, -1:] if outs else torch.zeros_like(e_t)
            mask = feedback_mask[:, t : t + 1]
            if fixed_mask is not None:
                carried = torch.where(
                    fixed_mask[:, t : t + 1, None], fixed_carried[:, t : t + 1].to(e_t.dtype), carried
                )
                mask = mask | fixed_mask[:, t : t + 1]
            x = self._fused_inputs(e_t, carried, mask)
            pos = torch.full((B, 1), t, dtype=torch.long, device=input_ids.device)
            h, cache = self.run_stack(x, position_ids=pos, past_key_values=cache, use_cache=True)
            outs.append(h)
        h = torch.cat(outs, dim=1)
        return (h, cache) if return_cache else h
