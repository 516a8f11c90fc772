"""The full-bandwidth transformer (FBT) on Hugging Face backbones (Llama and Qwen2 families).

An FBT fuses the previous position's final-normalized top-layer state into the next input:
`x_t = F(h_{t-1}, e_t)`. The backbone is used unchanged through `inputs_embeds`; what this module adds is the
fusion `F`, and three ways to run the model (shared/DESIGN.md §3):

1. `multipass_forward` — K parallel passes, pass k fusing pass k-1's states shifted one position right
   (training, K-pass likelihood, replay of recorded states);
2. `step` — the recurrence with a KV cache, carrying `h_prev` per sequence (decoding);
3. `prefill` — a prompt in `standard`, `soft` or `fused` mode (fused = the prompt prefilled again from a fresh
   cache, fused with the previous prefill pass's states).

`recurrent_forward` runs the exact token-by-token recurrence teacher-forced on given tokens: the ground truth
every parallel shortcut is tested against. The checkpoint is a normal `save_pretrained` directory whose
`model_type` is `fbt_llama` / `fbt_qwen2`; importing this module registers both with the Auto classes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import (AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)
from transformers import initialization as hf_init

from rl.decode_modes import MODES as PROMPT_MODES  # noqa: F401  (the one definition; engines import it from here)

FUSION_MODES = ("gate_product", "concat_projection", "linear_addition")
INPUT_SCALES = ("embedding_rms", "unit")


def rms_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Parameter-free RMSNorm, computed in fp32 so bf16 states do not lose the scale."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rms_value(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return torch.sqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)


class Fusion(nn.Module):
    """`F(h, e)` before scaling, returning a unit-RMS vector. Weight names are part of the checkpoint format.

    gate_product:      RMS((W_U h) ⊙ σ(W_G RMS(e)))   — the state rides the value path, the token only gates
    concat_projection: RMS(W_C [RMS(h); RMS(e)])
    linear_addition:   RMS(W_U h + W_T RMS(e))
    """

    def __init__(self, hidden_size: int, mode: str, eps: float = 1e-6):
        super().__init__()
        if mode not in FUSION_MODES:
            raise ValueError(f"fbt_fusion_mode: expected one of {FUSION_MODES}, got {mode!r}")
        self.mode, self.eps = mode, eps
        d = hidden_size
        if mode == "gate_product":
            self.w_u, self.w_g = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        elif mode == "concat_projection":
            self.w_c = nn.Linear(2 * d, d, bias=False)
        else:
            self.w_u, self.w_t = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        for lin in self.children():
            lin._fbt_fusion = True  # tells _init_weights to use the paper's uniform init

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        eps = self.eps
        if self.mode == "gate_product":
            z = self.w_u(h) * torch.sigmoid(self.w_g(rms_normalize(e, eps)))
        elif self.mode == "concat_projection":
            z = self.w_c(torch.cat([rms_normalize(h, eps), rms_normalize(e, eps)], dim=-1))
        else:
            z = self.w_u(h) + self.w_t(rms_normalize(e, eps))
        return rms_normalize(z, eps)


@strict
class FBTLlamaConfig(LlamaConfig):
    model_type = "fbt_llama"
    fbt_fusion_mode: str = "gate_product"
    # Llama/Qwen2 feed the raw embedding, so the unit-RMS fused vector is rescaled to the token embedding's RMS.
    fbt_input_scale: str = "embedding_rms"
    fbt_reset_token_ids: list[int] | None = None  # document starts; None = [bos_token_id]
    fbt_prefill_passes: int = 2  # passes of the `fused` prompt mode
    # epsilon of the fusion's parameter-free RMS norms (and of the embedding-RMS scale). An identity conversion
    # (`identity_init_fusion`) sets it ~0 so that the fused input equals the token embedding to fp32 rounding.
    fbt_rms_eps: float = 1e-6


@strict
class FBTQwen2Config(Qwen2Config):
    model_type = "fbt_qwen2"
    fbt_fusion_mode: str = "gate_product"
    fbt_input_scale: str = "embedding_rms"
    fbt_reset_token_ids: list[int] | None = None
    fbt_prefill_passes: int = 2
    fbt_rms_eps: float = 1e-6


@dataclass
class MultiPassOutput:
    hidden: list[torch.Tensor]  # per pass, [B, L, d] final-normalized top states

    @property
    def last_hidden(self) -> torch.Tensor:
        return self.hidden[-1]


def shift_right(states: torch.Tensor) -> torch.Tensor:
    """carried[:, t] = states[:, t-1]; position 0 gets zeros (it never takes feedback)."""
    return F.pad(states[:, :-1], (0, 0, 1, 0))


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids for left- or right-padded rows: 0 at each row's first real token."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


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

    def run_stack(self, inputs_embeds, attention_mask=None, position_ids=None, past_key_values=None,
                  use_cache=False):
        """The backbone's decoder stack + final norm: returns (h [B,L,d], cache)."""
        out = self.model(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, use_cache=use_cache)
        return out.last_hidden_state, out.past_key_values

    def logits_from_hidden(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(h)

    def feedback_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      no_feedback_before: torch.Tensor | None = None) -> torch.Tensor:
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
    def multipass_forward(self, input_ids, num_passes: int, attention_mask=None, feedback_mask=None,
                          fixed_carried=None, fixed_mask=None, jitter: float = 0.0,
                          prefix_mixin: float = 0.0, no_grad_until_last: bool = False,
                          generator: torch.Generator | None = None) -> MultiPassOutput:
        """Run K passes in parallel. Pass 1 is ordinary except at `fixed_mask` positions, which always fuse
        `fixed_carried` (recorded states for replay, or the fused-prompt states). Pass k ≥ 2 fuses pass k-1's
        states shifted right at `feedback_mask` positions.

        jitter: uniform noise in [-jitter, jitter] on the carried states, fresh per pass (training only).
        prefix_mixin: per row and pass, with this probability a random-length prefix keeps the plain input.
        no_grad_until_last: passes 1..K-1 under no_grad and the last pass fed their detached states (kpass).
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
            with torch.set_grad_enabled(torch.is_grad_enabled() and (last or not no_grad_until_last)):
                if k == 0:
                    carried = fixed_carried if has_fixed else None
                    mask = fixed_mask if has_fixed else torch.zeros_like(feedback_mask)
                else:
                    carried = shift_right(h.detach() if no_grad_until_last else h)
                    if jitter > 0:
                        carried = carried + (torch.rand(carried.shape, generator=generator, device=carried.device,
                                                        dtype=carried.dtype) * 2 - 1) * jitter
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
            return (torch.zeros(*input_ids.shape, d, device=input_ids.device, dtype=self.dtype),
                    torch.zeros_like(input_ids, dtype=torch.bool))
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
            0, inverse, torch.arange(len(key), device=ids.device))
        prev = self.multipass_forward(ids[rep], passes - 1, None if am is None else am[rep],
                                      feedback_mask=fb[rep]).last_hidden[inverse]
        carried = torch.zeros(*input_ids.shape, prev.shape[-1], dtype=prev.dtype, device=prev.device)
        # zero where nothing is fed (past a row's prompt the states are another row's response's, with dedup)
        carried[:, :P] = shift_right(prev).masked_fill(~fb[..., None], 0.0)
        fixed = torch.zeros_like(input_ids, dtype=torch.bool)
        fixed[:, :P] = fb
        return carried, fixed

    # ---- 2. recurrence with a KV cache -----------------------------------------------------------------
    def step(self, token_ids, h_prev, past_key_values, attention_mask=None, position_ids=None,
             feedback: torch.Tensor | bool = True):
        """Consume new tokens [B, T] one at a time, each fused with the state before it.

        h_prev [B, d] is the state that predicted token_ids[:, 0]; `feedback` (bool or [B] tensor) switches
        fusion off per row (standard decoding). `attention_mask` covers cache + new tokens ([B, past+T]).
        Returns (h [B, T, d], cache); logits are `logits_from_hidden(h)`.
        """
        B, T = token_ids.shape
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            if attention_mask is not None:
                position_ids = positions_from_mask(attention_mask)[:, past:past + T]
            else:
                position_ids = torch.arange(past, past + T, device=token_ids.device)[None].expand(B, T)
        fb = torch.as_tensor(feedback, device=token_ids.device).expand(B).clone()
        resets = torch.tensor(self.reset_token_ids, device=token_ids.device, dtype=token_ids.dtype)
        outs = []
        for t in range(T):
            tok = token_ids[:, t:t + 1]
            e = self.embed(tok)
            mask = (fb & ~torch.isin(tok[:, 0], resets))[:, None]
            x = self._fused_inputs(e, h_prev[:, None, :], mask)
            am = attention_mask[:, :past + t + 1] if attention_mask is not None else None
            h, past_key_values = self.run_stack(x, am, position_ids[:, t:t + 1], past_key_values, use_cache=True)
            h_prev = h[:, 0]
            outs.append(h)
        return torch.cat(outs, dim=1), past_key_values

    # ---- 3. prompt prefill -----------------------------------------------------------------------------
    def prefill(self, input_ids, attention_mask=None, mode: str = "soft", prefill_passes: int | None = None):
        """Prefill prompts (left-padded for batches). Returns (h [B, P, d], cache).

        standard / soft: one ordinary pass. fused: `prefill_passes` passes, each from a fresh cache, the
        last one kept — so the cache holds the prompt once, not twice.
        """
        if mode not in PROMPT_MODES:
            raise ValueError(f"decode_mode: expected one of {PROMPT_MODES}, got {mode!r}")
        position_ids = positions_from_mask(attention_mask) if attention_mask is not None else None
        e = self.embed(input_ids)
        x = e
        if mode == "fused":
            passes = prefill_passes or self.config.fbt_prefill_passes
            fb = self.feedback_mask(input_ids, attention_mask)
            for _ in range(passes - 1):
                h, _ = self.run_stack(x, attention_mask, position_ids)
                x = self._fused_inputs(e, shift_right(h), fb)
        return self.run_stack(x, attention_mask, position_ids, use_cache=True)

    # ---- the exact recurrence, teacher-forced ----------------------------------------------------------
    def recurrent_forward(self, input_ids, prompt_lens=None, mode: str = "soft", fixed_carried=None,
                          fixed_mask=None, feedback_mask=None):
        """Ground truth: token by token with a KV cache over right-padded rows, teacher-forced on input_ids.

        mode soft: no feedback before prompt_lens[b]; fused: prompt positions fuse the fused-prompt states
        (`prompt_carried`); standard: no feedback. Rows are right-padded, so padding never reaches a real
        position through causal attention. Returns h [B, L, d] (differentiable if grad is enabled).
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
            e_t = e[:, t:t + 1]
            carried = outs[-1][:, -1:] if outs else torch.zeros_like(e_t)
            mask = feedback_mask[:, t:t + 1]
            if fixed_mask is not None:
                carried = torch.where(fixed_mask[:, t:t + 1, None], fixed_carried[:, t:t + 1].to(e_t.dtype),
                                      carried)
                mask = mask | fixed_mask[:, t:t + 1]
            x = self._fused_inputs(e_t, carried, mask)
            pos = torch.full((B, 1), t, dtype=torch.long, device=input_ids.device)
            h, cache = self.run_stack(x, position_ids=pos, past_key_values=cache, use_cache=True)
            outs.append(h)
        return torch.cat(outs, dim=1)


class FBTLlamaForCausalLM(FBTMixin, LlamaForCausalLM):
    config_class = FBTLlamaConfig

    def __init__(self, config):
        super().__init__(config)
        self._init_fbt(config)
        self.post_init()


class FBTQwen2ForCausalLM(FBTMixin, Qwen2ForCausalLM):
    config_class = FBTQwen2Config

    def __init__(self, config):
        super().__init__(config)
        self._init_fbt(config)
        self.post_init()


FBT_CLASSES = {"llama": (FBTLlamaConfig, FBTLlamaForCausalLM), "qwen2": (FBTQwen2Config, FBTQwen2ForCausalLM)}

for _cfg, _cls in FBT_CLASSES.values():
    AutoConfig.register(_cfg.model_type, _cfg, exist_ok=True)
    AutoModelForCausalLM.register(_cfg, _cls, exist_ok=True)


def as_standard_lm(model):
    """A stock Hugging Face Llama/Qwen2 that decodes in `standard` mode wherever an FBT model does.

    Its class gains `FBTMixin`'s feedback-free building blocks (`embed`, `run_stack`, `logits_from_hidden`,
    `prefill(mode="standard")`); it has no fusion, so every feedback mode refuses it. `fbrl eval` uses this to
    score a backbone before conversion with the same engine and scorer as the converted model.
    """
    if hasattr(model, "fusion"):
        return model
    model.__class__ = type(f"Standard{type(model).__name__}", (FBTMixin, type(model)), {})
    return model


def fbt_config_from(base_config, fusion_mode: str = "gate_product", **fbt_fields):
    """An FBT config carrying every field of a stock Llama/Qwen2 config."""
    backbone = base_config.model_type.removeprefix("fbt_")
    if backbone not in FBT_CLASSES:
        raise ValueError(f"model_type {base_config.model_type!r} is not a supported backbone; "
                         f"supported: {sorted(FBT_CLASSES)}")
    cfg_cls, model_cls = FBT_CLASSES[backbone]
    fields = base_config.to_dict()
    for k in ("model_type", "architectures", "transformers_version", "quantization_config"):
        fields.pop(k, None)
    fields.update(fbt_fusion_mode=fusion_mode, **fbt_fields)
    cfg = cfg_cls(**fields)
    cfg.architectures = [model_cls.__name__]
    return cfg


# Fusion epsilon of an identity conversion: ~0 next to any embedding's mean square (fp32 keeps 1e-12 exactly), so
# the three RMS epsilons no longer scale the fused input by 1/sqrt(ms/(ms+eps) + eps) ≠ 1 (docs/BENCHMARKS.md).
IDENTITY_RMS_EPS = 1e-12
FUSION_INITS = ("random", "identity")
_NO_IDENTITY = ("identity init: fusion mode 'gate_product' has no identity point (the carried state is its value "
                "path, the token only gates it); use 'linear_addition' or 'concat_projection'")


@torch.no_grad()
def identity_init_fusion(model) -> None:
    """Set the fusion to its identity point: fused input == token embedding, whatever the carried state.

    linear_addition: W_U = 0, W_T = I, so RMS(W_U h + W_T RMS(e)) · rms(e) = e; concat_projection:
    W_C = [0, I]. The state then has no effect on the forward pass, but ∂L/∂W_U = (∂L/∂z) hᵀ is not zero, so
    SFT or RL can grow the latent channel from a model that decodes exactly like its backbone in every mode.
    gate_product, RMS((W_U h) ⊙ σ(W_G RMS(e))), has no such point: the state is the value path, the token only
    gates it, so no weights make the fused input equal e.
    """
    fusion = model.fusion
    if fusion.mode == "gate_product":
        raise ValueError(_NO_IDENTITY)
    d = model.config.hidden_size
    eye = torch.eye(d, dtype=model.dtype, device=model.device)
    if fusion.mode == "linear_addition":
        fusion.w_u.weight.zero_()
        fusion.w_t.weight.copy_(eye)
    else:
        fusion.w_c.weight.zero_()
        fusion.w_c.weight[:, d:].copy_(eye)


def convert_to_fbt(model, fusion_mode: str = "gate_product", seed: int = 0, init: str = "random", **fbt_fields):
    """Stock HF causal LM (module or directory) → FBT model.

    The one-pass model is unchanged: every backbone tensor is copied bit for bit. `init="random"`: the paper's
    fusion init (needs multi-pass SFT before feedback helps); `init="identity"`: `identity_init_fusion` with
    `fbt_rms_eps=IDENTITY_RMS_EPS`, so every decode mode equals the backbone from step 0.
    """
    if init not in FUSION_INITS:
        raise ValueError(f"init: expected one of {FUSION_INITS}, got {init!r}")
    if isinstance(model, str):
        model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    if init == "identity":
        fbt_fields.setdefault("fbt_rms_eps", IDENTITY_RMS_EPS)
    cfg = fbt_config_from(model.config, fusion_mode, **fbt_fields)
    if init == "identity" and fusion_mode == "gate_product":
        raise ValueError(_NO_IDENTITY)
    torch.manual_seed(seed)
    fbt = FBT_CLASSES[cfg.model_type.removeprefix("fbt_")][1](cfg).to(next(model.parameters()).dtype)
    missing, unexpected = fbt.load_state_dict(model.state_dict(), strict=False)
    if unexpected or any(not k.startswith("fusion.") for k in missing):
        raise ValueError(f"backbone weights do not fit: missing={missing} unexpected={unexpected}")
    if init == "identity":
        identity_init_fusion(fbt)
    return fbt
