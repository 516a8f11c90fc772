"""Torch-only GPU benchmark (tools/gpu/gpu_check.sh runs it on a GPU machine with only torch and transformers
installed): the paper-scale versions of our CPU ratios, and the first absolute figures. Writes
OUT/gpu_bench.json (rewritten after every section, so a run
cut short keeps what it measured) and prints one line per measurement.

    python -m tools.gpu.gpu_bench [--dry-run] [--out DIR] [--budget-s 300] [--sections decode,learner,exact]

Model: random weights in the shape of Llama-3.2-1B (d=2048, 16 layers, 32 heads / 8 KV heads of 64, MLP 8192,
vocab 128,256, tied head) as an FBT (gate_product fusion), bf16, on cuda:0.

- decode: `TorchEngine` soft / standard / fused, 256 prompts of 64..256 tokens, 128 new tokens each (greedy, no
  stop token), one warm-up then 3 interleaved timed runs per mode; wall time, tokens/s, soft / standard and
  fused / standard (best and median), beside the predicted latent-feedback overhead (bench/decode_models.py's FLOP
  model: two d×d fusion matmuls per token over the model's FLOPs per decode token; the paper's "< 1 % FLOPs")
  and the goal soft / standard <= 1 + 1.2 × predicted. `soft_fusion_gpu_share`: GPU time between CUDA events
  around the engine's fusion (`_next_input`), summed over a soft run, over the standard run's time — the
  overhead measured directly (it includes GPU idle time while the host launches those kernels).
- learner: one micro-batch of `configs/gpu_1b.yaml`'s learner (8 rows = one GRPO group of 8 samples, 256-token
  prompt + 1,024-token response): log-probs of the response under each estimator (standard, replay with the
  recorded states coming from host memory as in training, kpass K=3), a GRPO-like surrogate and its backward;
  time (median and best of 5 after a warm-up) and peak memory above the weights; replay / standard and
  kpass3 / standard beside the CPU goals (1.1, 2.0).
- exact: the `exact` estimator (the teacher-forced recurrence, differentiable through every step) at response
  lengths R = 256 and 1,024 (2 rows, 64-token prompt), fwd+bwd once each; time, time per response token and peak
  memory, beside replay on the same batch. Sequential in R, memory ~R² (every step keeps its K/V for backward).

The learner and exact sections are tools/gpu/gpu_bench_learner.py; how each figure is measured (device-synchronized
clock, time budget, peak memory), tools/gpu/gpu_measure.py.

--dry-run: the same code on a tiny model on the CPU in seconds (what CI runs: tests/test_gpu_check.py).
Torch-only: vllm, ray, deepspeed, math_verify, wandb, datasets and gguf are blocked on import (a torch-only machine has
none of them), so a dependency on them fails here and in CI, not on the GPU.
"""

from __future__ import annotations

import sys

# A torch-only GPU machine holds torch, transformers, safetensors, huggingface_hub (docs/GPU.md): make anything else
# look uninstalled (importlib.util.find_spec -> None, import -> ImportError) before our code is imported.
ABSENT_ON_GPU_MACHINE = ("vllm", "ray", "deepspeed", "math_verify", "wandb", "datasets", "gguf")
for _name in ABSENT_ON_GPU_MACHINE:
    sys.modules.setdefault(_name, None)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402

from rl.model import FBTLlamaConfig, FBTLlamaForCausalLM  # noqa: E402
from rl.samples.request import SamplingParams  # noqa: E402
from rollout.torch_engine import TorchEngine  # noqa: E402
from tools.gpu.gpu_bench_learner import bench_exact, bench_learner  # noqa: E402
from tools.gpu.gpu_measure import Budget, Clock, gib  # noqa: E402

FULL = {
    "model": dict(
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=8192,
        vocab_size=128256,
    ),
    "dtype": "bfloat16",
    "decode": dict(batch=256, prompt_min=64, prompt_max=256, new_tokens=128, reps=3),
    "learner": dict(rows=8, group=8, prompt=256, response=1024, reps=5),
    "exact": dict(rows=2, prompt=64, responses=(256, 1024)),
}
DRY = {  # fp32: bf16 matmuls are emulated (slow) on CPUs without bf16 units, such as CI's
    "model": dict(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        intermediate_size=256,
        vocab_size=512,
    ),
    "dtype": "float32",
    "decode": dict(batch=8, prompt_min=4, prompt_max=12, new_tokens=8, reps=2),
    "learner": dict(rows=4, group=2, prompt=16, response=16, reps=2),
    "exact": dict(rows=2, prompt=8, responses=(8, 16)),
}
SECTIONS = ("decode", "learner", "exact")


# ---- model ------------------------------------------------------------------------------------------------
def build_model(spec: dict, device: torch.device) -> torch.nn.Module:
    cfg = FBTLlamaConfig(
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=None,
        pad_token_id=0,
        max_position_embeddings=2048,
        **spec["model"],
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = FBTLlamaForCausalLM(cfg)
    return model.to(getattr(torch, spec["dtype"]))


# ---- decode -------------------------------------------------------------------------------------------------
def bench_decode(model, spec: dict, clock: Clock, budget: Budget, emit) -> dict:
    from bench.decode_models import flops_per_decode_token, fusion_flops_per_token  # one FLOP model for every bench

    d = spec["decode"]
    cfg, vocab = model.config, model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(d["prompt_min"], d["prompt_max"] + 1, (d["batch"],), generator=g).tolist()
    prompts = [[1] + torch.randint(4, vocab, (n - 1,), generator=g).tolist() for n in lens]
    engine = TorchEngine(model, eos_token_ids=())
    modes = ("standard", "soft", "fused")
    params = {m: SamplingParams(temperature=0.0, max_tokens=d["new_tokens"], decode_mode=m) for m in modes}

    # The fusion's own GPU time: CUDA events around `_next_input` (soft / fused only; standard never calls it).
    events, next_input = [], engine._next_input

    def timed_next_input(*a, **k):
        if not clock.cuda:
            return next_input(*a, **k)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = next_input(*a, **k)
        end.record()
        events.append((start, end))
        return out

    engine._next_input = timed_next_input

    times = {m: [] for m in modes}
    fusion_s = []
    outputs = {}
    for m in modes:  # warm-up: kernels, allocator, the soft / fused token tables
        outputs[m] = [s.response_ids for s in engine.generate(prompts, params[m])]
    for r in range(d["reps"]):
        if budget.left() < 0:
            break
        for m in modes[r % 3 :] + modes[: r % 3]:
            events.clear()
            t, _ = clock.time(lambda: engine.generate(prompts, params[m]))
            times[m].append(t)
            if m == "soft" and events:
                fusion_s.append(sum(a.elapsed_time(b) for a, b in events) / 1000)
            emit(f"decode {m} rep {r}: {t:.3f} s")
    if not times["standard"]:
        return {"skipped": "budget spent before the first timed run"}
    best = {m: min(v) for m, v in times.items()}
    med = {m: statistics.median(v) for m, v in times.items()}
    n_tok = d["batch"] * d["new_tokens"]
    mean_prompt = sum(lens) / len(lens)
    predicted = fusion_flops_per_token(cfg) / flops_per_decode_token(cfg, mean_prompt + (d["new_tokens"] + 1) / 2)
    out = {
        "batch": d["batch"],
        "new_tokens": d["new_tokens"],
        "mean_prompt_len": round(mean_prompt, 1),
        "timed_runs_per_mode": len(times["standard"]),
        "predicted_fusion_overhead": round(predicted, 5),
        "goal_soft_over_standard_max": round(1 + 1.2 * predicted, 5),
        "soft_over_standard": round(best["soft"] / best["standard"], 4),
        "soft_over_standard_medians": round(med["soft"] / med["standard"], 4),
        "fused_over_standard": round(best["fused"] / best["standard"], 4),
        "fused_over_standard_medians": round(med["fused"] / med["standard"], 4),
        "wall_s_best": {m: round(v, 4) for m, v in best.items()},
        "wall_s_all": {m: [round(x, 4) for x in v] for m, v in times.items()},
        "tokens_per_s": {m: round(n_tok / v, 1) for m, v in best.items()},
        # greedy on random weights: the modes decode different tokens, each run the same ones (a sanity check)
        "tokens_differ_soft_vs_standard": outputs["soft"] != outputs["standard"],
    }
    out["goal_soft_over_standard_met"] = out["soft_over_standard"] <= out["goal_soft_over_standard_max"]
    if fusion_s:
        out["soft_fusion_gpu_share"] = round(statistics.median(fusion_s) / med["standard"], 5)
    return out


# ---- main ---------------------------------------------------------------------------------------------------
def environment(device: torch.device, spec: dict, args) -> dict:
    env = {
        "command": "python -m tools.gpu.gpu_bench " + " ".join(sys.argv[1:]),
        "dry_run": args.dry_run,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
        "dtype": spec["dtype"],
        "model_shape": spec["model"],
        "torch_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=props.name,
            gpu_memory_gib=gib(props.total_memory),
            cuda=torch.version.cuda,
            tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
        )
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny model on the CPU (seconds): the CI check")
    ap.add_argument(
        "--out",
        default=os.environ.get("OUT", "gpu_check_out"),
        help="the output directory (default: $OUT, else ./gpu_check_out)",
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=300.0,
        help="seconds for the timed sections; a section stops repeating (or is skipped) past it",
    )
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    args = ap.parse_args(argv)
    sections = args.sections.split(",")
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        ap.error(f"--sections: unknown {unknown}; known: {list(SECTIONS)}")
    if args.dry_run:
        device, spec = torch.device("cpu"), DRY
        torch.set_num_threads(1)  # tiny shapes gain nothing from threads; on a shared CI box they stall
    elif torch.cuda.is_available():
        device, spec = torch.device("cuda:0"), FULL
    else:
        print("gpu_bench: no CUDA device (use --dry-run for the CPU check)", file=sys.stderr)
        return 2

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "gpu_bench.json"
    budget, clock = Budget(args.budget_s), Clock(device)
    result = {"environment": environment(device, spec, args)}

    def emit(line):
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    def save():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2))
        os.replace(tmp, path)

    t0 = time.perf_counter()
    model = build_model(spec, device)
    result["environment"]["params_M"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 1)
    result["environment"]["model_build_s"] = round(time.perf_counter() - t0, 1)
    emit(f"model: {result['environment']['params_M']}M parameters on {device} in {spec['dtype']}")
    save()
    failed = []
    for name in sections:
        emit(f"--- {name}")
        t0 = time.perf_counter()
        try:
            if name == "decode":
                result[name] = bench_decode(model, spec, clock, budget, emit)
            elif name == "learner":
                result[name] = bench_learner(model, spec, clock, budget, emit, device)
            else:
                result[name] = bench_exact(model, spec, clock, budget, emit, device)
        except Exception as e:  # one section's failure must not lose the others' figures
            result[name] = {"error": f"{type(e).__name__}: {e}"}
            failed.append(name)
            model.zero_grad(set_to_none=True)
        result[name]["section_s"] = round(time.perf_counter() - t0, 1)
        emit(f"{name}: {json.dumps(result[name])}")
        save()
    emit(f"results in {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
