"""Summarize an RL run directory for docs/BENCHMARKS.md: held-out accuracy start → end with a binomial interval,
the reward curve (per step and 5-step means), the latent-channel metrics over steps, and the step-time breakdown.

    python -m tools.run_summary RUN_DIR [--memory memory.json]      # memory.json: tools/actor_memory.py's output
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return c - h, c + h


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--memory", default=None)
    args = ap.parse_args(argv)
    run = Path(args.run_dir)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    n_eval = cfg["train"]["eval_n"]
    evals = [r for r in rows if r.get("eval_accuracy") is not None]
    steps = [r for r in rows if r["step"] > 0]
    print(f"## {run}  ({len(steps)} steps, {sum(r['skipped'] for r in steps)} skipped for lack of signal)")
    for r in evals:
        lo, hi = wilson(r["eval_accuracy"], n_eval)
        print(
            f"held-out greedy accuracy at step {r['step']}: {r['eval_accuracy']:.3f} "
            f"(95% CI {lo:.3f}-{hi:.3f}, n={n_eval})"
        )
    print("\n| step | reward | trunc | len | skipped | w_state_norm | state_share | policy_shift | mismatch |")
    print("|---|---|---|---|---|---|---|---|---|")
    fmt = lambda v, s=".2e": "-" if v is None else format(v, s)  # noqa: E731
    for r in steps:
        print(
            f"| {r['step']} | {r['reward_mean']:.3f} | {r['truncation_rate']:.2f} | {r['response_len_mean']:.1f} | "
            f"{r['skipped']} | {fmt(r.get('learner/latent/w_state_norm'))} | "
            f"{fmt(r.get('learner/latent/state_share'))} | {fmt(r.get('learner/latent/policy_shift'))} | "
            f"{fmt(r.get('logprob_mismatch_abs_mean'))} |"
        )
    chunks = [steps[i : i + 5] for i in range(0, len(steps), 5)]
    print("\nreward, 5-step means: " + " ".join(f"{statistics.mean(r['reward_mean'] for r in c):.3f}" for c in chunks))
    trained = [r for r in steps if not r["skipped"] and "eval_accuracy" not in r]
    print(f"\nstep-time medians over {len(trained)} trained steps without eval (s):")
    for key in ("time_rollout_s", "time_reward_s", "time_learner_s", "time_sync_s", "time_step_s"):
        vals = [r[key] for r in trained]
        if vals:
            print(f"  {key:16s} median {statistics.median(vals):7.2f}  min {min(vals):7.2f}  max {max(vals):7.2f}")
    total = sum(r["time_step_s"] for r in steps)
    print(f"  sum of step times {total:.0f} s ({total / 60:.1f} min)")
    if args.memory:
        print("\npeak resident memory per process (VmHWM):")
        for m in json.loads(Path(args.memory).read_text()):
            print(f"  {m['peak_rss_gib']:5.2f} GiB  {m['process']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
