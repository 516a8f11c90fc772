"""The post-training comparison on our tiny model: one RL job per likelihood estimator, same seeds.

    python bench/study_estimators.py [--config configs/tiny.yaml] [--out runs/study] [key=value ...]

Runs `fbrl train` three times — replay, kpass (K=3), and the standard-model baseline (feedback off in decoding
and in the learner) — with identical seeds and data order, then writes `OUT/comparison.png` (held-out greedy
accuracy and training reward against step) and `OUT/comparison.md` / `.json` (start/end accuracy per arm).
Extra key=value overrides apply to every arm (e.g. train.steps=20).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ARMS = {
    "replay": ["likelihood.estimator=replay"],
    "kpass3": ["likelihood.estimator=kpass", "likelihood.passes=3"],
    "standard": ["likelihood.estimator=standard", "rollout.decode_mode=standard",
                 "train.eval_decode_modes=[standard]"],
    # not in the default set: the differentiable recurrence costs ~5x a replay update
    "exact": ["likelihood.estimator=exact"],
}
DEFAULT_ARMS = ["replay", "kpass3", "standard"]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summarize(rows: list[dict]) -> dict:
    evals = [r for r in rows if r.get("eval_accuracy") is not None]
    train = [r for r in rows if "reward_mean" in r]
    return {"eval_start": evals[0]["eval_accuracy"] if evals else None,
            "eval_end": evals[-1]["eval_accuracy"] if evals else None,
            # one step's batch reward swings by +-0.1 with its prompts: average five
            "reward_first5": _mean([r["reward_mean"] for r in train[:5]]),
            "reward_last5": _mean([r["reward_mean"] for r in train[-5:]]),
            "mismatch_mean": _mean([r.get("logprob_mismatch_abs_mean") for r in train]),
            "time_learner_s_mean": _mean([r.get("time_learner_s") for r in train]),
            "steps": len(train)}


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def plot(results: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for arm, rows in results.items():
        ev = [(r["step"], r["eval_accuracy"]) for r in rows if r.get("eval_accuracy") is not None]
        tr = [(r["step"], r["reward_mean"]) for r in rows if "reward_mean" in r]
        # a step's batch reward swings with its prompts (the arms share them): show a 5-step running mean
        tr = [(s, _mean([v for _, v in tr[max(0, i - 4):i + 1]])) for i, (s, _) in enumerate(tr)]
        if ev:
            ax1.plot(*zip(*ev), marker="o", label=arm)
        if tr:
            ax2.plot(*zip(*tr), label=arm)
    ax1.set(xlabel="step", ylabel="held-out greedy accuracy", title="held-out accuracy")
    ax2.set(xlabel="step", ylabel="mean reward (5-step running mean)", title="training reward")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def write_comparison(results: dict[str, list[dict]], out: Path) -> str:
    """`comparison.json`, `.md` and `.png` in `out` from each arm's metrics rows; returns the markdown table."""
    table = {arm: summarize(rows) for arm, rows in results.items()}
    (out / "comparison.json").write_text(json.dumps(table, indent=1))
    fmt = lambda x, spec: "–" if x is None else format(x, spec)
    lines = ["| arm | held-out acc start | end | Δ points | reward, first 5 → last 5 steps | mean |Δlogp| "
             "| learner s/step |", "|---|---|---|---|---|---|---|"]
    for arm, s in table.items():
        delta = None if s["eval_start"] is None else 100 * (s["eval_end"] - s["eval_start"])
        lines.append(f"| {arm} | {fmt(s['eval_start'], '.3f')} | {fmt(s['eval_end'], '.3f')} | "
                     f"{fmt(delta, '+.1f')} | {fmt(s['reward_first5'], '.3f')} → {fmt(s['reward_last5'], '.3f')} | "
                     f"{fmt(s['mismatch_mean'], '.2e')} | {fmt(s['time_learner_s_mean'], '.2f')} |")
    md = "\n".join(lines) + "\n"
    (out / "comparison.md").write_text(md)
    plot(results, out / "comparison.png")
    print(md + f"plot: {out / 'comparison.png'}")
    return md


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/tiny.yaml")
    ap.add_argument("--out", default="runs/study")
    ap.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, choices=list(ARMS))
    ap.add_argument("--collect", action="store_true",
                    help="run nothing: rebuild the comparison from OUT/<arm>/metrics.jsonl of earlier runs")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for arm in args.arms:
        run_dir = out / arm
        if args.collect:
            results[arm] = read_metrics(run_dir)
            continue
        cmd = [sys.executable, "-m", "actors.cli", "train", args.config, *args.overrides, *ARMS[arm],
               f"train.run_dir={run_dir}", "logging.progress=false"]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        results[arm] = read_metrics(run_dir)
    write_comparison(results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
