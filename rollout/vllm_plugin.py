"""vLLM model plugin: FBT (latent-feedback) Llama / Qwen2 / Qwen3 / Mistral decoding inside stock vLLM
(docs/DESIGN.md §8).

`register()` is the `vllm.general_plugins` entry point (pyproject.toml). vLLM calls general plugins in
`EngineArgs.__post_init__`, before it parses the checkpoint's config, and again in every worker process; this
module imports `rl.model`, which lets `AutoConfig` resolve `model_type: fbt_<backbone>`, and the `architectures`
entry of our checkpoints (`rl.model.FBT_ARCHITECTURES`, e.g. `FBTQwen3ForCausalLM`) selects the classes below.

How the recurrence lives in vLLM: the model subclasses the in-tree backbone and declares itself hybrid with inner
state (`IsHybrid`, `HasInnerState`). One extra mamba-style state layer (`LatentStateLayer`, rollout/vllm_state_slot.py) owns a per-request
slot of shape `(d,)` that vLLM allocates, frees and indexes for us; it holds `h_prev`, the final-normalized top
state of the request's last computed position. Each forward:

- decode tokens (vLLM puts them first) read `h_prev` from their slot and are fused: `x = F(h_prev, e)`;
- prefill tokens are a fresh prompt (prefix caching and chunked prefill are forced off by the engine). `soft`
  and `standard` prompts run one ordinary pass; `fused` prompts run `fbt_prefill_passes` passes, pass k fusing
  pass k-1's states shifted one position right, and the last pass's KV is what stays in the cache;
- a replay prefill: prefill positions whose token the policy generated earlier fuse the state recorded for it,
  as the decode did — a continuation's (the engine puts its states in `fbt_replay` per sample key), or, when
  vLLM re-prefills a request it preempted, the request's own generated tokens (rows of `fbt_records`);
- the new state of every request is written back to its slot, and (when asked) recorded for the learner.

The decode mode is per request: `SamplingParams.extra_args["fbt"] = {"key", "mode", "record"}`, read from the
model runner's request table, which the worker extension attaches (`rollout.vllm_worker_ext`). That table, and
the token offsets and positions read beside it, are the V1 model runner's host-side arrays: the engine forces the
V1 runner (vLLM 0.32 defaults to V2 on CUDA; `rollout.vllm_env.engine_environment` says why). A model used
without our worker extension (plain `vllm serve`) decodes every request in the engine-wide mode
`hf_config.fbt_decode_mode` (set it with `hf_overrides`; default `soft`) and records nothing.

Fusion, its scaling and the reset-token rule are `rl.model`'s own code (`Fusion`, `FBTMixin.fuse`), so the
engine computes exactly what the torch engine and the learner compute.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rl.decode_modes import DECODE_MODES
from rl.model import FBT_ARCHITECTURES, FBTMixin, Fusion, rms_normalize, rms_value
from rollout.vllm_records import ReplayTable, RequestInfo, StateRecords, StepBatch, to_device
from rollout.vllm_state_slot import FBTConfigHook, LatentStateLayer, keep_state_cache_mode_none


def register() -> None:
    """vLLM general-plugin entry point: make our config types and architectures known to vLLM."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    for arch in FBT_ARCHITECTURES:
        if arch not in ModelRegistry.get_supported_archs():
            # A lazy "module:Class" string: the class is imported in the worker when the model is built.
            ModelRegistry.register_model(arch, f"rollout.vllm_plugin:{arch}")
        MODELS_CONFIG_MAP.setdefault(arch, FBTConfigHook)
    keep_state_cache_mode_none()


# The imports below need vLLM; `register()` above is what the entry point calls first.
from vllm.config import VllmConfig  # noqa: E402
from vllm.forward_context import get_forward_context  # noqa: E402
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid  # noqa: E402
from vllm.model_executor.models.llama import LlamaForCausalLM  # noqa: E402
from vllm.model_executor.models.mistral import MistralForCausalLM  # noqa: E402
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM  # noqa: E402
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM  # noqa: E402


class FBTVLLMMixin:
    """Latent feedback on a vLLM in-tree causal LM whose `.model(None, positions, None, inputs_embeds)` returns
    the final-normalized top states."""

    # rl.model's own definitions, bound to this class: same fusion, same scale, same reset rule.
    fuse = FBTMixin.fuse
    reset_token_ids = FBTMixin.reset_token_ids

    def _init_fbt(self, vllm_config: VllmConfig) -> None:
        cfg = vllm_config.model_config.hf_config
        if vllm_config.parallel_config.pipeline_parallel_size > 1:
            raise ValueError(
                "FBT models do not support pipeline parallelism (the fused input needs the top-layer state at layer 0)"
            )
        self.fusion = Fusion(cfg.hidden_size, cfg.fbt_fusion_mode, getattr(cfg, "fbt_rms_eps", 1e-6))
        self.fbt_passes = int(cfg.fbt_prefill_passes)
        if self.fbt_passes < 1:
            raise ValueError(f"fbt_prefill_passes must be >= 1, got {self.fbt_passes}")
        self.fbt_default_mode = getattr(cfg, "fbt_decode_mode", "soft")
        if self.fbt_default_mode not in DECODE_MODES:
            raise ValueError(f"fbt_decode_mode: expected one of {DECODE_MODES}, got {self.fbt_default_mode!r}")
        n, dtype = cfg.num_hidden_layers, vllm_config.model_config.dtype
        self.fbt_state = LatentStateLayer(cfg.hidden_size, dtype, f"model.layers.{n}.fbt_state")
        # vLLM groups a hybrid model's layers into KV-cache groups of min(#layers per type) layers: with one state
        # layer, each of the n attention layers would get its own group, and the scheduler's per-request block
        # bookkeeping, run per group every step, cost ~5% of decode time (135M, CPU). n - 1 unused state layers
        # make it two groups; the price is one attention block's worth of memory per request.
        self.fbt_state_padding = nn.ModuleList(
            LatentStateLayer(cfg.hidden_size, dtype, f"model.layers.{n + i}.fbt_state") for i in range(1, n)
        )
        is_reset = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        is_reset[[t for t in self.reset_token_ids if 0 <= t < cfg.vocab_size]] = True
        # A plain attribute, not a buffer: vLLM's in-place weight reload warns "Failed to load weights" for any
        # module owning a tensor the checkpoint lacks. Built under vLLM's target-device context, so it is already
        # on the model's device.
        self.fbt_is_reset = is_reset
        self.fbt_use_tables = bool(getattr(cfg, "fbt_fusion_tables", True))
        self._fbt_tables = None  # token-side fusion terms of the current weights (built on first use)
        self.fbt_version = 0  # policy version of the loaded weights (set by the worker extension)
        self.fbt_records = StateRecords()
        self.fbt_replay = ReplayTable()  # continuations' states, put by the worker extension
        self._fbt_runner = None  # the model runner, attached by the worker extension (per-request info)
        self._fbt_req_cache: dict[str, RequestInfo] = {}
        self._fbt_slot_owner: dict[str, object] = {}  # request id -> the block list its slot was last written under

    # ---- hybrid-model interface: one (d,) state per request ------------------------------------------
    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig):
        return ((vllm_config.model_config.hf_config.hidden_size,),)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig):
        return (vllm_config.model_config.dtype,)

    @classmethod
    def get_mamba_state_copy_func(cls):
        return ()  # no prefix caching of states (the engine forces prefix caching off)

    # ---- per-request information -------------------------------------------------------------------------
    def fbt_attach_runner(self, runner) -> None:
        self._fbt_runner = runner
        self._fbt_req_cache.clear()
        self._fbt_slot_owner.clear()

    def _batch(self, num_reqs: int) -> StepBatch | None:
        """This forward's requests from the V1 model runner's host-side tables (None without the worker extension,
        or in a dummy run whose batch holds no requests)."""
        runner = self._fbt_runner
        if runner is None:
            return None
        req_ids = runner.input_batch.req_ids[:num_reqs]
        if len(req_ids) < num_reqs:
            return None
        infos, live = [], []
        for rid in req_ids:
            info = self._fbt_req_cache.get(rid)
            if info is None:
                state = runner.requests[rid]
                extra = ((state.sampling_params.extra_args or {}).get("fbt") or {}) if state.sampling_params else {}
                mode = extra.get("mode", self.fbt_default_mode)
                if mode not in DECODE_MODES:
                    raise ValueError(f"request {rid}: decode mode {mode!r} not in {DECODE_MODES}")
                info = RequestInfo(extra.get("key"), mode, bool(extra.get("record", False)), state.num_prompt_tokens)
                self._fbt_req_cache[rid] = info
            infos.append(info)
            # The slot holds this request's h_prev only if a forward since its blocks were (re)assigned wrote it:
            # a request vLLM preempted and resumed gets a new block list, and a new slot.
            blocks = runner.requests[rid].block_ids
            live.append(self._fbt_slot_owner.get(rid) is blocks)
            self._fbt_slot_owner[rid] = blocks  # this forward writes it
        if len(self._fbt_req_cache) > 4 * max(num_reqs, 64):  # drop finished requests now and then
            alive = set(runner.requests)
            self._fbt_req_cache = {r: i for r, i in self._fbt_req_cache.items() if r in alive}
            self._fbt_slot_owner = {r: b for r, b in self._fbt_slot_owner.items() if r in alive}
        # Filled by the runner before every forward (_prepare_inputs); host arrays, no device read.
        bounds = runner.query_start_loc.np[: num_reqs + 1].tolist()
        computed = runner.input_batch.num_computed_tokens_cpu[:num_reqs].tolist()
        return StepBatch(infos, bounds, computed, live)

    # ---- fusion from token tables ------------------------------------------------------------------------
    # Every fusion mode is a d×d matmul of the state plus a term that depends on the token alone (gate_product:
    # σ(W_G RMS(e)); linear_addition: W_T RMS(e); concat_projection: W_C[:, d:] RMS(e)), and the scale is the
    # token's embedding RMS. Those token terms are computed once per weight version for the whole vocabulary
    # (as the torch engine does), so a fused token costs one d×d matmul instead of two. Costs V×d numbers of
    # memory and V×d² FLOPs per weight version; `hf_overrides={"fbt_fusion_tables": False}` turns it off.
    def fbt_weights_changed(self) -> None:
        """Called by the worker extension after every weight load (in-place loads keep tensor identities)."""
        self._fbt_tables = None

    def _token_tables(self):
        if self._fbt_tables is None:
            cfg, fusion = self.config, self.fusion
            d = cfg.hidden_size
            with torch.no_grad():
                e = self.model.embed_input_ids(torch.arange(cfg.vocab_size, device=self.fbt_is_reset.device))
                en = rms_normalize(e, fusion.eps)
                if fusion.mode == "gate_product":
                    w_h, tok = fusion.w_u.weight, torch.sigmoid(fusion.w_g(en))
                elif fusion.mode == "linear_addition":
                    w_h, tok = fusion.w_u.weight, fusion.w_t(en)
                else:  # W_C [RMS(h); RMS(e)] = W_C[:, :d] RMS(h) + W_C[:, d:] RMS(e)
                    w_h, tok = fusion.w_c.weight[:, :d].contiguous(), F.linear(en, fusion.w_c.weight[:, d:])
                scale = rms_value(e, fusion.eps) if cfg.fbt_input_scale == "embedding_rms" else None
            self._fbt_tables = (w_h, tok, scale)
        return self._fbt_tables

    def _fuse_tokens(self, h: torch.Tensor, ids: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """`fuse(h, e)` for states [n, d] and their tokens [n] (embeddings e [n, d])."""
        if not self.fbt_use_tables:
            return self.fuse(h, e)
        w_h, tok, scale = self._token_tables()
        h = h.to(e.dtype)
        eps = self.fusion.eps
        a = F.linear(rms_normalize(h, eps) if self.fusion.mode == "concat_projection" else h, w_h)
        z = a * tok[ids] if self.fusion.mode == "gate_product" else a + tok[ids]
        # one fused kernel, equal to rms_normalize in fp32; lower precision keeps rl.model's fp32 path
        x = F.rms_norm(z, (z.shape[-1],), eps=eps) if z.dtype == torch.float32 else rms_normalize(z, eps)
        return x * scale[ids] if scale is not None else x

    # ---- forward -----------------------------------------------------------------------------------------
    # Host syncs: the per-request facts (mode, key, prompt length, token offsets, positions) come from the model
    # runner's host tables (`_batch`), so a decode step reads nothing back from the device; host-built index
    # tensors (mixed modes, a fused prompt's positions, a partial record set) go up through `to_device`. Only a
    # model used without our worker extension reads prefill offsets back from the device (one sync per prefill).
    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        e = inputs_embeds if inputs_embeds is not None else self.model.embed_input_ids(input_ids)
        md = get_forward_context().attn_metadata
        md = md.get(self.fbt_state.prefix) if isinstance(md, dict) else None
        if md is None:  # profiling / warm-up run: no requests, no slots
            return self.model(None, positions, None, e)

        state = self.fbt_state.kv_cache[0]
        nd, ndec, npf = md.num_decode_tokens, md.num_decodes, md.num_prefills
        batch = self._batch(md.num_reqs)
        modes = [i.mode for i in batch.infos] if batch is not None else [self.fbt_default_mode] * md.num_reqs

        # Decode tokens: fused with their request's h_prev (constant over prefill passes). Reset tokens and
        # position 0 keep the plain input.
        x = e
        fed_idx, fed_states = [], []
        if nd:
            idx_d = md.state_indices_tensor_d[:nd, 0].long()
            fb_d = self._fed_by_slot(batch, modes, ndec, fed_idx, fed_states)
            if any(fb_d):
                ids_d = input_ids[:nd]
                mask_d = ~self.fbt_is_reset[ids_d] & (positions[:nd] > 0)
                if not all(fb_d):  # modes mixed in one batch (one generate() call uses one mode)
                    mask_d &= to_device(fb_d, torch.bool, e.device)
                x_d = torch.where(mask_d[:, None], self._fuse_tokens(state[idx_d], ids_d, e[:nd]), e[:nd])
                x = x_d if nd == e.shape[0] else torch.cat([x_d, e[nd:]])

        # Prefill tokens: a prompt each (chunked prefill is off), from its first uncomputed position. Positions
        # whose token the policy generated earlier (a continuation's, or a preempted request's own on its
        # re-prefill) fuse the state recorded for them: the replay prefill.
        passes, pf_idx, last = 1, None, None
        if npf:
            last = md.query_start_loc_p[1:].long() + (nd - 1)  # each prefill's last token
            bounds = (
                batch.bounds if batch is not None else list(range(nd)) + (md.query_start_loc_p + nd).tolist()
            )  # without the extension: a device read
            fused_ranges = []
            for r in range(ndec, ndec + npf):
                a, b = bounds[r], bounds[r + 1]
                info = batch.infos[r] if batch is not None else None
                start = batch.computed[r] if batch is not None else 0
                prompt_end = b - a
                if info is not None and info.key is not None:
                    prompt_end = min(b - a, info.prompt_len - start)
                    for pos, st in self._replayed(info, start, start + b - a):
                        fed_idx.append(pos - start + a)
                        fed_states.append(st)
                if modes[r] == "fused" and prompt_end > 1:
                    if 0 < start < info.prompt_len:
                        raise RuntimeError(
                            f"request {info.key}: fused prompt prefilled from position {start} (a prefix-cache "
                            f"hit): its passes need the whole prompt; fused requests need a cache salt of their own"
                        )
                    fused_ranges.append(np.arange(a + 1, a + prompt_end))
            if fused_ranges and self.fbt_passes > 1:
                passes = self.fbt_passes
                pf_idx = to_device(np.concatenate(fused_ranges), torch.long, e.device)
                pf_ids = input_ids[pf_idx]
                pf_mask = ~self.fbt_is_reset[pf_ids][:, None]  # pf_idx holds no first prompt position

        if fed_idx:
            x = self._fuse_replayed(x, e, input_ids, torch.cat(fed_idx), torch.cat(fed_states))
        hidden = self.model(None, positions, None, x)
        for _ in range(passes - 1):
            # Pass k: prompt position t >= 1 fuses pass k-1's state at t-1 (same request: t is not its first).
            xk = x.clone()
            xk[pf_idx] = torch.where(pf_mask, self._fuse_tokens(hidden[pf_idx - 1], pf_ids, e[pf_idx]), e[pf_idx])
            hidden = self.model(None, positions, None, xk)

        # Write back h_prev and record.
        if nd:
            state[idx_d] = hidden[:nd].to(state.dtype)
        if npf:
            state[md.state_indices_tensor_p.long()] = hidden[last].to(state.dtype)
        if batch is not None:
            self._record(batch, ndec, hidden, last)
        return hidden

    def _fed_by_slot(self, batch: StepBatch | None, modes, ndec: int, fed_idx: list, fed_states: list) -> list[bool]:
        """Per decode-scheduled request: whether its token fuses `h_prev` from the slot. vLLM schedules any one-token
        step as a decode, also the last prompt token left after a prefix-cache hit, or the last token of a
        preempted request's re-prefill: those are decided by position, as in a prefill (a prompt token is plain
        unless a continuation feeds it; a generated one fuses its recorded state, appended to `fed_idx` /
        `fed_states`). A slot is trusted only if this request's earlier forward wrote it (`StepBatch.slot_live`)."""
        if batch is None:
            return [m != "standard" for m in modes[:ndec]]
        out = []
        for r in range(ndec):
            info, pos = batch.infos[r], batch.computed[r]
            by_slot = modes[r] != "standard" and pos >= info.prompt_len and batch.slot_live[r]
            if not by_slot and info.key is not None and modes[r] != "standard":
                for positions, states in self._replayed(info, pos, pos + 1):
                    fed_idx.append(positions - pos + r)
                    fed_states.append(states)
            out.append(by_slot)
        return out

    def _replayed(self, info: RequestInfo, start: int, end: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(positions [k], states [k, d]) to fuse in a prefill of positions [start, end): the continuation's fed
        positions (position 0 never), and, when the prefill re-reads generated tokens (vLLM preempted the request
        and now recomputes it), each generated position t with the state recorded for it, row t - prompt_len.
        Without those rows (not recorded) the request is flagged preempted."""
        out = []
        given = self.fbt_replay.within(info.key, max(start, 1), min(end, info.prompt_len))
        if given is not None:
            out.append(given)
        if end > info.prompt_len and info.mode != "standard":
            first = max(start, info.prompt_len)
            rows = self.fbt_records.first_rows(info.key, end - info.prompt_len)
            if rows is None:
                self.fbt_records.preempted.add(info.key)  # the latent state is lost: never train on it
            else:
                out.append((torch.arange(first, end), rows[first - info.prompt_len :]))
                self.fbt_records.resumed.add(info.key)
        return out

    def _fuse_replayed(self, x, e, input_ids, idx: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """x with the tokens at flat indices `idx` fused with `states` (reset tokens keep the plain input)."""
        idx = to_device(idx, torch.long, e.device)
        ids = input_ids[idx]
        fused = torch.where(~self.fbt_is_reset[ids][:, None], self._fuse_tokens(states, ids, e[idx]), e[idx])
        return x.index_put((idx,), fused.to(x.dtype))

    def _record(self, batch: StepBatch, ndec: int, hidden, last) -> None:
        """Row j of a sample is the state that predicted its response token j: row = position - (P - 1), taken
        at the request's last computed position (decode i is token i; prefill j ends at last[j])."""
        sel = [i for i, info in enumerate(batch.infos) if info.record and info.key is not None]
        if not sel:
            return
        if last is None and len(sel) == ndec:  # the common decode step: every request records
            states = hidden[:ndec]
        else:
            ends = torch.arange(ndec, device=hidden.device)
            if last is not None:
                ends = torch.cat([ends, last])
            states = hidden[ends if len(sel) == len(ends) else ends[to_device(sel, torch.long, hidden.device)]]
        rows = torch.tensor([batch.last_position(i) - (batch.infos[i].prompt_len - 1) for i in sel])
        self.fbt_records.add([batch.infos[i].key for i in sel], rows, states)


class FBTLlamaForCausalLM(FBTVLLMMixin, LlamaForCausalLM, HasInnerState, IsHybrid):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", **kwargs):
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        self._init_fbt(vllm_config)


class FBTQwen2ForCausalLM(FBTVLLMMixin, Qwen2ForCausalLM, HasInnerState, IsHybrid):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", **kwargs):
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        self._init_fbt(vllm_config)


class FBTQwen3ForCausalLM(FBTVLLMMixin, Qwen3ForCausalLM, HasInnerState, IsHybrid):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", **kwargs):
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        self._init_fbt(vllm_config)


class FBTMistralForCausalLM(FBTVLLMMixin, MistralForCausalLM, HasInnerState, IsHybrid):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", **kwargs):
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        self._init_fbt(vllm_config)
