"""The post-training comparison on our tiny model: one RL job per likelihood estimator, same seeds.

    python -m examples.study_estimators [--config configs/tiny.yaml] [--out runs/study] [--arms ...] \
                                     [--seeds 0 1] [--arm NAME KEY=VALUE ...] [--staleness 0 1 2] [key=value ...]

Runs `fbrl train` once per arm and seed — by default replay, kpass (K=3), and the standard-model baseline
(feedback off in decoding and in the learner) — with identical seeds and data order within a seed, then writes
`OUT/comparison.png` (held-out greedy accuracy and training reward against step) and `OUT/comparison.md` /
`.json` (start/end accuracy, mismatch and learner time per run; with several seeds, the gain per arm over seeds
beside the seed-to-seed spread). Extra key=value overrides apply to every arm (e.g. train.steps=20); `--arm NAME
KEY=VALUE ...` defines an arm of your own (repeatable), e.g. `--arm std_ckpt likelihood.estimator=standard ...`.
Run dirs: `OUT/<arm>` with one seed, `OUT/<arm>-seed<S>` with several. After `--arms` / `--staleness` lists, put
the overrides behind `--`.

`--staleness 0 1 2` crosses the arms with asynchronous training (`train.max_staleness`): run
`replay-s1` is replay trained one policy version behind its samples. The table then adds the median step time,
the mean staleness and the mismatch taken apart (rl/estimators/mismatch_parts.py: engine / staleness / estimator, mean
|Δ log p| per token over the run's diagnostic rows), and the plot a panel of the three parts per run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

_STANDARD = ["likelihood.estimator=standard", "rollout.decode_mode=standard", "train.eval_decode_modes=[standard]"]
ARMS = {
    "replay": ["likelihood.estimator=replay"],
    "kpass1": ["likelihood.estimator=kpass", "likelihood.passes=1"],
    "kpass2": ["likelihood.estimator=kpass", "likelihood.passes=2"],
    "kpass3": ["likelihood.estimator=kpass", "likelihood.passes=3"],
    "standard": _STANDARD,
    # not in the default set: the differentiable recurrence costs ~5x a replay update
    "exact": ["likelihood.estimator=exact"],
}
DEFAULT_ARMS = ["replay", "kpass3", "standard"]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summarize(rows: list[dict]) -> dict:
    evals = [r for r in rows if r.get("eval_accuracy") is not None]
    train = [r for r in rows if "reward_mean" in r]
    return {
        "eval_start": evals[0]["eval_accuracy"] if evals else None,
        "eval_end": evals[-1]["eval_accuracy"] if evals else None,
        # one step's batch reward swings by +-0.1 with its prompts: average five
        "reward_first5": _mean([r["reward_mean"] for r in train[:5]]),
        "reward_last5": _mean([r["reward_mean"] for r in train[-5:]]),
        "mismatch_mean": _mean([r.get("logprob_mismatch_abs_mean") for r in train]),
        "time_learner_s_mean": _mean([r.get("time_learner_s") for r in train]),
        "time_step_s_median": _median([r.get("time_step_s") for r in train if r.get("eval_accuracy") is None]),
        "staleness_mean": _mean([r.get("staleness_mean") for r in train]),
        **{f"part_{p}": _mean([r.get(f"mismatch_parts/{p}") for r in train]) for p in PARTS},
        "steps": len(train),
    }


PARTS = ("engine", "staleness", "estimator")


def _median(xs):
    xs = sorted(x for x in xs if x is not None)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2 if xs else None


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def plot(results: dict, out: Path, runs: dict[str, tuple[str, int]] | None = None) -> None:
    """Held-out accuracy, training reward (5-step running mean) and engine/learner log-prob mismatch per step;
    one colour per arm, one line style per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = runs or {name: (name, None) for name in results}
    arms = list(dict.fromkeys(arm for arm, _ in runs.values()))
    seeds = list(dict.fromkeys(seed for _, seed in runs.values()))
    with_parts = any(r.get("mismatch_parts/engine") is not None for rows in results.values() for r in rows)
    fig, axes = plt.subplots(1, 4 if with_parts else 3, figsize=(20 if with_parts else 15, 3.8))
    ax1, ax2, ax3 = axes[:3]
    for name, rows in results.items():
        arm, seed = runs.get(name, (name, None))
        style = dict(color=f"C{arms.index(arm) % 10}", ls=["-", "--", ":", "-."][seeds.index(seed) % 4], label=name)
        ev = [(r["step"], r["eval_accuracy"]) for r in rows if r.get("eval_accuracy") is not None]
        tr = [(r["step"], r["reward_mean"]) for r in rows if "reward_mean" in r]
        # a step's batch reward swings with its prompts (the arms share them): show a 5-step running mean
        tr = [(s, _mean([v for _, v in tr[max(0, i - 4) : i + 1]])) for i, (s, _) in enumerate(tr)]
        mm = [
            (r["step"], r["logprob_mismatch_abs_mean"]) for r in rows if r.get("logprob_mismatch_abs_mean") is not None
        ]
        if ev:
            ax1.plot(*zip(*ev), marker="o", **style)
        if tr:
            ax2.plot(*zip(*tr), **style)
        if mm:
            ax3.plot(*zip(*[(st, max(v, 1e-10)) for st, v in mm]), **style)
        if with_parts:  # the run's colour and line style, one marker per part
            for part, marker in zip(PARTS, ("o", "s", "^")):
                pts = [
                    (r["step"], max(r[f"mismatch_parts/{part}"], 1e-9))
                    for r in rows
                    if r.get(f"mismatch_parts/{part}") is not None
                ]
                if pts:
                    axes[3].plot(*zip(*pts), marker=marker, ms=3, **{**style, "label": f"{name} {part}"})
    if with_parts:
        axes[3].set(
            xlabel="step",
            ylabel="mean |Δ log p| per token (zeros at 1e-9)",
            yscale="log",
            title="mismatch parts: engine o, staleness □, estimator △",
        )
    ax1.set(xlabel="step", ylabel="held-out greedy accuracy", title="held-out accuracy")
    ax2.set(xlabel="step", ylabel="mean reward (5-step running mean)", title="training reward")
    ax3.set(xlabel="step", ylabel="mean |log p_engine − log p_learner|", title="log-prob mismatch", yscale="log")
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def write_comparison(results: dict[str, list[dict]], out: Path, seeds: dict[str, tuple[str, int]] | None = None) -> str:
    """`comparison.json`, `.md` and `.png` in `out` from each run's metrics rows; returns the markdown.

    `seeds` maps a run name to (arm, seed) when arms were repeated over seeds: the markdown then adds the gain
    per arm over its seeds (mean, and the spread between seeds) — what "beyond seed noise" is measured against.
    """
    table = {run: summarize(rows) for run, rows in results.items()}
    fmt = lambda x, spec: "–" if x is None else format(x, spec)
    lines = [
        "| run | held-out acc start | end | Δ points | reward, first 5 → last 5 steps | mean |Δlogp| "
        "| learner s/step | step s (median) | staleness | engine | staleness part | estimator |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run, s in table.items():
        s["delta_points"] = None if s["eval_start"] is None else 100 * (s["eval_end"] - s["eval_start"])
        lines.append(
            f"| {run} | {fmt(s['eval_start'], '.3f')} | {fmt(s['eval_end'], '.3f')} | "
            f"{fmt(s['delta_points'], '+.1f')} | {fmt(s['reward_first5'], '.3f')} → "
            f"{fmt(s['reward_last5'], '.3f')} | {fmt(s['mismatch_mean'], '.2e')} | "
            f"{fmt(s['time_learner_s_mean'], '.2f')} | {fmt(s['time_step_s_median'], '.2f')} | "
            f"{fmt(s['staleness_mean'], '.2f')} | " + " | ".join(fmt(s[f"part_{p}"], ".2e") for p in PARTS) + " |"
        )
    by_arm = {}
    if seeds and len({seed for _, seed in seeds.values()}) > 1:
        for run, (arm, _seed) in seeds.items():
            if table[run]["delta_points"] is not None:
                by_arm.setdefault(arm, []).append(table[run]["delta_points"])
        lines += ["", "| arm | seeds | Δ points per seed | mean Δ | spread (max − min) |", "|---|---|---|---|---|"]
        for arm, deltas in by_arm.items():
            lines.append(
                f"| {arm} | {len(deltas)} | {', '.join(f'{d:+.1f}' for d in deltas)} | "
                f"{statistics.mean(deltas):+.1f} | {max(deltas) - min(deltas):.1f} |"
            )
    (out / "comparison.json").write_text(json.dumps({"runs": table, "gain_points_by_arm": by_arm}, indent=1))
    md = "\n".join(lines) + "\n"
    (out / "comparison.md").write_text(md)
    plot(results, out / "comparison.png", seeds)
    print(md + f"plot: {out / 'comparison.png'}")
    return md


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/tiny.yaml")
    ap.add_argument("--out", default="runs/study")
    ap.add_argument(
        "--arms",
        nargs="+",
        default=None,
        help=f"arms to run (built in: {', '.join(ARMS)}; "
        f"default: {' '.join(DEFAULT_ARMS)}, or only the --arm ones when some are given)",
    )
    ap.add_argument(
        "--arm",
        nargs="+",
        action="append",
        default=[],
        metavar=("NAME", "KEY=VALUE"),
        help="define an arm: its name, then its overrides (repeatable)",
    )
    ap.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=None,
        help="repeat every arm with train.seed = each of these (default: the config's seed, once)",
    )
    ap.add_argument(
        "--staleness",
        nargs="+",
        type=int,
        default=None,
        help="cross the arms with train.max_staleness values (run names get -s<value>)",
    )
    ap.add_argument(
        "--collect",
        action="store_true",
        help="run nothing: rebuild the comparison from the run dirs' metrics.jsonl of earlier runs",
    )
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    arms = dict(ARMS)
    for name, *overrides in args.arm:
        if any("=" not in o for o in overrides):
            ap.error(f"--arm {name}: every override must be KEY=VALUE, got {overrides}")
        arms[name] = overrides
    chosen = args.arms or ([a[0] for a in args.arm] if args.arm else DEFAULT_ARMS)
    unknown = [a for a in chosen if a not in arms]
    if unknown:
        ap.error(f"unknown arm(s) {unknown}; defined: {', '.join(arms)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = args.seeds or [None]
    results, runs = {}, {}
    for seed in seeds:
        for staleness in args.staleness or [None]:
            for arm in chosen:
                label = arm if staleness is None else f"{arm}-s{staleness}"
                name = label if len(seeds) == 1 else f"{label}-seed{seed}"
                run_dir = out / name
                runs[name] = (label, seed)
                if not args.collect:
                    extra = [] if seed is None else [f"train.seed={seed}"]
                    extra += [] if staleness is None else [f"train.max_staleness={staleness}"]
                    cmd = [
                        sys.executable,
                        "-m",
                        "actors.cli",
                        "train",
                        args.config,
                        *args.overrides,
                        *arms[arm],
                        *extra,
                        f"train.run_dir={run_dir}",
                        "logging.progress=false",
                    ]
                    print("$", " ".join(cmd), flush=True)
                    subprocess.run(cmd, check=True)
                results[name] = read_metrics(run_dir)
    write_comparison(results, out, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
