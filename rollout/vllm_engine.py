"""`VLLMEngine`: the rollout engine on vLLM, decoding FBT checkpoints with latent feedback (docs/DESIGN.md §8).

Token ids in, `rl.samples.batch.Sample`s out, like every `RolloutEngine`. The model side is `rollout.vllm_plugin` (per-request
`h_prev` slot, soft / fused / standard per request), the worker side `rollout.vllm_worker_ext` (weights in through
files; recorded states out as the tensor when the worker shares this process, else through a scratch file that is
deleted as soon as it is read; never bulk tensors through RPC between processes).

- Decode mode: per request. Every sample carries `SamplingParams.decode_mode` to the model in vLLM's
  `extra_args`; the constructor's `decode_mode` is only the engine-wide default written into the model config
  (`fbt_decode_mode`), which applies to requests that do not come through this class.
- Log-probs: vLLM runs with `logprobs_mode="processed_logprobs"`: log_softmax of the logits after temperature
  and top-k / top-p masking, i.e. log π_b of the sampled token, the truncated renormalised distribution sampled
  from — our contract (rl/samples/logprob_contract.py; T = 0: log_softmax(logits)), which the torch engine and the
  learner's estimators follow too (tests/test_logprob_contract.py).
- Samples are matched to their recorded states by a per-sample key (not vLLM's request id, which vLLM suffixes
  internally). The KV cache is sized at construction so the configured concurrency does not preempt; if vLLM
  preempts a request anyway, its re-prefill fuses the states recorded for its generated tokens (the replay
  prefill of continuations, below) and the sample stays exact; without those states (`resume_preempted=False`)
  it is returned with `preempted=True` and no states.
- Continuations (multi-turn, rl/samples/continuation.py): `generate(..., continuations=)` hands each prompt's
  recorded states to the model per sample key (the tensors themselves in-process, a scratch file otherwise); the
  prefill fuses them at the positions the continuation marks.
- Weights: `load_weights(path_or_state_dict, version)` goes through a safetensors file (/dev/shm when there is
  one); on GPU, vLLM's native weight transfer (NCCL / IPC) is driven through the four methods of vLLM's
  `VLLMWeightSyncClient` protocol below; the engine refuses to generate until the new weights carry a version.
- Environment (`engine_environment`, set before vLLM starts): the V1 model runner always (the plugin reads its
  request table; vLLM 0.32 would pick V2 on CUDA), pickled IPC handles through `collective_rpc` for the native IPC
  transfer, true-fp32 Triton attention for fp32 engines on GPU. docs/GPU.md has the reasons.
"""

from __future__ import annotations

import itertools
import logging
import os
import uuid
from collections.abc import Mapping

import torch
from safetensors.torch import load_file, save_file

from rl.decode_modes import DECODE_MODES
from rl.model import FBT_ARCHITECTURES
from rl.samples.batch import Sample
from rl.samples.continuation import Continuation, check_continuations
from rl.samples.request import SamplingParams
from rollout.engine import RolloutEngine, StaleWeightsError, validate_prompts
from rollout.vllm_env import (
    apply_environment,
    engine_environment,
    engine_options,
    scratch_dir,
    sweep_scratch,
    use_eager_token_ranks,
)
from rollout.vllm_requests import cache_salts, output_sample, request_params

logger = logging.getLogger(__name__)


class VLLMEngine(RolloutEngine):
    """A vLLM `LLM` serving one FBT checkpoint, versioned.

    checkpoint_dir: a save_pretrained FBT directory (`architectures: [FBTLlamaForCausalLM]` or Qwen2).
    decode_mode: engine-wide default for requests that carry none (ours always carry theirs).
    max_model_len / max_num_seqs: per-sequence length and concurrency. The KV cache is `kv_cache_gib` when given,
        else on CPU the size `max_num_seqs` sequences of `max_model_len` tokens need (with head-room), on GPU what
        `gpu_memory_utilization` leaves; either way construction fails if it could not hold them all (preemption).
    num_gpu_blocks_override: tests only — forces a tiny KV cache and skips that check, so preemption happens.
    resume_preempted: record every feedback-mode sample's states (also when `record_states` is off: R x d
        numbers per sample, held until the call returns), so that a request vLLM preempts is re-prefilled with
        them fused and stays exact; False: such a sample comes back flagged `preempted` (no states).
    weight_transfer_backend: GPU only — "nccl" / "ipc" enables vLLM's native weight transfer.
    eos_token_ids: tokens that always end a sample besides `params.stop_token_ids` (as in TorchEngine): None =
        the checkpoint's generation config / config `eos_token_id`; `()` = none.
    engine_kwargs: more `vllm.LLM` options; one that contradicts `FORCED_OPTIONS` is a ValueError naming it.
    """

    def __init__(
        self,
        checkpoint_dir: str,
        decode_mode: str = "soft",
        version: int = 0,
        max_model_len: int = 1024,
        max_num_seqs: int = 64,
        kv_cache_gib: float | None = None,
        seed: int = 0,
        dtype: str = "auto",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.5,
        weight_transfer_backend: str | None = None,
        num_gpu_blocks_override: int | None = None,
        eos_token_ids=None,
        resume_preempted: bool = True,
        **engine_kwargs,
    ):
        if decode_mode not in DECODE_MODES:
            raise ValueError(f"decode_mode: expected one of {DECODE_MODES}, got {decode_mode!r}")
        from vllm.platforms import current_platform

        self.on_cpu = current_platform.is_cpu()
        for path in sweep_scratch():  # the copies of engines killed on this node
            logger.info("deleted %s, left by an engine process that is gone", path)
        apply_environment(*engine_environment(self.on_cpu, dtype, weight_transfer_backend))
        if self.on_cpu:
            use_eager_token_ranks()
        from rl.model.files import load_fbt_config
        from rollout.vllm_plugin import register

        register()  # the entry point does this too; in-process engines then work without the package installed

        self.config = load_fbt_config(checkpoint_dir)
        arch = (self.config.architectures or [""])[0]
        if arch not in FBT_ARCHITECTURES:
            raise ValueError(
                f"{checkpoint_dir}: architectures[0] is {arch!r}, not an FBT model "
                f"(convert it with rl.model.convert_to_fbt)"
            )
        self.checkpoint_dir, self.version, self.max_model_len = checkpoint_dir, int(version), max_model_len
        self.max_num_seqs = max_num_seqs
        self.resume_preempted = bool(resume_preempted)
        self.vocab_size = self.config.vocab_size
        if eos_token_ids is None:
            eos_token_ids = self._config_eos(checkpoint_dir)
        elif isinstance(eos_token_ids, int):
            eos_token_ids = {eos_token_ids}
        self.eos_token_ids = tuple(sorted(int(t) for t in eos_token_ids))
        kwargs = engine_options(
            self.config,
            self.on_cpu,
            engine_kwargs,
            decode_mode,
            max_model_len,
            max_num_seqs,
            kv_cache_gib,
            seed,
            dtype,
            tensor_parallel_size,
            gpu_memory_utilization,
            weight_transfer_backend,
            num_gpu_blocks_override,
        )
        from vllm import LLM

        set_num_threads = torch.set_num_threads
        try:
            self.llm = LLM(model=checkpoint_dir, **kwargs)
        finally:
            # vLLM's CPU worker replaces torch.set_num_threads by a no-op for the whole process (it guards thread
            # binding, which only its multiprocess executor does); in-process that would silently break every
            # later caller (tests, benchmarks), so put it back.
            torch.set_num_threads = set_num_threads
        self.info = self._rpc("fbt_attach")
        self.hidden_size = self.info["hidden_size"]
        # The in-process executor runs the worker here: its RPC results are our own objects, states need no file.
        self.inline_states = self.info.get("pid") == os.getpid()
        if version:
            self._rpc("fbt_set_version", int(version))
        if num_gpu_blocks_override is None:
            self._check_no_preemption()
        self._uid = uuid.uuid4().hex[:8]
        self._calls = itertools.count()
        self._weights_invalid = False
        self.resumed_samples = 0  # samples vLLM preempted and recomputed with their recorded states (exact)

    # ---- construction helpers ----------------------------------------------------------------------------
    def _config_eos(self, checkpoint_dir) -> set[int]:
        from transformers import GenerationConfig

        ids = set()
        try:
            gen = GenerationConfig.from_pretrained(checkpoint_dir)
        except OSError:  # no generation_config.json
            gen = None
        for cfg in (gen, self.config):
            eos = getattr(cfg, "eos_token_id", None)
            if eos is not None:
                ids.update([eos] if isinstance(eos, int) else eos)
        return ids

    def _check_no_preemption(self) -> None:
        cc = self.llm.llm_engine.vllm_config.cache_config
        conc = getattr(cc, "kv_cache_max_concurrency", None)
        if conc is not None and conc < self.max_num_seqs:
            raise ValueError(
                f"VLLMEngine: the KV cache holds {conc:.2f} sequences of max_model_len="
                f"{self.max_model_len} tokens, fewer than max_num_seqs={self.max_num_seqs}: decoding could "
                f"preempt (and lose latent states). Raise kv_cache_gib or lower max_num_seqs."
            )

    def _rpc(self, method: str, *args, **kwargs):
        """Call a worker-extension method on every worker; return rank 0's answer."""
        return self.llm.collective_rpc(method, args=args, kwargs=kwargs or None)[0]

    # ---- RolloutEngine -----------------------------------------------------------------------------------
    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        min_version: int | None = None,
        continuations: list[Continuation | None] | None = None,
    ) -> list[Sample]:
        """n samples per prompt, flat, prompt-major. `continuations[i]` (rl/samples/continuation.py) makes prompt i
        the resumption of an earlier sequence: its prefill fuses the given states at the positions it marks."""
        self._check_ready(min_version)
        params.validate()
        validate_prompts(prompts, self.vocab_size)
        for i, p in enumerate(prompts):
            if len(p) + params.max_tokens > self.max_model_len:
                raise ValueError(
                    f"prompts[{i}]: {len(p)} prompt tokens + max_tokens={params.max_tokens} exceed "
                    f"max_model_len={self.max_model_len}"
                )
        check_continuations(prompts, continuations, self.hidden_size, params.decode_mode)
        from vllm.inputs import TokensPrompt

        call = next(self._calls)
        salts = cache_salts(prompts, params.decode_mode, continuations, f"{self._uid}:{call}")
        keys, reqs, sps, where = [], [], [], []
        for i, p in enumerate(prompts):
            for s in range(params.n):
                key = f"{self._uid}:{call}:{i}:{s}"
                seed = None if params.seed is None else params.seed + len(keys)
                keys.append(key)
                where.append((i, s))
                salt = salts[i] if salts[i] is not None else key  # a salt of its own: never a hit
                reqs.append(TokensPrompt(prompt_token_ids=list(p), cache_salt=salt))
                sps.append(request_params(params, key, seed, self.eos_token_ids, self.resume_preempted))
        path = None
        if params.record_states and not self.inline_states:
            path = os.path.join(scratch_dir(), f"fbrl_states_{os.getpid()}_{self._uid}_{call}.safetensors")
        try:
            self._put_replay(continuations, keys, where, call)
            outs = self.llm.generate(reqs, sps, use_tqdm=False)
            inline = params.record_states and self.inline_states
            popped = self._rpc("fbt_pop", keys, path, params.states_dtype, inline)
        except BaseException:
            self._rpc("fbt_clear")
            raise
        states = popped.get("states")
        if popped["path"]:
            try:
                states = load_file(popped["path"])["states"]
            finally:
                os.remove(popped["path"])  # read once: scratch files never outlive the call that wrote them
        preempted = set(popped["preempted"])
        self.resumed_samples += len(popped["resumed"])
        return [
            output_sample(
                out, key, gi, si, params, prompts[gi], states, popped["index"], key in preempted, self.version
            )
            for out, key, (gi, si) in zip(outs, keys, where)
        ]

    def _check_ready(self, min_version: int | None) -> None:
        if self._weights_invalid:
            raise StaleWeightsError(
                "a native weight transfer started and its weights carry no policy version yet "
                "(finish_weight_update(weight_version=v) or set_weight_version(v))"
            )
        self.check_version(min_version)

    def _put_replay(self, continuations, keys, where, call: int) -> None:
        """Hand the continuations' fed positions and states to the model, per sample key: the tensors themselves
        when the worker shares this process, else through a scratch file deleted once read."""
        if continuations is None:
            return
        tables, index, named = {}, {}, {}
        for key, (i, _) in zip(keys, where):
            c = continuations[i]
            if c is None or not bool(c.fed.any()):
                continue
            if i not in named:
                pos = c.fed.nonzero()[:, 0]
                named[i] = (pos, c.states[pos].float().contiguous())
            tables[key], index[key] = named[i], str(i)
        if not tables:
            return
        if self.inline_states:
            self._rpc("fbt_put_replay", tables)
            return
        path = os.path.join(scratch_dir(), f"fbrl_replay_{os.getpid()}_{self._uid}_{call}.safetensors")
        save_file(
            {f"{i}.{part}": t for i, (p, st) in named.items() for part, t in (("positions", p), ("states", st))}, path
        )
        try:
            self._rpc("fbt_put_replay", None, path, index)
        finally:
            os.remove(path)

    def load_weights(self, weights, version: int) -> None:
        """Install weights as policy `version` (must be newer than the engine's).

        weights: a safetensors file or save_pretrained directory (HF names; a path under /dev/shm is shared
        memory), a state dict (written to a /dev/shm file, then loaded), or, on GPU, a vLLM trainer-side
        weight-transfer engine whose client is this engine (native NCCL / IPC transfer, section below).
        """
        self._check_new_version(version)
        if isinstance(weights, Mapping):
            path = os.path.join(scratch_dir(), f"fbrl_weights_{os.getpid()}_{self._uid}_{version}.safetensors")
            tensors, seen = {}, set()
            for k, v in weights.items():
                t = v.detach().to("cpu")
                if t.data_ptr() in seen:  # tied weights share storage, which safetensors refuses to write
                    t = t.clone()
                seen.add(t.data_ptr())
                tensors[k] = t.contiguous()
            save_file(tensors, path)
            try:
                self._rpc("fbt_load_weights", path, int(version))
            finally:
                os.remove(path)
        elif isinstance(weights, (str, os.PathLike)):
            self._rpc("fbt_load_weights", os.fspath(weights), int(version))
        elif hasattr(weights, "send_weights"):  # a vLLM trainer-side weight-transfer engine (GPU, see below)
            weights.send_weights()
            self.set_weight_version(int(version))
            return
        else:
            raise TypeError(f"load_weights: expected a path or a state dict, got {type(weights).__name__}")
        self.version = int(version)
        self._weights_invalid = False

    # ---- GPU: vLLM's native weight transfer (NCCL / IPC); the VLLMWeightSyncClient protocol ---------------
    # A trainer-side `vllm.distributed.weight_transfer` engine (NCCLTrainerWeightTransferEngine,
    # IPCTrainerWeightTransferEngine) takes this object (or a Ray handle to the actor holding it) as its client
    # and drives start / update / finish. Between start and a versioned finish the engine refuses to generate:
    # its weights are partly new. The version comes either with finish_weight_update(weight_version=v), or from
    # load_weights(trainer_engine, v), which runs trainer_engine.send_weights() in this process (the trainer and
    # this engine colocated). Needs `weight_transfer_backend` at construction; exercised only on GPU
    # (tools/gpu/gpu_check.sh), never on CPU.
    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": init_info})

    def start_weight_update(self) -> None:
        self._weights_invalid = True
        self.llm.collective_rpc("start_weight_update")

    def update_weights(self, update_info) -> None:
        self.llm.collective_rpc("update_weights", kwargs={"update_info": update_info})

    def finish_weight_update(self, weight_version: str | int | None = None) -> None:
        self.llm.collective_rpc("finish_weight_update")
        if weight_version is not None:
            self.set_weight_version(int(weight_version))

    def set_weight_version(self, version: int) -> None:
        """Tag weights installed by a native transfer as policy `version` (must be newer)."""
        self._check_new_version(int(version))
        self._rpc("fbt_set_version", int(version))
        self.version = int(version)
        self._weights_invalid = False

    def weight_checksums(self) -> dict[str, float]:
        """Per-tensor checksums (`rl.train.workers.tensor_checksums` under Hugging Face names) of the weights vLLM
        computes with, read through the worker extension; the weight-sync check compares them with the learner's."""
        return self._rpc("fbt_weight_checksums")

    def close(self) -> None:
        """Shut the engine core down (frees the KV cache); the object is unusable afterwards."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            self.llm = None
