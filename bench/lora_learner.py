"""A LoRA learner against the full fine-tune, side by side on the same batch: peak RSS of the learner rank's
process, seconds per update, and the fusion weights' norms (the latent metrics) over the updates.

    python -m bench.lora_learner --config configs/smollm_rl.yaml [--override k=v ...]
        [--variant NAME=k=v,k=v ...] [--updates 3] [--samples FILE] [--rows N] [--out FILE]

The batch is real: step 1's prompts of the config's task and `rollout.n_samples_per_prompt` samples each, drawn by
the torch engine from the config's checkpoint (with recorded states for replay); `--samples FILE` keeps it (written
the first time, read afterwards). Advantages: a fixed random draw.

Each variant runs in a fresh process (so its peak RSS is its own): one `actors.learner_rank.LearnerRank` (the DeepSpeed
engine of the config, world size 1: what each Ray rank runs) taking `--updates` updates on the batch. Reported:
`peak_rss_gib` (ru_maxrss of that process: weights, optimizer state, activations, everything), `s_per_update`
(median of the updates after the first, which is warm-up), and the fusion norms `latent/w_state_norm` /
`latent/w_token_norm` (rl/report/latent_metrics.py) before the first update and after the last. Default variants:
`full` (the config as it is) and `lora` (`learner.lora={}`).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def fusion_norms(rank) -> dict[str, float]:
    from rl.report.latent_metrics import weight_norms

    return {f"latent/{k}": v for k, v in weight_norms(rank.policy).items()}


def run_variant(config: str, overrides: list[str], samples_path: str, updates: int, rows: int | None) -> dict:
    """One LearnerRank in this process, `updates` updates on the saved batch (its first `rows` rows)."""
    from actors.learner_rank import LearnerRank
    from rl.config import load_config

    cfg = load_config(config, overrides)
    from rl.batch import load_samples

    samples, adv = load_samples(samples_path)
    samples, adv = samples[:rows], adv[:rows]
    rank = LearnerRank(cfg)
    before = fusion_norms(rank)
    times, metrics = [], {}
    for _ in range(updates):
        t = time.perf_counter()
        metrics = rank.update(samples, adv)
        times.append(time.perf_counter() - t)
    after = fusion_norms(rank)
    trainable = sum(p.numel() for p in rank.policy.parameters() if p.requires_grad)
    rank.close()
    return {
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "s_per_update": statistics.median(times[1:] or times),
        "update_s": times,
        "trainable_params": trainable,
        "grad_norm": metrics.get("grad_norm"),
        "fusion_before": before,
        "fusion_after": after,
        "rows": len(samples),
        "tokens": sum(s.prompt_len + s.response_len for s in samples),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--override", action="append", default=[])
    p.add_argument("--variant", action="append", default=[], help="NAME=k=v,k=v (default: full and lora)")
    p.add_argument("--updates", type=int, default=3)
    p.add_argument("--samples", default=None, help="batch file (written if missing)")
    p.add_argument("--rows", type=int, default=None, help="train on the batch's first ROWS rows (whole groups)")
    p.add_argument("--out", default=None)
    p.add_argument("--child", nargs=2, metavar=("VARIANT_OVERRIDES_JSON", "SAMPLES"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(
            "RESULT "
            + json.dumps(run_variant(args.config, json.loads(args.child[0]), args.child[1], args.updates, args.rows)),
            flush=True,
        )
        return 0
    from bench.learner_speed import load_or_make_batch  # the same real batch as the learner-speed benchmark
    from rl.config import load_config

    cfg = load_config(args.config, args.override)
    samples_path = args.samples or "/tmp/lora_learner_batch.pt"
    load_or_make_batch(cfg, samples_path)
    variants = [v.partition("=") for v in args.variant] or [("full", "=", ""), ("lora", "=", "learner.lora={}")]
    results = {}
    for name, _, extra in variants:
        overrides = args.override + [o for o in extra.split(",") if o]
        rows = ["--rows", str(args.rows)] if args.rows else []
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--config",
                args.config,
                "--updates",
                str(args.updates),
                *rows,
                "--child",
                json.dumps(overrides),
                samples_path,
            ],
            capture_output=True,
            text=True,
        )
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        if out.returncode or not line:
            print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"variant {name} failed (exit {out.returncode})")
        results[name] = r = json.loads(line[0][len("RESULT ") :])
        print(
            f"{name:>8}: peak RSS {r['peak_rss_gib']:.2f} GiB, {r['s_per_update']:.1f} s/update "
            f"({', '.join(f'{t:.1f}' for t in r['update_s'])}), {r['trainable_params'] / 1e6:.2f}M trainable, "
            f"fusion {r['fusion_before']} -> {r['fusion_after']}",
            flush=True,
        )
    if "full" in results and "lora" in results:
        f, lo = results["full"], results["lora"]
        print(
            f"lora / full: peak RSS {lo['peak_rss_gib'] / f['peak_rss_gib']:.2f}x, "
            f"s/update {lo['s_per_update'] / f['s_per_update']:.2f}x"
        )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
