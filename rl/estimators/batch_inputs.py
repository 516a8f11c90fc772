"""What the likelihood estimators (rl/estimators/likelihood.py) read from a learner batch: its micro-batches
(`micro_batches`), where each pass fuses the previous state (`response_feedback`: the sampled response tokens; a
fused prompt's prefill states with `fusion_masks`) and the engine's recorded states placed at the positions they
feed (`recorded_carried`).

`rl.model` is not imported here: the driver reads the estimators' registry without loading the model classes.
"""

from __future__ import annotations

import torch

from rl.samples.batch import LearnerBatch


def micro_batches(batch: LearnerBatch, micro_batch_size: int | None):
    """Split rows into micro-batches (trailing all-padding columns trimmed; R kept so results concatenate).

    Without grad this bounds peak memory; with grad the graphs of all micro-batches live until backward, so a
    learner that must bound memory calls the estimator per micro-batch and backpropagates each one.
    """
    B = len(batch)
    size = B if not micro_batch_size or micro_batch_size >= B else micro_batch_size
    for start in range(0, B, size):
        mb = batch if size == B else batch.select(range(start, min(start + size, B)))
        L = int((mb.prompt_lens + mb.response_lens).max())
        if L < mb.input_ids.shape[1]:
            mb = LearnerBatch(
                mb.input_ids[:, :L],
                mb.attention_mask[:, :L],
                mb.prompt_lens,
                mb.response_lens,
                mb.response_mask,
                mb.engine_logprobs,
                mb.states,
                mb.extras,
            )
        yield mb


def model_device(model) -> torch.device:
    """The device of the model's parameters (where its batches go)."""
    return next(model.parameters()).device


def fusion_masks(model, batch: LearnerBatch, decode_mode: str):
    """What every estimator's passes fuse where: (feedback [B, L] bool of response positions, fused-prompt carried
    [B, L, d] | None, its mask [B, L] | None); also for `last_pass_inputs(..., masks=)` of
    rl/estimators/likelihood.py, which then does not recompute them (fused prompts run prefill passes for them).

    Feedback starts at the first response position (soft and fused alike); fused prompts additionally get
    the engine's prefill states, computed here under no_grad (they are constants to the learner).
    """
    fb = response_feedback(model, batch, decode_mode)
    if decode_mode != "fused":
        return fb, None, None
    dev = model_device(model)
    with torch.no_grad():
        pc, pm = model.prompt_carried(batch.input_ids.to(dev), batch.prompt_lens.to(dev), batch.attention_mask.to(dev))
    return fb, pc, pm


def response_feedback(model, batch: LearnerBatch, decode_mode: str) -> torch.Tensor:
    """[B, L] bool: the positions of sampled response tokens, whose input fuses the previous state (none in
    `standard` mode). Observation tokens of a multi-turn sample (response_mask 0) are consumed plainly, as the
    engine consumed them."""
    dev = model_device(model)
    ids = batch.input_ids.to(dev)
    if decode_mode == "standard":
        return torch.zeros_like(ids, dtype=torch.bool)
    fb = model.feedback_mask(ids, batch.attention_mask.to(dev), no_feedback_before=batch.prompt_lens.to(dev))
    sampled = torch.zeros_like(fb)
    rows, js = batch.response_mask.bool().nonzero(as_tuple=True)
    pos = batch.prompt_lens[rows] + js
    keep = pos < fb.shape[1]
    sampled[rows[keep].to(dev), pos[keep].to(dev)] = True
    return fb & sampled


def recorded_carried(model, batch: LearnerBatch, fb: torch.Tensor) -> torch.Tensor:
    """Recorded state row j placed at position P_b + j ([B, L, d], zeros elsewhere)."""
    if batch.states is None:
        raise ValueError(
            "replay needs recorded states (batch.states is None): generate with "
            "record_states=True and collate(..., with_states=True)"
        )
    B, L = fb.shape
    emb = model.get_input_embeddings().weight
    carried = torch.zeros(B, L, batch.states.shape[-1], dtype=emb.dtype, device=emb.device)
    rows, js = batch.response_mask.bool().nonzero(as_tuple=True)
    pos = batch.prompt_lens[rows] + js
    keep = pos < L
    carried[rows[keep], pos[keep]] = batch.states[rows[keep], js[keep]].to(emb.dtype).to(emb.device)
    return carried
