"""Worker extension for the FBT vLLM model (`LLM(..., worker_extension_cls="rollout.vllm_worker_ext.FBTWorkerExtension")`).

vLLM mixes this class into its worker, so each method below is callable through `llm.collective_rpc(name, ...)`
on every worker. RPC results travel through vLLM's serializer, which turns tensors into lists when workers are
separate processes; so bulk data never goes through RPC here: weights come in as a path (a safetensors file or a
save_pretrained directory, ideally under /dev/shm) and recorded states go out either as the tensor itself, when
the worker lives in the caller's process (the in-process "uni" executor: nothing is serialized, `fbt_attach` reports
the worker's pid so the caller can tell), or else as a safetensors file whose path and index are returned.
"""

from __future__ import annotations

import glob
import logging
import os

import torch
from safetensors.torch import load_file, save_file

import rl.samples.states as state_formats


class _RotaryReloadNoise(logging.Filter):
    """Drops vLLM's "RotaryEmbedding: Failed to load weights", printed on every in-place reload of any RoPE model:
    the rotary cos/sin cache is a computed buffer, not a weight, and vLLM puts it back. Other modules that fail to
    load still warn."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "RotaryEmbedding: Failed to load weights" not in record.getMessage()


logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_RotaryReloadNoise())


def _safetensors_files(path: str) -> list[str]:
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise FileNotFoundError(f"no *.safetensors file in {path}")
        return files
    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    return [path]


class FBTWorkerExtension:
    """RPC methods (all prefixed `fbt_`, so they cannot clash with the worker's own)."""

    def _fbt_model(self):
        model = self.model_runner.get_model()
        if not hasattr(model, "fbt_records"):
            raise TypeError(
                f"{type(model).__name__} is not an FBT model (architectures must be "
                f"FBTLlamaForCausalLM / FBTQwen2ForCausalLM)"
            )
        return model

    def fbt_attach(self) -> dict:
        """Give the model the runner's request table (per-request mode, key, prompt length); return facts.

        The table is the V1 model runner's (`rollout.vllm_env.engine_environment` forces that runner); a runner
        without it fails here, at construction, rather than at the first forward."""
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1ModelRunner

        runner = self.model_runner
        if not isinstance(runner, V1ModelRunner):
            raise RuntimeError(
                f"FBT plugin: vLLM built a {type(runner).__module__}.{type(runner).__name__}, not the "
                f"V1 model runner whose request table the plugin reads; set "
                f"VLLM_USE_V2_MODEL_RUNNER=0 (VLLMEngine does)"
            )
        model = self._fbt_model()
        model.fbt_attach_runner(runner)
        cfg = model.config
        return {
            "hidden_size": cfg.hidden_size,
            "vocab_size": cfg.vocab_size,
            "version": model.fbt_version,
            "fusion_mode": cfg.fbt_fusion_mode,
            "prefill_passes": model.fbt_passes,
            "model_class": type(model).__name__,
            "model_runner": f"{type(runner).__module__}.{type(runner).__name__}",
            "pid": os.getpid(),
        }

    def fbt_load_weights(self, path: str, version: int) -> int:
        """Load checkpoint-format tensors (HF names) from a file or directory in place, tag them `version`.

        vLLM's in-place reload runs the model's own loader (stacking q/k/v, gate/up) and its post-load
        processing, so CPU weight repacking stays consistent.
        """
        model = self._fbt_model()

        tied = bool(getattr(model.config, "tie_word_embeddings", False))

        def weights():
            names = set()
            for f in _safetensors_files(path):
                for name, tensor in load_file(f, device="cpu").items():
                    names.add(name)
                    yield name, tensor
                    # A tied checkpoint stores the embedding once (save_pretrained drops lm_head.weight), but
                    # vLLM's CPU layers keep a separately repacked LM head: feed it the embedding too, or the
                    # head silently stays at the old weights after every reload.
                    if tied and name == "model.embed_tokens.weight" and "lm_head.weight" not in names:
                        names.add("lm_head.weight")
                        yield "lm_head.weight", tensor

        self.model_runner.reload_weights(weights_iterator=weights(), is_checkpoint_format=True)
        model.fbt_weights_changed()
        model.fbt_version = int(version)
        return model.fbt_version

    def fbt_set_version(self, version: int) -> int:
        """Tag the weights already installed (e.g. by vLLM's native weight transfer) as `version`."""
        model = self._fbt_model()
        model.fbt_weights_changed()
        model.fbt_version = int(version)
        return model.fbt_version

    def fbt_pop(self, keys: list[str], path: str | None, states_dtype: str = "float32", inline: bool = False) -> dict:
        """Hand over what the model recorded for these sample keys and forget it.

        Returns {"preempted": [keys], "resumed": [keys], "index": {key: [row_offset, num_rows]}, "path": path or None, "states":
        tensor or None}: the states [sum rows, d] in storage format `states_dtype` (rl/samples/states.py) are
        returned as `states` when `inline` (only when the caller shares this process: RPC would turn them into lists),
        else written to `path` (safetensors, tensor "states"). Only rank 0 hands them over (all tensor-parallel ranks
        hold the same replicated states).
        """
        model = self._fbt_model()
        states, preempted, resumed = model.fbt_records.pop(list(keys))
        model.fbt_replay.drop(keys)
        index, chunks, offset = {}, [], 0
        for k in keys:
            if k in states:
                n = int(states[k].shape[0])
                index[k] = [offset, n]
                chunks.append(states[k])
                offset += n
        wrote, out = None, None
        if (path is not None or inline) and chunks and self.rank == 0:
            out = state_formats.encode(torch.cat(chunks), states_dtype).contiguous()
            if not inline:
                tmp = f"{path}.tmp{os.getpid()}"
                save_file({"states": out}, tmp)
                os.replace(tmp, path)  # the reader never sees a half-written file
                wrote, out = path, None
        return {
            "preempted": sorted(preempted),
            "resumed": sorted(resumed),
            "index": index,
            "path": wrote,
            "states": out,
        }

    def fbt_put_replay(self, tables: dict | None, path: str | None = None, index: dict | None = None) -> int:
        """Give the model the states a replay prefill fuses, per sample key: positions [k] (ascending) and states
        [k, d]. Either `tables` {key: (positions, states)} (only when the caller shares this process: RPC would
        turn tensors into lists), or a safetensors file `path` holding "{name}.positions" / "{name}.states" and
        `index` {key: name}. Dropped when the keys are popped. Returns how many keys the model holds."""
        model = self._fbt_model()
        if path is not None:
            loaded = load_file(path)
            tables = {k: (loaded[f"{n}.positions"], loaded[f"{n}.states"]) for k, n in (index or {}).items()}
        device, dtype = model.fbt_is_reset.device, model.fbt_state.state_dtype
        on_device: dict = {}  # a continuation shared by a group's samples goes to the device once
        for key, (positions, states) in (tables or {}).items():
            if id(states) not in on_device:
                on_device[id(states)] = states.to(device=device, dtype=dtype)
            model.fbt_replay.put(key, positions.to("cpu", torch.long), on_device[id(states)])
        return len(model.fbt_replay.by_key)

    def fbt_clear(self) -> None:
        """Drop every record, flag and replay table (after an aborted generate)."""
        model = self._fbt_model()
        model.fbt_records.clear()
        model.fbt_replay.clear()

    def fbt_weight_checksums(self) -> dict:
        """{HF tensor name: checksum} of the live weights (`rollout.vllm_checksums`): small, safe through RPC."""
        from rollout.vllm_checksums import live_weight_checksums

        return live_weight_checksums(self._fbt_model())
