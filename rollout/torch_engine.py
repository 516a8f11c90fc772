"""The pure-torch reference rollout engine: batched latent-feedback decoding with a KV cache.

Owns `TorchEngine` (the `RolloutEngine` every other engine is checked against, the engine of unit tests, and
the fallback where vLLM is not installed). It runs the FBT model's own building blocks (`prefill`, `embed`,
`run_stack`, `logits_from_hidden` of rl/model/fbt.py), so what it computes is the model's recurrence
(`recurrent_forward`), batched; tests/test_torch_engine.py holds it to that.

Design choices (bench/decode.py measures them; docs/BENCHMARKS.md has the figures):

- **Left padding.** Prompts of different lengths are left-padded into one batch with an attention mask and
  `positions_from_mask` positions. Every row's last prompt state then sits in the same column, and every
  generated token of every row is appended at the same cache column, so one Hugging Face cache with a single
  shared length serves the whole batch and each decode step is one `[B, 1]` forward. Right padding would need
  a per-row write position (not supported by the HF caches); packing needs varlen attention kernels that plain
  torch SDPA does not have. The decode mask is built once per call in the 4D form the attention implementation
  takes as-is and sliced per step, so the backbone does not rebuild it every token.
- **Shared K/V heads read in place.** On grouped-query models (SmolLM2, Qwen, Llama 3) with padded prompts,
  transformers' `sdpa` copies every layer's whole K/V cache once per query head at every step; the engine
  switches such a model to `sdpa_shared_kv` (rl/model/attention.py), which reads the shared heads as they are.
- **Prefill in length groups.** Padding costs prefill compute, so prompts are prefilled in groups of similar
  length (`prefill_groups`: a small DP trading padding against extra forward calls) and the groups' caches are
  merged into the left-padded layout (a prompt's K/V do not depend on the masked padding left of it).
- **Preallocated KV buffers** (`PreallocatedLayer`, rollout/kv_cache.py): after prefill the cache gets room for all new tokens, and a
  step writes one column in place — `DynamicCache` `torch.cat`s the whole cache into a fresh buffer every step,
  which was the largest cost of a decode step on small models.
- **n samples per prompt** share one prefill: the prompt's cache rows are repeated n times into the buffers.
- **Early exit.** When rows finish (a stop token), they are dropped from the batch once they are a quarter of it
  (`COMPACT_FRACTION`: each drop copies the whole cache): the cache, mask, positions, `h_prev` and sampler keys
  are `index_select`ed to the unfinished rows; until then a finished row decodes on, and what it writes past its
  length is never read. The loop ends when no row is left.
- **Per-sequence `h_prev`.** Row j of a sample's recorded states is the state that predicted response token j
  (row 0 = last prompt position). The token consumed next is fused with it (`F(h_prev, e)`), except in
  `standard` mode and for document-start tokens (`fbt_reset_token_ids`), which keep the ordinary input.
- **Token-side fusion tables.** Every fusion mode splits into a d×d matmul of the state and a term that depends
  on the token only (`σ(W_G RMS(e))`, `W_T RMS(e)`, or the token half of `W_C`), plus the embedding's RMS. The
  token terms are precomputed once per weight version for the whole vocabulary, so a decode step pays one of
  the two fusion matmuls and a handful of elementwise ops. The tables are rebuilt whenever the embedding or
  fusion weights change (new tensors or in-place writes). They cost a vocab × d tensor: `fusion_tables=False`
  (`model.fuse` every step) for very large vocabularies.
- **Sampling with a per-request seed, independent of batch composition** (rollout/sampling.py): a sample's
  tokens depend on its own prompt, the weights, the params and (seed, prompt index, sample index) only — not
  on the other prompts, the padding, the batch size or which rows already finished (up to float rounding of
  differently shaped batches landing a uniform on the other side of a CDF boundary) — and there is no per-row
  `torch.Generator` loop in the step (B Python calls per token). Log-probs follow docs/DESIGN.md §5.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache

import rl.samples.states as state_formats
from rl.model import rms_normalize, rms_value
from rl.model.attention import SHARED_KV_SDPA, use_shared_kv_attention
from rl.samples.batch import Sample
from rl.samples.continuation import Continuation, check_continuations
from rl.samples.request import SamplingParams
from rollout.engine import RolloutEngine, load_state_dict_from, validate_prompts
from rollout.kv_cache import preallocate
from rollout.prompt_batch import left_pad, prefill_groups
from rollout.sampling import row_keys, sample_tokens, uniforms

# Stopped rows leave the batch once they are this share of it. Each removal copies the whole KV cache of the rows
# kept: removing rows at every stop spent more in those copies than the stopped rows cost by staying a few steps
# (the tiny job's requests 0.86x the time at 0.25; docs/BENCHMARKS.md, `tools.rollout_profile --compact`).
COMPACT_FRACTION = 0.25


class TorchEngine(RolloutEngine):
    """Batched generation with the FBT model in this process (CPU or one GPU).

    model: an FBT model (rl/model/), used in place (load_weights writes into it).
    eos_token_ids: tokens that always end a sample besides `params.stop_token_ids`; None = the model's
        generation config / config `eos_token_id` (plus `tokenizer.eos_token_id` if a tokenizer is given);
        `()` = none (benchmarks that need fixed lengths).
    fusion_tables: precompute the token side of the fusion per weight version (module docstring).
    prefill_split_tokens: what one extra prefill call is worth in padding tokens (`prefill_groups`); None =
        estimated from the model size on CPU, never split on an accelerator (where padding is cheap and calls
        are not); 0 = one group per distinct prompt length.
    shared_kv_attention: switch an `sdpa` model with grouped-query heads to attention that reads the shared K/V
        heads without copying the cache per query head (rl/model/attention.py; the same numbers on CPU).
    """

    def __init__(
        self,
        model,
        version: int = 0,
        eos_token_ids=None,
        tokenizer=None,
        fusion_tables: bool = True,
        prefill_split_tokens: float | None = None,
        shared_kv_attention: bool = True,
    ):
        self.model = model
        if shared_kv_attention:
            use_shared_kv_attention(model)
        self.version = int(version)
        if eos_token_ids is None:
            eos_token_ids = self._config_eos(model)
            if tokenizer is not None and tokenizer.eos_token_id is not None:
                eos_token_ids.add(int(tokenizer.eos_token_id))
        elif isinstance(eos_token_ids, int):
            eos_token_ids = {eos_token_ids}
        self.eos_token_ids = tuple(sorted(int(t) for t in eos_token_ids))
        self.fusion_tables = fusion_tables
        self._tables = None  # (weights key, tables)
        self._continuations = None  # the current call's (generate)
        if prefill_split_tokens is None:
            # A CPU forward call reads every weight once (~16 tokens' worth of matmul time whatever the size:
            # memory bandwidth vs FLOP rate) and pays ~0.4 ms of dispatch per layer (~2e7 FLOPs at CPU matmul
            # speed); one prompt token costs 2 FLOPs per parameter. Measured: tiny ~50, 135M ~15-20 tokens.
            n_params = sum(p.numel() for p in model.parameters())
            prefill_split_tokens = (
                float("inf")
                if self.device.type != "cpu"
                else 16 + 2e7 * model.config.num_hidden_layers / (2 * n_params)
            )
        self.prefill_split_tokens = prefill_split_tokens

    @staticmethod
    def _config_eos(model) -> set[int]:
        ids = set()
        for cfg in (getattr(model, "generation_config", None), model.config):
            eos = getattr(cfg, "eos_token_id", None)
            if eos is not None:
                ids.update([eos] if isinstance(eos, int) else eos)
        return ids

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ---- weights -------------------------------------------------------------------------------------------
    def load_weights(self, weights, version: int) -> None:
        """Install a state dict, a `.safetensors` file or a save_pretrained directory as policy `version`.

        Names must be the model's; a missing name is allowed only for a tied weight (save_pretrained drops
        `lm_head.weight` when it is the embedding). Nothing is installed if the version is not newer.
        """
        self._check_new_version(version)
        state = weights if isinstance(weights, dict) else load_state_dict_from(weights)
        tied = (
            set(getattr(self.model, "_tied_weights_keys", None) or ())
            if self.model.config.tie_word_embeddings
            else set()
        )
        own = self.model.state_dict()
        missing, unexpected = set(own) - set(state) - tied, set(state) - set(own)
        if missing or unexpected:
            raise ValueError(
                f"load_weights: names do not fit the model: missing={sorted(missing)[:5]} "
                f"unexpected={sorted(unexpected)[:5]}"
            )
        with torch.no_grad():
            self.model.load_state_dict(state, strict=False)
        self._tables = None
        self.version = int(version)

    # ---- fusion --------------------------------------------------------------------------------------------
    def _token_tables(self) -> dict:
        """Token-side fusion terms for the whole vocabulary, cached per weight version (module docstring)."""
        model, fusion = self.model, self.model.fusion
        params = [model.get_input_embeddings().weight, *fusion.parameters()]
        key = tuple((p.data_ptr(), p._version, p.dtype) for p in params)
        if self._tables is not None and self._tables[0] == key:
            return self._tables[1]
        d = model.config.hidden_size
        with torch.inference_mode():
            e = model.embed(torch.arange(self.vocab_size, device=self.device))
            en = rms_normalize(e, fusion.eps)
            if fusion.mode == "gate_product":
                w_h, tok = fusion.w_u.weight, torch.sigmoid(fusion.w_g(en))
            elif fusion.mode == "linear_addition":
                w_h, tok = fusion.w_u.weight, fusion.w_t(en)
            else:  # concat_projection: W_C [RMS(h); RMS(e)] = W_C[:, :d] RMS(h) + W_C[:, d:] RMS(e)
                w_h, tok = fusion.w_c.weight[:, :d].contiguous(), F.linear(en, fusion.w_c.weight[:, d:])
            scale = rms_value(e, fusion.eps) if model.config.fbt_input_scale == "embedding_rms" else None
        tables = {"mode": fusion.mode, "w_h": w_h, "tok": tok, "scale": scale, "d": d, "eps": fusion.eps}
        self._tables = (key, tables)
        return tables

    @staticmethod
    def _fuse_with_tables(t: dict, h_prev: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        """`model.fuse(h_prev, embed(tok))` for [b, d] states and [b] tokens, from the token tables: [b, 1, d]."""
        hin = rms_normalize(h_prev, t["eps"]) if t["mode"] == "concat_projection" else h_prev
        a, tt = F.linear(hin, t["w_h"]), F.embedding(tok, t["tok"])
        z = a * tt if t["mode"] == "gate_product" else a + tt
        # F.rms_norm is one kernel and equals rms_normalize in fp32; lower precision keeps the model's fp32 path
        x = F.rms_norm(z, (t["d"],), eps=t["eps"]) if z.dtype == torch.float32 else rms_normalize(z, t["eps"])
        if t["scale"] is not None:
            x = x * F.embedding(tok, t["scale"])
        return x[:, None]

    def _next_input(self, tok, h_prev, tables, is_reset):
        """Layer-0 input [b, 1, d] of the sampled tokens: fused with h_prev except at document starts."""
        if tables is None:
            e = self.model.embed(tok[:, None])
            x = self.model.fuse(h_prev[:, None], e)
        else:
            x, e = self._fuse_with_tables(tables, h_prev, tok), None
        if is_reset is not None:
            reset = is_reset[tok]
            # The host check skips the select when no row holds a reset token; on an accelerator it would stall
            # the host every step (a device read), and the select is cheap.
            if tok.device.type != "cpu" or bool(reset.any()):
                e = self.model.embed(tok[:, None]) if e is None else e
                x = torch.where(reset[:, None, None], e, x)
        return x

    # ---- generation ----------------------------------------------------------------------------------------
    def _validate(self, prompts, params: SamplingParams) -> None:
        params.validate()
        validate_prompts(prompts, self.vocab_size)
        bad = [t for t in params.stop_token_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"SamplingParams.stop_token_ids: {bad[:3]} outside the vocabulary [0, {self.vocab_size})")
        limit = getattr(self.model.config, "max_position_embeddings", None)
        longest = max(len(p) for p in prompts)
        if limit is not None and longest + params.max_tokens > limit:
            raise ValueError(
                f"SamplingParams.max_tokens={params.max_tokens}: the longest prompt ({longest}) plus "
                f"max_tokens exceeds the model's max_position_embeddings ({limit})"
            )

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        min_version: int | None = None,
        continuations: list[Continuation | None] | None = None,
    ) -> list[Sample]:
        """n samples per prompt, flat, prompt-major (module docstring). A stop token ends its sample and is
        included in `response_ids` (finish_reason "stop"); otherwise the sample has max_tokens tokens ("length").
        `continuations`: prompts that resume earlier sequences, prefilled with their recorded states fused where
        the decode fused them (rl/samples/continuation.py)."""
        self.check_version(min_version)
        self._validate(prompts, params)
        check_continuations(prompts, continuations, self.model.config.hidden_size, params.decode_mode)
        self._continuations = continuations
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, ()).item())
        training = self.model.training  # the model may be shared with an in-process learner: restore its mode
        self.model.eval()
        try:
            with torch.inference_mode():
                tokens, logprobs, states, lengths, stopped = self._decode(prompts, params, seed)
        finally:
            self.model.train(training)
        # Outside inference mode: clones are ordinary tensors the learner may use under autograd, and each
        # sample owns its rows (a view would drag the whole batch's storage along when pickled).
        tokens, logprobs, lengths, stopped = tokens.tolist(), logprobs.tolist(), lengths.tolist(), stopped.tolist()
        samples = []
        for b, R in enumerate(lengths):
            i, k = divmod(b, params.n)
            samples.append(
                Sample(
                    prompt_ids=list(prompts[i]),
                    response_ids=tokens[b][:R],
                    logprobs=logprobs[b][:R],
                    finish_reason="stop" if stopped[b] else "length",
                    policy_version=self.version,
                    states=None if states is None else state_formats.encode(states[b, :R], params.states_dtype).clone(),
                    group_id=i,
                    sample_index=k,
                    decode_mode=params.decode_mode,
                )
            )
        return samples

    def _step_mask(self, mask2d: torch.Tensor):
        """The decode-time mask over [prompt + all new tokens], in the form the attention implementation takes
        as-is (sliced per step): None without padding, 4D bool (sdpa) / additive (eager), else the 2D mask."""
        if bool(mask2d.all()):
            return None
        impl = getattr(self.model.config, "_attn_implementation", None)
        if impl in ("sdpa", SHARED_KV_SDPA):
            return mask2d.bool()[:, None, None, :]
        if impl == "eager":
            dtype = next(self.model.parameters()).dtype
            add = torch.zeros(mask2d.shape, dtype=dtype, device=mask2d.device)
            return add.masked_fill(~mask2d.bool(), torch.finfo(dtype).min)[:, None, None, :]
        return mask2d

    def _prefill(self, prompts, mode: str):
        """Prefill prompts in groups of similar length (`prefill_groups`) and merge them into one left-padded
        batch: returns (h_last [B, d], cache, mask [B, P]). K/V of a prompt do not depend on how much padding
        sits left of it (masked, positions from the mask), so the merged cache is the one-batch prefill's
        without the compute spent on padding."""
        model, dev = self.model, self.device
        pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
        groups = (
            prefill_groups([len(p) for p in prompts], self.prefill_split_tokens)
            if self.prefill_split_tokens != float("inf")
            else [list(range(len(prompts)))]
        )
        if len(groups) == 1:
            ids, mask = left_pad(prompts, pad_id, dev)
            h, cache = model.prefill(ids, mask, mode=mode, **self._replayed(range(len(prompts)), ids.shape[1]))
            return h[:, -1], cache, mask  # left padding: every row's last prompt state is in the last column
        P = max(len(p) for p in prompts)
        mask = left_pad(prompts, pad_id, dev)[1]
        h_last, kv = None, None
        for rows in groups:
            ids_g, mask_g = left_pad([prompts[i] for i in rows], pad_id, dev)
            h_g, cache_g = model.prefill(ids_g, mask_g, mode=mode, **self._replayed(rows, ids_g.shape[1]))
            idx, Pg = torch.tensor(rows, device=dev), ids_g.shape[1]
            if h_last is None:
                h_last = h_g.new_zeros(len(prompts), h_g.shape[-1])
                kv = [
                    (
                        lay.keys.new_zeros(len(prompts), *lay.keys.shape[1:2], P, lay.keys.shape[-1]),
                        lay.values.new_zeros(len(prompts), *lay.values.shape[1:2], P, lay.values.shape[-1]),
                    )
                    for lay in cache_g.layers
                ]
            h_last[idx] = h_g[:, -1]
            for (k, v), lay in zip(kv, cache_g.layers):
                k[idx, :, P - Pg :], v[idx, :, P - Pg :] = lay.keys, lay.values
        return h_last, DynamicCache(ddp_cache_data=kv, config=model.config), mask

    def _replayed(self, rows, P: int) -> dict:
        """The replay prefill's inputs for prompts `rows` left-padded to P: `carried` [b, P, d] and `carried_mask`
        [b, P] from their continuations (none: an ordinary prefill)."""
        conts = self._continuations
        if conts is None or not any(conts[i] is not None and bool(conts[i].fed.any()) for i in rows):
            return {}
        d, dev = self.model.config.hidden_size, self.device
        dtype = self.model.get_input_embeddings().weight.dtype
        carried = torch.zeros(len(rows), P, d, dtype=dtype)
        fed = torch.zeros(len(rows), P, dtype=torch.bool)
        for b, i in enumerate(rows):
            c = conts[i]
            if c is not None:
                carried[b, P - len(c) :], fed[b, P - len(c) :] = c.states.to(dtype), c.fed
        return {"carried": carried.to(dev), "carried_mask": fed.to(dev)}

    def _decode(self, prompts, params: SamplingParams, seed: int):
        """The batched loop. Returns per row (prompt-major, then sample), on CPU: tokens [B, T], log-probs
        [B, T], states [B, T, d] or None, lengths [B], stopped [B]."""
        model, dev, n, T, V = self.model, self.device, params.n, params.max_tokens, self.vocab_size
        h_prev, cache, mask = self._prefill(prompts, params.decode_mode)
        P0 = mask.shape[1]
        B = len(prompts) * n
        cache = preallocate(cache, P0 + T, repeats=n)
        if n > 1:
            h_prev, mask = h_prev.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
        pos = mask.sum(1, keepdim=True)  # position of the first new token = the row's prompt length
        attn = self._step_mask(torch.cat([mask, mask.new_ones(B, T)], dim=1))
        rows = torch.arange(B, device=dev)
        keys = None if params.temperature == 0 else row_keys(seed, rows // n, rows % n).to(dev)
        stop_ids = sorted(set(params.stop_token_ids) | set(self.eos_token_ids))
        is_stop = None
        if stop_ids:
            is_stop = torch.zeros(V, dtype=torch.bool, device=dev)
            is_stop[stop_ids] = True
        tables = is_reset = None
        feedback = params.decode_mode != "standard"
        if feedback:
            tables = self._token_tables() if self.fusion_tables else None
            resets = [t for t in model.reset_token_ids if 0 <= t < V]
            if resets:
                is_reset = torch.zeros(V, dtype=torch.bool, device=dev)
                is_reset[resets] = True

        out_tok = torch.zeros(B, T, dtype=torch.long, device=dev)
        out_lp = torch.zeros(B, T, dtype=torch.float32, device=dev)
        sdtype = torch.bfloat16 if params.states_dtype == "bfloat16" else torch.float32  # fp8: encoded per sample
        out_states = torch.zeros(B, T, h_prev.shape[-1], dtype=sdtype, device=dev) if params.record_states else None
        lengths = torch.full((B,), T, dtype=torch.long, device=dev)
        stopped = torch.zeros(B, dtype=torch.bool, device=dev)
        active = rows  # original row of each batch row
        all_active = True  # while no row left the batch, whole-column writes replace index writes
        running = None  # batch rows not stopped yet (None: all); stopped rows stay until enough have stopped
        for step in range(T):
            logits = model.logits_from_hidden(h_prev)
            tok, lp = sample_tokens(logits, params, None if keys is None else uniforms(keys, step))
            at = slice(None) if all_active else active
            # a stopped row still in the batch writes past its length: never read (samples keep [:length])
            out_tok[at, step], out_lp[at, step] = tok, lp
            if out_states is not None:
                out_states[at, step] = h_prev.to(sdtype)
            if is_stop is not None:
                done = is_stop[tok] if running is None else is_stop[tok] & running
                if bool(done.any()):
                    lengths[active[done]], stopped[active[done]] = step + 1, True
                    running = ~done if running is None else running & ~done
                    left = int(running.sum())
                    if left == 0 or step == T - 1:
                        break
                    if len(running) - left >= COMPACT_FRACTION * len(running):
                        # early exit: stopped rows leave the batch (cache, mask, positions, state, sampler keys)
                        keep = running.nonzero()[:, 0]
                        cache.batch_select_indices(keep)
                        active, tok, h_prev, pos = active[keep], tok[keep], h_prev[keep], pos[keep]
                        attn = attn[keep] if attn is not None else None
                        keys = keys[keep] if keys is not None else None
                        all_active, running = False, None
            if step == T - 1:
                break
            x = self._next_input(tok, h_prev, tables, is_reset) if feedback else model.embed(tok[:, None])
            am = attn[..., : P0 + step + 1] if attn is not None else None
            h, cache = model.run_stack(x, am, pos, cache, use_cache=True)
            h_prev, pos = h[:, 0], pos + 1
        cpu = lambda t: None if t is None else t.cpu()
        return cpu(out_tok), cpu(out_lp), cpu(out_states), cpu(lengths), cpu(stopped)
