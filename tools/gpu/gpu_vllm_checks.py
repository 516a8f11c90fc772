"""The vLLM checks of tools/gpu/gpu_check_vllm.sh, for a GPU machine with the full stack (vLLM 0.32, CUDA):

    python -m tools.gpu.gpu_vllm_checks ipc          native CUDA IPC weight transfer into a multiprocess engine
    python -m tools.gpu.gpu_vllm_checks nccl         native NCCL weight transfer: trainer on GPU 0, engine on GPU 1
    python -m tools.gpu.gpu_vllm_checks throughput [--dry-run]
                                                 soft / standard / fused throughput at the 135M and 1B shapes

Each transfer check installs perturbed weights through vLLM's trainer-side engine and requires the engine's
greedy outputs (tokens, log-probs, recorded states) to match the torch engine holding the same weights, on the
tiny FBT of tests/test_vllm_engine.py. `--dry-run` (throughput only) runs a tiny model on the CPU.
Run from the repository root with it on PYTHONPATH (the shell script does both).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Test engines on a GPU take a small share each (vLLM checks free memory >= share x total at start), so several
# coexist with the trainer's copy of the model.
SMALL_ENGINE = dict(gpu_memory_utilization=0.1, kv_cache_gib=1.0)


def tiny_checkpoint():
    """(checkpoint dir, HF model fp32 on the CPU, prompts) of the oracle tests' tiny FBT."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.test_vllm_engine import make_prompts, random_tiny_fbt

    ckpt = Path(tempfile.mkdtemp(prefix="fbrl_vllm_check_"))
    random_tiny_fbt(ckpt)
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    return ckpt, hf, make_prompts(hf.config.vocab_size, n=8)


def new_weights(hf):
    from tests.test_vllm_engine import perturb

    new = copy.deepcopy(hf)
    perturb(new, seed=1)
    return new


def check_against_torch(engine, new, prompts, version) -> None:
    from rollout.torch_engine import TorchEngine
    from tests.test_vllm_engine import assert_same, greedy

    assert engine.version == version
    for mode in ("soft", "fused"):
        assert_same(
            engine.generate(prompts, greedy(mode), min_version=version),
            TorchEngine(new).generate(prompts, greedy(mode)),
        )


def ipc() -> None:
    """Trainer (this process, GPU 0) -> multiprocess engine (its worker in another process, same GPU)."""
    from vllm.distributed.weight_transfer.base import ModuleSource
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo, IPCTrainerWeightTransferEngine

    from rollout.vllm_engine import VLLMEngine

    ckpt, hf, prompts = tiny_checkpoint()
    engine = VLLMEngine(
        str(ckpt), max_model_len=128, max_num_seqs=16, dtype="float32", weight_transfer_backend="ipc", **SMALL_ENGINE
    )
    try:
        print("engine runner:", engine.info["model_runner"])
        new = new_weights(hf)
        trainer = IPCTrainerWeightTransferEngine.trainer_init(
            IPCTrainerInitInfo(rank=0), client=engine, source=ModuleSource(copy.deepcopy(new).cuda())
        )
        engine.load_weights(trainer, 1)
        check_against_torch(engine, new, prompts, 1)
        print("IPC weight transfer: soft and fused outputs match the torch engine with the new weights")
    finally:
        engine.close()


class PipeClient:
    """vLLM's `VLLMWeightSyncClient` protocol over a connection to the process that holds the engine."""

    def __init__(self, conn):
        import threading

        self.conn, self.lock = conn, threading.Lock()

    def _call(self, method, *args, **kwargs):
        with self.lock:
            self.conn.send((method, args, kwargs))
            reply = self.conn.recv()
        if reply != "ok":
            raise RuntimeError(f"engine side: {method} failed: {reply}")

    def init_weight_transfer_engine(self, init_info):
        self._call("init_weight_transfer_engine", init_info)

    def start_weight_update(self):
        self._call("start_weight_update")

    def update_weights(self, update_info):
        self._call("update_weights", update_info)

    def finish_weight_update(self, weight_version=None):
        self._call("finish_weight_update", weight_version=weight_version)


def nccl_trainer(port: int, rdv_port: int, authkey: str, ckpt: str) -> None:
    """The trainer process (CUDA_VISIBLE_DEVICES=0): opens NCCL rank 0 and broadcasts the perturbed weights."""
    from multiprocessing.connection import Client

    import torch
    from transformers import AutoModelForCausalLM
    from vllm.distributed.weight_transfer.base import ModuleSource
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    source = ModuleSource(new_weights(hf).cuda())
    conn = Client(("127.0.0.1", port), authkey=authkey.encode())
    info = NCCLTrainerInitInfo(master_address="127.0.0.1", master_port=rdv_port, world_size=2, rank=0)
    trainer = NCCLTrainerWeightTransferEngine.trainer_init(info, client=PipeClient(conn), source=source)
    trainer.send_weights()
    conn.send(("done", (), {}))
    conn.close()


def nccl() -> None:
    """Engine in this process (CUDA_VISIBLE_DEVICES=1), trainer in a child process on GPU 0."""
    import secrets
    from multiprocessing.connection import Listener

    import torch

    if torch.cuda.device_count() < 1:
        raise SystemExit("nccl: no GPU visible")
    from rollout.vllm_engine import VLLMEngine

    ckpt, hf, prompts = tiny_checkpoint()
    engine = VLLMEngine(
        str(ckpt), max_model_len=128, max_num_seqs=16, dtype="float32", weight_transfer_backend="nccl", **SMALL_ENGINE
    )
    authkey = secrets.token_hex(16)
    try:
        print("engine runner:", engine.info["model_runner"])
        with Listener(("127.0.0.1", 0), authkey=authkey.encode()) as listener:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                rdv_port = s.getsockname()[1]
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=os.environ.get("FBRL_TRAINER_GPU", "0"))
            child = subprocess.Popen(
                [sys.executable, __file__, "nccl-trainer", str(listener.address[1]), str(rdv_port), authkey, str(ckpt)],
                env=env,
            )
            conn = listener.accept()
            while True:  # serve the trainer's client calls on the engine, one at a time
                method, args, kwargs = conn.recv()
                if method == "done":
                    break
                try:
                    getattr(engine, method)(*args, **kwargs)
                    conn.send("ok")
                except Exception as e:  # report to the trainer, then fail here too
                    conn.send(f"{type(e).__name__}: {e}")
                    raise
            if child.wait(timeout=120) != 0:
                raise RuntimeError(f"trainer process exited with {child.returncode}")
        engine.set_weight_version(1)
        check_against_torch(engine, new_weights(hf), prompts, 1)
        print("NCCL weight transfer: soft and fused outputs match the torch engine with the new weights")
    finally:
        engine.close()


SHAPES = {  # SmolLM2-135M and Llama-3.2-1B shapes (random weights)
    "135m": dict(
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        vocab_size=49152,
    ),
    "1b": dict(
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=8192,
        vocab_size=128256,
    ),
}
DRY_SHAPE = {
    "tiny": dict(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=256,
        vocab_size=512,
    )
}


def throughput(dry_run: bool) -> None:
    """Wall time of one generate() per decode mode (one engine: the mode is per request), best and median of 3."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from bench.decode_models import flops_per_decode_token, fusion_flops_per_token
    from rl.model import convert_to_fbt
    from rl.samples.request import SamplingParams
    from rollout.vllm_engine import VLLMEngine

    if dry_run:
        shapes, batch, new, reps, dtype, device = DRY_SHAPE, 8, 8, 2, "float32", "cpu"
        sizing = {}
    else:
        shapes, batch, new, reps, dtype, device = SHAPES, 256, 128, 3, "bfloat16", "cuda"
        sizing = {"gpu_memory_utilization": 0.6}
    for name, shape in shapes.items():
        cfg = LlamaConfig(
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=None,
            pad_token_id=0,
            max_position_embeddings=2048,
            **shape,
        )
        torch.manual_seed(0)
        with torch.device(device):
            fbt = convert_to_fbt(LlamaForCausalLM(cfg).to(getattr(torch, dtype)))
        ckpt = tempfile.mkdtemp(prefix=f"fbrl_vllm_tp_{name}_")
        fbt.save_pretrained(ckpt)
        del fbt
        g = torch.Generator().manual_seed(1)
        lo, hi = (4, 12) if dry_run else (64, 256)
        lens = torch.randint(lo, hi + 1, (batch,), generator=g).tolist()
        prompts = [[1] + torch.randint(4, cfg.vocab_size, (n - 1,), generator=g).tolist() for n in lens]
        engine = VLLMEngine(
            ckpt, max_model_len=max(128, hi + new), max_num_seqs=batch, dtype=dtype, eos_token_ids=(), **sizing
        )
        modes = ["standard", "soft", "fused"]
        params = {m: SamplingParams(temperature=0.0, max_tokens=new, decode_mode=m) for m in modes}
        times = {m: [] for m in modes}
        try:
            for m in modes:
                engine.generate(prompts, params[m])  # warm-up (and the soft / fused token tables)
            for r in range(reps):
                for m in modes[r % 3 :] + modes[: r % 3]:
                    t = time.perf_counter()
                    engine.generate(prompts, params[m])  # returns host lists: the device work is done
                    times[m].append(time.perf_counter() - t)
            runner = engine.info["model_runner"]
        finally:
            engine.close()
        best = {m: min(v) for m, v in times.items()}
        med = {m: statistics.median(v) for m, v in times.items()}
        predicted = fusion_flops_per_token(cfg) / flops_per_decode_token(cfg, sum(lens) / batch + (new + 1) / 2)
        print(
            "THROUGHPUT "
            + json.dumps(
                {
                    "model": name,
                    "dtype": dtype,
                    "batch": batch,
                    "new_tokens": new,
                    "model_runner": runner,
                    "predicted_fusion_overhead": round(predicted, 5),
                    "goal_soft_over_standard_max": round(1 + 1.2 * predicted, 5),
                    "soft_over_standard": round(best["soft"] / best["standard"], 4),
                    "soft_over_standard_medians": round(med["soft"] / med["standard"], 4),
                    "fused_over_standard": round(best["fused"] / best["standard"], 4),
                    "tokens_per_s": {m: round(batch * new / best[m], 1) for m in modes},
                    "wall_s_best": {m: round(v, 3) for m, v in best.items()},
                }
            ),
            flush=True,
        )


if __name__ == "__main__":  # the engines spawn worker processes
    if len(sys.argv) > 1 and sys.argv[1] == "nccl-trainer":
        nccl_trainer(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
        sys.exit(0)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("check", choices=["ipc", "nccl", "throughput"])
    ap.add_argument("--dry-run", action="store_true", help="throughput: a tiny model on the CPU")
    a = ap.parse_args()
    if a.check == "ipc":
        ipc()
    elif a.check == "nccl":
        nccl()
    else:
        throughput(a.dry_run)
