"""The three-way online-RL comparison on a real FBT: standard vs K=3 reconstruction vs hidden-state replay.

    .venv/bin/python scripts/smollm_fbt_rl.py [--work runs/smollm2] [--out runs/smollm_fbt_rl] [key=value ...]

(`make smollm-fbt-rl` runs it after `make smollm-fbt GSM8K=...`.) From the continued-training outputs of
scripts/smollm_fbt.py — `<work>/fbt-trained` (the FBT) and `<work>/std-trained` (its matched one-pass standard
model) — it runs `fbrl train configs/smollm_rl.yaml train.steps=20` three times with the same prompts and seeds:

| run | model | decoding | learner's log-probs |
|---|---|---|---|
| standard | std-trained | standard | standard (one ordinary forward) |
| kpass3 | fbt-trained | soft | kpass, K = 3 |
| replay | fbt-trained | soft | replay of the engine's recorded states |

Then `OUT/comparison.md` / `.json` / `reward.png`: the training reward of the three on one plot; held-out greedy
accuracy at step 0 and at the end with each run's lift and McNemar p; the replay − kpass3 difference of final
accuracy with a 95 % interval (paired, same problems; both start from the same model, so it is also the
difference of their lifts); the median step time; each run's median correct-response length in tokens; and, with
`--transfer-n N`, every policy and its starting model on N problems of the held-out GSM8K slice (`fbrl eval`,
paired). A finished run (its evals written), a policy's channel (`OUT/channel_NAME.json`) and a transfer
(`OUT/transfer_NAME.json`) are kept and reused when the command runs again.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = {
    "standard": ("std-trained", "standard", ["likelihood.estimator=standard"]),
    "kpass3": ("fbt-trained", "soft", ["likelihood.estimator=kpass", "likelihood.passes=3"]),
    "replay": ("fbt-trained", "soft", ["likelihood.estimator=replay"]),
}


# 20 steps, not configs/smollm_rl.yaml's 15: at 15 the soft-decoded FBT runs had lifted +8.3 points and the standard
# run +11.3 (docs/BENCHMARKS.md). The config's eval_every (15) adds a held-out eval at step 15 on the way.
RL_STEPS = ["train.steps=20"]
T0 = time.time()


def log(msg: str) -> None:
    print(f"[smollm-fbt-rl {time.time() - T0:6.0f}s] {msg}", flush=True)


def paired_difference(a: list[int], b: list[int]) -> dict:
    """mean(b) − mean(a) on the same problems, its 95 % interval (normal approximation of the paired
    difference) and McNemar's exact p."""
    from rl.report.eval_stats import mcnemar_exact

    n = len(a)
    a_only = sum(x and not y for x, y in zip(a, b))
    b_only = sum(y and not x for x, y in zip(a, b))
    d = (b_only - a_only) / n
    se = math.sqrt(max(a_only + b_only - n * d * d, 0.0)) / n
    return {
        "n": n,
        "diff_points": 100 * d,
        "ci95_points": [100 * (d - 1.96 * se), 100 * (d + 1.96 * se)],
        "a_only": a_only,
        "b_only": b_only,
        "p_value": mcnemar_exact(a_only, b_only),
    }


def run_summary(run_dir: Path, mode: str, tokenizer) -> dict:
    """Start / end accuracy (strict read) and lift, rewards per step, step times, correct-response lengths."""
    from rl.train.run_dir import RunDir

    run = RunDir(str(run_dir))
    evals = run.read_evals()
    first, last = evals[0]["modes"][mode], evals[-1]["modes"][mode]
    rows = [r for r in run.read_metrics() if r.get("step", 0) > 0]
    times = [r["time_step_s"] for r in rows if r.get("time_step_s") is not None]

    def correct_len(rec):
        lens = [len(tokenizer.encode(t)) for t, ok in zip(rec["responses"], rec["strict"]) if ok]
        return statistics.median(lens) if lens else None

    return {
        "run_dir": str(run_dir),
        "mode": mode,
        "lift": paired_difference(first["strict"], last["strict"]),
        "start": sum(first["strict"]) / len(first["strict"]),
        "end": sum(last["strict"]) / len(last["strict"]),
        "end_per_problem": last["strict"],
        "median_correct_len": [correct_len(first), correct_len(last)],
        "reward": [(r["step"], r.get("reward_mean")) for r in rows],
        "median_step_s": statistics.median(times) if times else None,
        "skipped": sum(int(r.get("skipped", 0)) for r in rows),
    }


def decoding_pairs(out: Path, names: list[str]) -> dict:
    """Greedy held-out accuracy of the starting models, paired on the same problems: the FBT soft vs its own
    standard decoding, and vs the matched standard model; at the start and after RL."""
    from rl.train.run_dir import RunDir

    if "replay" not in names:
        return {}
    fbt = RunDir(str(out / "replay")).read_evals()
    std = RunDir(str(out / "standard")).read_evals() if "standard" in names else None
    pairs = {}
    for when, i in (("start", 0), ("end", -1)):
        modes = fbt[i]["modes"]
        if "standard" in modes:
            pairs[f"FBT soft − FBT standard decoding ({when})"] = paired_difference(
                modes["standard"]["strict"], modes["soft"]["strict"]
            )
        if std and std[i]["answers"] == fbt[i]["answers"]:
            pairs[f"FBT soft − standard model ({when})"] = paired_difference(
                std[i]["modes"]["standard"]["strict"], modes["soft"]["strict"]
            )
    return pairs


def transfer(start: Path, policy: Path, mode: str, data: Path, n: int, out: Path) -> dict:
    """`fbrl eval` of the policy against its starting model on the held-out GSM8K slice, paired."""
    from actors.cli import main as fbrl

    argv = ["eval", "--checkpoint", str(policy), "--task", "jsonl", "--data-path", str(data), "--n", str(n)]
    argv += ["--decode-mode", mode, "--baseline", str(start), "--baseline-mode", mode, "--samples", "0"]
    argv += ["--max-tokens", "192", "--json", str(out)]
    done = out.is_file() and json.loads(out.read_text())["meta"].get("n") == n  # kept from an earlier call
    if not done and fbrl(argv) != 0:
        raise SystemExit(f"fbrl {' '.join(argv)} failed")
    res = json.loads(out.read_text())

    def read(m):
        r = res["modes"][m]
        return {
            "greedy": r["accuracy"]["greedy"],
            "mean_length": r["mean_length"]["greedy"],
            "truncation": r["truncation_rate"]["greedy"],
        }

    return {
        "policy": read(mode),
        "start": read(f"baseline:{mode}"),
        "lift": paired_difference(res["per_problem"][f"baseline:{mode}"]["greedy"], res["per_problem"][mode]["greedy"]),
    }


def plot_rewards(summaries: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, s in summaries.items():
        ax.plot([x for x, _ in s["reward"]], [y for _, y in s["reward"]], "-o", ms=3, label=name)
    ax.set_xlabel("RL step")
    ax.set_ylabel("training reward (mean)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def format_comparison(s: dict) -> str:
    lines = [
        "| run | decoding / estimator | start | end | lift (points) | McNemar p | median step s | "
        "median correct length (tokens), start → end |",
        "|---" * 7 + "|",
    ]
    for name, r in s["runs"].items():
        ln = r["median_correct_len"]
        lines.append(
            f"| {name} | {r['mode']} / {RUNS[name][2][0].split('=')[1]} | {r['start']:.3f} | {r['end']:.3f} | "
            f"{r['lift']['diff_points']:+.1f} | {r['lift']['p_value']:.2g} | {r['median_step_s']:.1f} | "
            f"{ln[0]} → {ln[1]} |"
        )
    lines.append("")
    for key, d in s["pairs"].items():
        lo, hi = d["ci95_points"]
        lines.append(
            f"- {key}: {d['diff_points']:+.1f} points (95 % CI {lo:+.1f} … {hi:+.1f}), McNemar p {d['p_value']:.2g}"
        )
    for key, d in s.get("decoding", {}).items():
        lo, hi = d["ci95_points"]
        lines.append(
            f"- {key}: {d['diff_points']:+.1f} points (95 % CI {lo:+.1f} … {hi:+.1f}), McNemar p {d['p_value']:.2g}"
        )
    for name, c in s.get("channel", {}).items():
        lo, hi = c["exact_minus_pass1_ci95"]
        err = c["kpass_logprob_error"]
        lines.append(
            f"- channel of the {name} policy: exact − pass 1 {c['exact_minus_pass1']:+.4f} nats/token (95 % CI "
            f"{lo:+.4f} … {hi:+.4f}), policy shift {c['policy_shift']:.4f}, K=1 / K=3 log-prob error "
            f"{err[0] / max(err[2], 1e-30):.0f}x, state share {c['state_share']:.3f}"
        )
    for name, t in s.get("transfer", {}).items():
        lf = t["lift"]
        lines.append(
            f"- transfer ({name}, GSM8K held-out, n {lf['n']}): start {t['start']['greedy']:.3f} → "
            f"{t['policy']['greedy']:.3f} ({lf['diff_points']:+.1f} points, p {lf['p_value']:.2g})"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default=str(ROOT / "runs" / "smollm2"))
    ap.add_argument("--out", default=str(ROOT / "runs" / "smollm_fbt_rl"))
    ap.add_argument("--config", default=str(ROOT / "configs" / "smollm_rl.yaml"))
    ap.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    ap.add_argument("--transfer-n", type=int, default=0, help="GSM8K held-out problems for the transfer check")
    ap.add_argument("--channel-rows", type=int, default=0, help="held-out rows to measure each FBT policy's channel")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides for every RL run")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from transformers import AutoTokenizer

    from actors.cli import main as fbrl

    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.runs:
        model, mode, extra = RUNS[name]
        if not (out / name / "eval").is_dir() or len(list((out / name / "eval").glob("step_*.json"))) < 2:
            argv = ["train", args.config, f"model.path={work / model}", f"rollout.decode_mode={mode}"]
            # the replay run also reads its model in standard decoding: the FBT's soft vs its own standard, paired
            modes = "[soft, standard]" if name == "replay" else f"[{mode}]"
            argv += [f"train.eval_decode_modes={modes}", f"train.run_dir={out / name}", "--overwrite"]
            argv += RL_STEPS
            argv += [*extra, *args.overrides]
            log(f"{name}: fbrl {' '.join(argv)}")
            t = time.time()
            if fbrl(argv) != 0:
                raise SystemExit(f"{name}: fbrl train failed; its run directory is {out / name}")
            log(f"{name}: {(time.time() - t) / 60:.1f} min")
    tokenizer = AutoTokenizer.from_pretrained(work / "fbt-trained")
    runs = {n: run_summary(out / n, RUNS[n][1], tokenizer) for n in args.runs}
    s = {"runs": runs, "pairs": {}}
    for a, b in (("kpass3", "replay"), ("standard", "kpass3"), ("standard", "replay")):
        if a in runs and b in runs:
            s["pairs"][f"{b} − {a}, final accuracy"] = paired_difference(
                runs[a]["end_per_problem"], runs[b]["end_per_problem"]
            )
    s["decoding"] = decoding_pairs(out, args.runs)
    if args.channel_rows:  # the latent channel of each FBT policy after RL, as the card measures the FBT's
        from rl.report.channel_card import measure_checkpoint

        s["channel"] = {}
        for name in args.runs:
            if RUNS[name][1] == "soft":
                saved = out / f"channel_{name}.json"  # kept: it takes minutes
                if saved.is_file() and json.loads(saved.read_text()).get("rows") == args.channel_rows:
                    s["channel"][name] = json.loads(saved.read_text())
                    continue
                log(f"{name}: measuring the policy's latent channel on {args.channel_rows} held-out rows")
                s["channel"][name] = measure_checkpoint(
                    out / name / "policy", work / "fbt-data" / "val.jsonl", args.channel_rows
                )
                saved.write_text(json.dumps(s["channel"][name], indent=1) + "\n")
    if args.transfer_n:
        s["transfer"] = {}
        for name in args.runs:
            model, mode, _ = RUNS[name]
            log(f"{name}: transfer to GSM8K ({args.transfer_n} problems)")
            s["transfer"][name] = transfer(
                work / model,
                out / name / "policy",
                mode,
                work / "fbt-data" / "test.jsonl",
                args.transfer_n,
                out / f"transfer_{name}.json",
            )
    plot_rewards(runs, out / "reward.png")
    text = format_comparison(s)
    (out / "comparison.md").write_text(text + "\n\n![training reward](reward.png)\n")
    (out / "comparison.json").write_text(json.dumps(s, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
