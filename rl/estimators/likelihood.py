"""Likelihood estimators: the learner's log-probs of rollout tokens (docs/DESIGN.md §4).

Every estimator has the signature

    fn(model, batch: LearnerBatch, decode_mode, passes=3, temperature=1.0, with_entropy=False,
       micro_batch_size=None, top_k=0, top_p=1.0, entropy_grad=False, share_prompts=False)
        -> LikelihoodOutput(logprobs [B, R], entropy [B, R] | None)

and returns the response tokens' log-probs under the log-prob contract (rl/samples/logprob_contract.py: log_softmax
of logits / T, restricted to the top-k / top-p kept set and renormalised when those are on, the sampled token always
kept), zero where `batch.response_mask` is 0; entropies are of that same distribution. Logits are computed at the real
response tokens only ([N, V], no padding rows), which is most of the memory with a real vocabulary. Alignment: response
token j of row b sits at position P_b + j and is predicted by the state at P_b + j - 1 (recorded state row j); when
consumed, its input is F(row j, e(y_j)).

| name       | what runs                                                                | gradient                     |
|------------|--------------------------------------------------------------------------|------------------------------|
| `exact`    | the teacher-forced recurrence (`model.recurrent_forward`)                | through the whole recurrence |
| `kpass`    | K-1 parallel passes under no_grad, one pass fed their detached states   | last pass only               |
| `replay`   | one pass fed the engine's recorded states (detached)                     | that pass only               |
| `standard` | an ordinary forward (standard models / standard decoding)                | that pass                    |

`share_prompts=True` computes each distinct prompt of a micro-batch once and runs the rows' response positions
against its keys and values (rl/estimators/shared_prompt.py: soft and standard decoding; equal up to rounding).

Prompt modes: `soft` keeps the prompt ordinary; `fused` feeds the prompt positions the states of the engine's
earlier prefill passes (`model.prompt_carried`, always detached except in `exact`, where the true gradient flows
through them too); `standard` switches feedback off everywhere.

Besides the estimators this module exposes the pieces `rl/estimators/comparison.py` reuses: `last_pass_inputs`
(the detached carried states and fusion mask each estimator's final pass consumes), `run_pass` (one pass over
such inputs, optionally returning the per-layer K/V cache), `exact_states_and_kv` (the recurrence's states and its
own K/V cache) and `response_log_dists` (full-vocabulary log-probs at the response positions). What the estimators
read from a batch (micro-batches, feedback positions, fused-prompt and recorded states) is
rl/estimators/batch_inputs.py.

`rl.model` is imported where it is used: the driver reads this registry (which estimators need recorded states,
`needs_recorded_states`) without loading the model classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rl.decode_modes import DECODE_MODES
from rl.estimators.batch_inputs import fusion_masks, micro_batches, model_device, recorded_carried, response_feedback
from rl.registry import lookup, make_register
from rl.samples.batch import LearnerBatch
from rl.samples.logprob_contract import behaviour_log_softmax, entropy_of

__all__ = [
    "ESTIMATORS",
    "LikelihoodOutput",
    "get_estimator",
    "register_estimator",
    "needs_recorded_states",
    "response_hidden",
    "exact_states_and_kv",
    "last_pass_inputs",
    "run_pass",
    "response_log_dists",
    "token_logprobs",
]


@dataclass
class LikelihoodOutput:
    logprobs: torch.Tensor  # [B, R] fp32, 0 on padding
    entropy: torch.Tensor | None = None  # [B, R] fp32 entropy of softmax(logits / T), 0 on padding


ESTIMATORS: dict[str, Callable[..., LikelihoodOutput]] = {}
# name -> fn(model, batch, decode_mode, passes) -> final-normalized top states h [B, L, d]
_HIDDEN: dict[str, Callable[..., torch.Tensor]] = {}
_add_estimator = make_register(ESTIMATORS, "likelihood estimator")


def get_estimator(name: str) -> Callable[..., LikelihoodOutput]:
    """The estimator called `name`; ValueError listing the valid names otherwise."""
    return lookup(ESTIMATORS, "likelihood estimator", name)


def needs_recorded_states(name: str) -> bool:
    """Whether estimator `name` reads the engine's recorded states: the rollout requests record them and the
    learner's micro-batches carry them (`collate(..., with_states=True)`)."""
    return get_estimator(name).needs_states


def register_estimator(name: str, *, needs_states: bool = False):
    """Decorator: register `hidden_fn(model, batch, decode_mode, passes) -> h [B, L, d]` as estimator `name`.

    The registered estimator wraps it with micro-batching and the log-prob / entropy gathering, so every
    estimator shares one log-prob contract. `needs_states`: it reads `batch.states`, the states the engine
    recorded (the entry carries it as `.needs_states`; requests and collation ask it, never the name).
    """

    def deco(hidden_fn):

        def estimator(
            model,
            batch: LearnerBatch,
            decode_mode: str = "soft",
            passes: int = 3,
            temperature: float = 1.0,
            with_entropy: bool = False,
            micro_batch_size: int | None = None,
            top_k: int = 0,
            top_p: float = 1.0,
            entropy_grad: bool = False,
            share_prompts: bool = False,
        ) -> LikelihoodOutput:
            _check(model, name, decode_mode, passes)
            outs = [
                token_logprobs(
                    model,
                    _micro_batch_hidden(model, mb, name, decode_mode, passes, share_prompts),
                    mb,
                    temperature,
                    with_entropy,
                    top_k=top_k,
                    top_p=top_p,
                    entropy_grad=entropy_grad,
                )
                for mb in micro_batches(batch, micro_batch_size)
            ]
            ent = torch.cat([o.entropy for o in outs]) if with_entropy else None
            return LikelihoodOutput(torch.cat([o.logprobs for o in outs]), ent)

        estimator.__name__ = f"{name}_estimator"
        estimator.__doc__ = hidden_fn.__doc__
        estimator.needs_states = needs_states
        _add_estimator(name)(estimator)  # a second estimator under a taken name is an error
        _HIDDEN[name] = hidden_fn
        return hidden_fn

    return deco


def _micro_batch_hidden(model, mb, name, decode_mode, passes, share_prompts):
    """The estimator's states of one micro-batch: with `share_prompts`, each distinct prompt computed once where
    that applies (rl/estimators/shared_prompt.py), else row by row."""
    from rl.estimators import shared_prompt  # (here: the driver reads this registry without the model classes)

    if share_prompts and shared_prompt.can_share(model, mb, decode_mode, name):
        if name == "standard":
            fb = torch.zeros_like(mb.input_ids, dtype=torch.bool)
        else:
            fb = response_feedback(model, mb, decode_mode)
        recorded = recorded_carried(model, mb, fb) if name == "replay" else None
        return shared_prompt.shared_prompt_hidden(model, mb, decode_mode, name, passes, fb, recorded)
    return _HIDDEN[name](model, mb, decode_mode, passes)


def _check(model, name, decode_mode, passes):
    if decode_mode not in DECODE_MODES:
        raise ValueError(f"decode_mode: expected one of {DECODE_MODES}, got {decode_mode!r}")
    if name == "kpass" and passes < 1:
        raise ValueError(f"kpass: passes must be >= 1, got {passes}")
    if name != "standard" and not hasattr(model, "multipass_forward"):
        raise ValueError(
            f"estimator {name!r} needs an FBT model (latent feedback); {type(model).__name__} only supports 'standard'"
        )


# ---- the four estimators (hidden states) ------------------------------------------------------------------
@register_estimator("exact")
def _exact_hidden(model, batch, decode_mode, passes):
    """Ground truth: the token-by-token recurrence with a KV cache, teacher-forced on the rollout tokens.
    Differentiable through the whole recurrence when grad is enabled (sequential in R)."""
    return _recurrence(model, batch, decode_mode)


def _recurrence(model, batch, decode_mode, return_cache=False):
    dev = model_device(model)
    fb = response_feedback(model, batch, decode_mode)
    # recurrent_forward builds the fused prompt's states itself (with grad when enabled: the true gradient).
    return model.recurrent_forward(
        batch.input_ids.to(dev),
        batch.prompt_lens.to(dev),
        mode=decode_mode,
        feedback_mask=fb,
        return_cache=return_cache,
    )


def exact_states_and_kv(model, batch: LearnerBatch, decode_mode: str):
    """The `exact` estimator's states h [B, L, d] and the recurrence's own K/V: a list over layers of (keys,
    values) [B, kv_heads, L, head_dim], post-RoPE, as cached (for the comparison tool)."""
    _check(model, "exact", decode_mode, 1)
    h, cache = _recurrence(model, batch, decode_mode, return_cache=True)
    return h, [(layer.keys, layer.values) for layer in cache.layers]


@register_estimator("kpass")
def _kpass_hidden(model, batch, decode_mode, passes):
    """K-1 parallel passes under no_grad, then one differentiable pass fed the detached pass-(K-1) states.
    The first K response log-probs are exact (soft and fused); K >= R makes all of them exact."""
    dev = model_device(model)
    fb, pc, pm = fusion_masks(model, batch, decode_mode)
    if decode_mode == "standard":
        passes = 1  # no feedback anywhere: every pass would be the same ordinary forward
    out = model.multipass_forward(
        batch.input_ids.to(dev),
        passes,
        batch.attention_mask.to(dev),
        feedback_mask=fb,
        fixed_carried=pc,
        fixed_mask=pm,
        no_grad_until_last=True,
    )
    return out.last_hidden


@register_estimator("replay", needs_states=True)
def _replay_hidden(model, batch, decode_mode, passes):
    """One differentiable pass fed the engine's recorded states (detached): exact up to numerics for the
    weights that generated the rollout (one update per rollout batch)."""
    carried, mask = last_pass_inputs(model, batch, decode_mode, "replay")
    dev = model_device(model)
    return model.multipass_forward(
        batch.input_ids.to(dev),
        1,
        batch.attention_mask.to(dev),
        feedback_mask=torch.zeros_like(mask),
        fixed_carried=carried,
        fixed_mask=mask,
    ).last_hidden


@register_estimator("standard")
def _standard_hidden(model, batch, decode_mode, passes):
    """An ordinary forward: standard (non-FBT) models, or FBT models decoded without feedback."""
    from rl.model import positions_from_mask

    dev = model_device(model)
    ids, am = batch.input_ids.to(dev), batch.attention_mask.to(dev)
    if hasattr(model, "run_stack"):
        return model.run_stack(model.embed(ids), am, positions_from_mask(am))[0]
    return model.model(input_ids=ids, attention_mask=am, position_ids=positions_from_mask(am)).last_hidden_state


def response_hidden(model, batch: LearnerBatch, decode_mode: str, estimator: str, passes: int = 3) -> torch.Tensor:
    """Final-normalized top states h [B, L, d] of `estimator` (one micro-batch, gradient as the estimator's)."""
    get_estimator(estimator)
    _check(model, estimator, decode_mode, passes)
    return _HIDDEN[estimator](model, batch, decode_mode, passes)


# ---- final-pass inputs and K/V (for the comparison tool) --------------------------------------------------
@torch.no_grad()
def last_pass_inputs(
    model,
    batch: LearnerBatch,
    decode_mode: str,
    estimator: str,
    passes: int = 3,
    prev_hidden: torch.Tensor | None = None,
    masks=None,
):
    """(carried [B, L, d], mask [B, L] bool): what the estimator's final pass fuses, all detached.

    Running `run_pass` on them reproduces the estimator's final pass (for `exact`: the parallel pass over the
    recurrence's own inputs, whose K/V are the exact cache up to numerics). `prev_hidden`, when given, are the
    states whose right shift feeds that pass, already computed (exact: the recurrence's output; kpass: the
    final states of kpass with K-1 passes) — the comparison walks K = 1..M with one pass per K this way.
    `masks`: `fusion_masks(model, batch, decode_mode)`, when already computed for these rows.
    """
    from rl.model import shift_right

    fb, pc, pm = masks if masks is not None else fusion_masks(model, batch, decode_mode)
    dev = model_device(model)
    ids, am = batch.input_ids.to(dev), batch.attention_mask.to(dev)
    dtype = model.get_input_embeddings().weight.dtype
    zeros = torch.zeros(*ids.shape, model.config.hidden_size, device=dev, dtype=dtype)
    if estimator == "replay":
        carried = recorded_carried(model, batch, fb)
    elif estimator == "exact":
        carried = shift_right(
            prev_hidden if prev_hidden is not None else _exact_hidden(model, batch, decode_mode, passes)
        )
    elif estimator == "kpass":
        if passes > 1:
            if prev_hidden is None:
                prev_hidden = model.multipass_forward(
                    ids, passes - 1, am, feedback_mask=fb, fixed_carried=pc, fixed_mask=pm
                ).last_hidden
            carried = shift_right(prev_hidden)
        else:
            carried, fb = zeros, torch.zeros_like(fb)  # one pass: only a fused prompt's states are fed
    elif estimator == "standard":
        return zeros, torch.zeros_like(fb)
    else:
        get_estimator(estimator)  # raises with the valid names
        raise ValueError(f"last_pass_inputs: no final-pass description for estimator {estimator!r}")
    if pm is not None:
        carried = torch.where(pm[..., None], pc.to(carried.dtype), carried)
        fb = fb | pm
    return carried, fb


def run_pass(model, batch: LearnerBatch, carried: torch.Tensor, mask: torch.Tensor, with_kv: bool = False):
    """One pass over the rows, fusing `carried` at `mask`. Returns (h [B, L, d], kv) where kv is a list over
    layers of (keys, values) [B, kv_heads, L, head_dim] read from the backbone's DynamicCache (None unless
    `with_kv`). Keys are post-RoPE, as cached."""
    from rl.model import positions_from_mask

    dev = model_device(model)
    ids, am = batch.input_ids.to(dev), batch.attention_mask.to(dev)
    e = model.embed(ids)
    x = torch.where(mask[..., None], model.fuse(carried, e), e) if bool(mask.any()) else e
    h, cache = model.run_stack(x, am, positions_from_mask(am), use_cache=with_kv)
    kv = [(layer.keys, layer.values) for layer in cache.layers] if with_kv else None
    return h, kv


# ---- log-probs ---------------------------------------------------------------------------------------------
def _temperature(t: float) -> float:
    return t if t > 0 else 1.0  # T = 0 is greedy: log-probs of the untempered logits (the engine contract)


def response_log_dists(model, h: torch.Tensor, batch: LearnerBatch, temperature: float = 1.0) -> torch.Tensor:
    """Full-vocabulary log_softmax(logits / T) at the states predicting each response token: [B, R, V], in fp32
    (or wider)."""
    pos = batch.response_positions().to(h.device)
    h_resp = torch.gather(h, 1, pos[..., None].expand(-1, -1, h.shape[-1]))
    head = model.logits_from_hidden if hasattr(model, "logits_from_hidden") else model.get_output_embeddings()
    logits = head(h_resp)
    # fp32 at least (bf16 log-softmax is too coarse for ratios); fp64 models keep fp64 (gradient checks)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / _temperature(temperature)
    return torch.log_softmax(logits, dim=-1)


def token_logprobs(
    model,
    h: torch.Tensor,
    batch: LearnerBatch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    top_k: int = 0,
    top_p: float = 1.0,
    entropy_grad: bool = False,
) -> LikelihoodOutput:
    """The response tokens' log-probs (and entropies) under the log-prob contract from states h; 0 on padding.
    The LM head and log-softmax run on the real response tokens only. Entropies carry a gradient only with
    `entropy_grad` (an entropy bonus): as a metric, their [N, V] intermediates are not kept for backward."""
    rows, js = batch.response_mask.bool().nonzero(as_tuple=True)
    rows, js = rows.to(h.device), js.to(h.device)
    pos = batch.prompt_lens.to(h.device)[rows] - 1 + js
    head = model.logits_from_hidden if hasattr(model, "logits_from_hidden") else model.get_output_embeddings()
    tok = batch.response_ids.to(h.device)[rows, js]
    logp = behaviour_log_softmax(head(h[rows, pos]), _temperature(temperature), top_k, top_p, always_keep=tok)
    shape = tuple(batch.response_mask.shape)
    picked = logp.gather(-1, tok[:, None])[:, 0]
    lp = torch.zeros(shape, dtype=logp.dtype, device=h.device).index_put((rows, js), picked)
    ent = None
    if with_entropy:
        if entropy_grad and torch.is_grad_enabled():
            per_token = entropy_of(logp)
        else:  # a metric: a few rows at a time, so its temporaries add ~nothing to the [N, V] peak
            with torch.no_grad():
                per_token = torch.cat([entropy_of(c) for c in logp.split(max(1, 2**22 // logp.shape[-1]))])
        ent = torch.zeros(shape, dtype=logp.dtype, device=h.device).index_put((rows, js), per_token)
    return LikelihoodOutput(lp, ent)
