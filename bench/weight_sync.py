"""Weight-sync seconds, file vs ray, on the tiny demo job and on a 135M-shape model, side by side in one run.

    python -m bench.weight_sync [--models tiny,135m] [--steps 6] [--reps 5] [--out runs/bench_sync]

For each model and transport the real stack is built (`actors.placement.build_workers`: a private local Ray, one
vLLM CPU engine, two DeepSpeed ZeRO-2 learner ranks, the reward actor) and the RL loop
(`rl.loop.train`) runs `--steps` steps with that transport: metrics.jsonl gives each step's `time_sync_s` and
`time_step_s` (medians over steps 2.., the first being warm-up), hence sync / step. Then, on the same workers,
`--reps` syncs of each transport alternate (file, ray, file, ray, ...): seconds per sync at identical state,
the ratio ray / file being the fairer comparison (both measured within seconds of each other).

Models: `tiny` = configs/tiny.yaml on that layout (the demo's model: checkpoints/tiny-arith-mixed, 0.7M parameters); `135m` = a
random-weight FBT of SmolLM2-135M's shape (d=576, 30 layers, 9 heads of 64, 3 KV heads, vocab 49,152, tied;
134.5M parameters, 538 MB fp32) with the character tokenizer, 8 prompts x 4 samples x 16 tokens per step, and
`alternating_reward` (random weights earn no task reward; without a signal the loop would skip update and sync).
Writes OUT/weight_sync.json and OUT/weight_sync.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRANSPORTS = ("file", "ray")


def make_135m(directory: Path) -> str:
    """A random FBT Llama of SmolLM2-135M's shape, saved with the tiny checkpoint's character tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rl.model import convert_to_fbt
    from rl.model.files import copy_tokenizer_files

    if (directory / "config.json").exists():
        return str(directory)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        intermediate_size=1536,
        vocab_size=49152,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = convert_to_fbt(LlamaForCausalLM(cfg))
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), safe_serialization=True)
    copy_tokenizer_files(str(ROOT / "checkpoints" / "tiny-arith-mixed"), str(directory))
    return str(directory)


_calls = itertools.count()


def alternating_reward(prompts, completions, answers, **row_fields) -> list[float]:
    """0, 1, 0, 1, ... whatever the text: a random-weight model earns no task reward, so every group would be
    equal and the loop would skip the update and the sync; this keeps every step a real update + sync."""
    return [float(next(_calls) % 2) for _ in completions]


def overrides_for(model: str, out: Path, steps: int) -> list[str]:
    common = [
        f"train.steps={steps}",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        "logging.progress=false",
        "logging.wandb_mode=disabled",
        # the layout the figures were measured on (the demo's default is now the torch engine and one rank)
        "rollout.engine=vllm",
        "learner.num_workers=2",
        "learner.zero_stage=2",
    ]
    if model == "tiny":
        return common
    return common + [
        f"model.path={make_135m(out / 'ckpt_135m')}",
        "train.prompts_per_step=8",
        "rollout.n_samples_per_prompt=4",
        "rollout.max_tokens=16",
        "rollout.vllm.max_num_seqs=32",
        "rollout.vllm.max_model_len=128",
        "learner.micro_batch_size=8",
        f"reward.fns=[{{fn: '{Path(__file__).resolve()}:alternating_reward'}}]",
    ]


def run_one(model: str, transport: str, out: Path, steps: int, reps: int) -> dict:
    import ray

    from actors.placement import build_workers
    from rl.config import load_config
    from rl.data.tokenizer import load_tokenizer
    from rl.loop import train
    from rl.train.run_dir import RunDir

    cfg = load_config(
        str(ROOT / "configs" / "tiny.yaml"), overrides_for(model, out, steps) + [f"rollout.weight_sync={transport}"]
    )
    run_dir = out / f"{model}_{transport}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run = RunDir(str(run_dir))
    rollout, learner, rewards = build_workers(cfg, use_ray=True)
    try:
        n_params = count_params(cfg.model.path)
        train(
            cfg,
            load_tokenizer(cfg.model.tokenizer or cfg.model.path),
            rollout,
            learner,
            rewards,
            run,
            log=lambda m: print(f"  [{model}/{transport}] {m}", flush=True),
        )
        rows = [r for r in run.read_metrics() if "time_sync_s" in r][1:]  # step 1 warms up
        sync = statistics.median(r["time_sync_s"] for r in rows)
        step = statistics.median(r["time_step_s"] for r in rows)
        # alternate the two transports on the same workers: seconds per sync at identical state
        from actors.weight_sync import make_transport

        version = max(rollout.versions())
        alternating = {t: [] for t in TRANSPORTS}
        for _ in range(reps):
            for t in TRANSPORTS:
                rollout.transport = make_transport(cfg, t)
                version += 1
                t0 = time.perf_counter()
                assert rollout.sync_weights(
                    learner, version, str(run_dir.absolute() / "weights" / "w.safetensors")
                ) == [version]
                alternating[t].append(time.perf_counter() - t0)
        return {
            "model": model,
            "transport": transport,
            "params": n_params,
            "steps_timed": len(rows),
            "loop_sync_s": sync,
            "loop_step_s": step,
            "sync_per_step": sync / step,
            "loop_sync_all_s": [r["time_sync_s"] for r in rows],
            "alternating_s": alternating,
            "alternating_median_s": {t: statistics.median(v) for t, v in alternating.items()},
        }
    finally:
        for w in (rollout, learner, rewards):
            w.close()
        ray.shutdown()


def count_params(path: str) -> int:
    """Parameters stored in a checkpoint's safetensors files (read from their headers, not loaded)."""
    import math

    from safetensors import safe_open

    n = 0
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            n += sum(math.prod(h.get_slice(k).get_shape()) for k in h.keys())
    return n


def table(results: list[dict]) -> str:
    lines = [
        "| model | params | transport | sync s (loop median) | step s (loop median) | sync / step | "
        "alternating: file s | alternating: ray s | ray / file |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        a = r["alternating_median_s"]
        lines.append(
            f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['transport']} | {r['loop_sync_s']:.3f} | "
            f"{r['loop_step_s']:.2f} | {100 * r['sync_per_step']:.1f} % | {a['file']:.3f} | {a['ray']:.3f} | "
            f"{a['ray'] / a['file']:.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny,135m")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="runs/bench_sync")
    args = ap.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for model in args.models.split(","):
        for transport in TRANSPORTS:
            print(f"== {model} / {transport}", flush=True)
            results.append(run_one(model, transport, out, args.steps, args.reps))
            (out / "weight_sync.json").write_text(json.dumps(results, indent=1))
    md = table(results)
    (out / "weight_sync.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
