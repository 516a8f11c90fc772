"""Each distinct prompt of a micro-batch computed once: the learner's forward for GRPO groups.

A GRPO micro-batch holds each prompt G times (prompt + G different responses). In `soft` and `standard` decoding a
prompt is consumed plainly by every estimator, in every pass: its keys and values are the same in every row of its
group and in every pass. `shared_prompt_hidden` therefore runs

1. the distinct prompts once, with grad, right-padded with an attention mask (one row per distinct prompt, of the
   micro-batch's longest prompt length), keeping the backbone's per-layer K/V;
2. the response positions only, every row attending to its prompt's K/V (`index_select` over the distinct prompts:
   the backward sums each prompt's key / value gradients over the rows that read them), position ids continuing
   at the row's prompt length; a prompt's padding is masked out of the response's attention.

The estimators keep their meaning on the response part: `kpass` runs K-1 response passes under no_grad (eval mode,
reading a detached copy of the prompt K/V) and a differentiable last pass fed their detached states; `replay` one
pass fusing the recorded states; `exact` the token-by-token recurrence continuing from the prompt cache (the
gradient runs through the whole recurrence and into the prompt); `standard` one plain pass. The first response
token fuses the prompt's last state, as in the row-by-row forward. Observation tokens of a multi-turn sample are
part of the response and consumed plainly (the estimators' feedback mask); only the original prompt is shared.

The output is the row-by-row layout (final-normalized states [B, L, d], response token j of row b predicted at
P_b + j - 1), so the log-prob gathering is the same code. Equal to the row-by-row forward up to floating-point
rounding (tests/test_shared_prompt.py). Sharing is per micro-batch: a group whose rows are split over two
micro-batches computes its prompt once in each (still correct; the learner's plan keeps groups together).

Where it does not apply, the estimators run row by row (`can_share` says which): `fused` decoding (the prompt is
prefilled with feedback, per row), a model training with active dropout (the G rows would share one dropout draw
of the prompt, and kpass's frozen passes run without dropout), and a micro-batch whose prompts are all distinct.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from rl.model.fusion import dropout_off, positions_from_mask
from rl.samples.batch import LearnerBatch

SHARED_ESTIMATORS = ("exact", "kpass", "replay", "standard")


@dataclass
class PromptShare:
    """The micro-batch split into distinct prompts and response segments (all on the model's device)."""

    inverse: torch.Tensor  # [B] index of each row's distinct prompt
    prompt_ids: torch.Tensor  # [U, P] the distinct prompts, right-padded
    prompt_mask: torch.Tensor  # [U, P] 1 on prompt tokens
    prompt_lens: torch.Tensor  # [B] P_b
    response_ids: torch.Tensor  # [B, T] tokens at P_b .. P_b + T - 1 (any id past the row's end)
    response_mask: torch.Tensor  # [B, T] 1 on the row's response tokens (sampled and observation alike)
    response_pos: torch.Tensor  # [B, T] P_b + i: the position ids of the response segment
    feedback: torch.Tensor  # [B, T] bool: response positions that fuse the previous state


def prompt_groups(input_ids: torch.Tensor, prompt_lens: torch.Tensor):
    """(inverse [B], representative row of each distinct prompt [U]): rows with identical prompt tokens share one
    index; positions past a row's prompt are ignored."""
    P = int(prompt_lens.max())
    ids = input_ids[:, :P]
    in_prompt = torch.arange(P, device=ids.device)[None, :] < prompt_lens.to(ids.device)[:, None]
    key = torch.where(in_prompt, ids, torch.full_like(ids, -1))
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    rep = torch.zeros(len(uniq), dtype=torch.long, device=ids.device)
    rep.scatter_(0, inverse, torch.arange(len(key), device=ids.device))
    return inverse, rep


def _active_dropout(model) -> bool:
    if not model.training:
        return False
    if float(getattr(model.config, "attention_dropout", 0.0) or 0.0) > 0:
        return True
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def can_share(model, batch: LearnerBatch, decode_mode: str, estimator: str) -> bool:
    """Whether `shared_prompt_hidden` applies to this micro-batch (else the estimator runs row by row)."""
    if estimator not in SHARED_ESTIMATORS or decode_mode == "fused" or _active_dropout(model):
        return False
    inverse, rep = prompt_groups(batch.input_ids, batch.prompt_lens)
    return len(rep) < len(batch)


def prompt_share_of(batch: LearnerBatch, feedback: torch.Tensor, device) -> PromptShare:
    """The distinct prompts and each row's response segment; `feedback` [B, L] is the estimators' feedback mask."""
    ids = batch.input_ids.to(device)
    plens = batch.prompt_lens.to(device)
    inverse, rep = prompt_groups(ids, plens)
    P, L = int(plens.max()), ids.shape[1]
    T = max(int(batch.response_lens.max()), 1)
    arange_p = torch.arange(P, device=device)[None, :]
    prompt_mask = (arange_p < plens[rep][:, None]).long()
    pos = plens[:, None] + torch.arange(T, device=device)[None, :]
    inside = pos.clamp(max=L - 1)
    resp_mask = (torch.arange(T, device=device)[None, :] < batch.response_lens.to(device)[:, None]).long()
    return PromptShare(
        inverse=inverse,
        prompt_ids=ids[rep, :P] * prompt_mask,  # padding as token 0: masked out of every attention
        prompt_mask=prompt_mask,
        prompt_lens=plens,
        response_ids=torch.gather(ids, 1, inside),
        response_mask=resp_mask,
        response_pos=pos,
        feedback=torch.gather(feedback.to(device), 1, inside) & resp_mask.bool(),
    )


def _embed(model, ids):
    return model.embed(ids) if hasattr(model, "embed") else model.get_input_embeddings()(ids)


def _stack(model, x, attention_mask, position_ids, cache=None, use_cache=False):
    """The backbone's decoder stack + final norm on input embeddings: (h, cache)."""
    if hasattr(model, "run_stack"):
        return model.run_stack(x, attention_mask, position_ids, past_key_values=cache, use_cache=use_cache)
    out = model.model(
        inputs_embeds=x,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=cache,
        use_cache=use_cache,
    )
    return out.last_hidden_state, out.past_key_values


class PromptCache:
    """The distinct prompts' per-layer K/V, handed out per row as a fresh cache for each response pass."""

    def __init__(self, cache, share: PromptShare):
        self.kv = [(layer.keys, layer.values) for layer in cache.layers]
        self.share = share

    def for_rows(self, detached: bool) -> DynamicCache:
        """A new cache holding each row's prompt K/V (the response pass appends to it, so it is not reused).
        `detached`: for no-grad passes; otherwise gradients reach the prompt K/V from every row."""
        inv = self.share.inverse
        pick = (lambda t: t.detach().index_select(0, inv)) if detached else (lambda t: t.index_select(0, inv))
        return DynamicCache([(pick(k), pick(v)) for k, v in self.kv])

    def mask(self, upto: int | None = None) -> torch.Tensor:
        """[B, P + T] attention mask: the row's prompt (padding excluded) then its response segment."""
        s = self.share
        resp = s.response_mask if upto is None else s.response_mask[:, :upto]
        return torch.cat([s.prompt_mask.index_select(0, s.inverse), resp], dim=1)


def _fuse(model, e, carried, mask):
    if not bool(mask.any()):
        return e
    return torch.where(mask[..., None], model.fuse(carried.to(e.dtype), e), e)


def _response_pass(model, pc: PromptCache, e_resp, carried, mask, detached: bool):
    x = _fuse(model, e_resp, carried, mask) if carried is not None else e_resp
    h, _ = _stack(model, x, pc.mask(), pc.share.response_pos, pc.for_rows(detached))
    return h


def _kpass(model, pc: PromptCache, e_resp, last_prompt_state, passes: int):
    """K-1 response passes under no_grad in eval mode, then the differentiable one fed their detached states."""
    h = None
    for k in range(passes):
        frozen = k < passes - 1
        with torch.set_grad_enabled(torch.is_grad_enabled() and not frozen), dropout_off(model, frozen):
            if k == 0:
                h = _response_pass(model, pc, e_resp, None, None, frozen)
            else:
                carried = torch.cat([last_prompt_state.detach()[:, None], h.detach()[:, :-1]], dim=1)
                h = _response_pass(model, pc, e_resp, carried, pc.share.feedback, frozen)
    return h


def _exact(model, pc: PromptCache, e_resp, last_prompt_state):
    """The recurrence over the response tokens, continuing from the prompt cache (differentiable throughout)."""
    s = pc.share
    cache, prev, outs = pc.for_rows(detached=False), last_prompt_state, []
    for i in range(e_resp.shape[1]):
        x = _fuse(model, e_resp[:, i : i + 1], prev[:, None], s.feedback[:, i : i + 1])
        h, cache = _stack(model, x, pc.mask(i + 1), s.response_pos[:, i : i + 1], cache, use_cache=True)
        prev = h[:, 0]
        outs.append(h)
    return torch.cat(outs, dim=1)


def shared_prompt_hidden(
    model, batch: LearnerBatch, decode_mode: str, estimator: str, passes: int, feedback, recorded=None
) -> torch.Tensor:
    """Final-normalized top states [B, L, d] of `estimator` with each distinct prompt computed once.

    `feedback` [B, L]: the estimator's feedback mask (sampled response positions; none in `standard` mode).
    `recorded` [B, L, d]: replay's recorded states at the positions they feed (replay only)."""
    dev = next(model.parameters()).device
    s = prompt_share_of(batch, feedback, dev)
    h_prompt, cache = _stack(
        model, _embed(model, s.prompt_ids), s.prompt_mask, positions_from_mask(s.prompt_mask), use_cache=True
    )
    pc = PromptCache(cache, s)
    h_rows = h_prompt.index_select(0, s.inverse)  # [B, P, d]
    last_prompt_state = h_rows[torch.arange(len(s.inverse), device=dev), s.prompt_lens - 1]
    e_resp = _embed(model, s.response_ids)
    if estimator == "replay":
        carried = torch.gather(
            recorded.to(dev),
            1,
            s.response_pos.clamp(max=recorded.shape[1] - 1)[..., None].expand(-1, -1, recorded.shape[-1]),
        )
        h_resp = _response_pass(model, pc, e_resp, carried, s.feedback, detached=False)
    elif estimator == "exact":
        h_resp = _exact(model, pc, e_resp, last_prompt_state)
    elif estimator == "kpass":
        h_resp = _kpass(model, pc, e_resp, last_prompt_state, 1 if decode_mode == "standard" else passes)
    elif estimator == "standard":
        h_resp = _response_pass(model, pc, e_resp, None, None, detached=False)
    else:
        raise ValueError(f"shared prompts: estimator {estimator!r} is not one of {SHARED_ESTIMATORS}")
    return _row_layout(h_rows, h_resp, s, batch.input_ids.shape[1])


def _row_layout(h_rows, h_resp, s: PromptShare, L: int) -> torch.Tensor:
    """Prompt states then response states, placed at each row's positions: [B, L, d] (gather: differentiable)."""
    P, T = h_rows.shape[1], h_resp.shape[1]
    t = torch.arange(L, device=h_rows.device)[None, :]
    plens = s.prompt_lens[:, None]
    idx = torch.where(t < plens, t, P + t - plens).clamp(max=P + T - 1)
    both = torch.cat([h_rows, h_resp.to(h_rows.dtype)], dim=1)
    return torch.gather(both, 1, idx[..., None].expand(-1, -1, both.shape[-1]))
