"""Summarize one run_compare.sh run directory: `python summarize.py RUN_DIR STEPS` (any python3, stdlib only).

fbrl s/step = metrics.jsonl `time_step_s`; on a step that also ran a held-out eval or a checkpoint / policy export
(the last step, and every `train.eval_every`-th), that share is taken out: the step is counted as rollout + reward
(`time_wait_s`) + mismatch parts + learner + sync, as fbrl's console line accounts it. TRL s/step = wall time
between consecutive `on_step_end` callbacks (run_trl.py; evals run outside `trainer.train()`, the step-1 gradient
check is excluded). Startup (Ray, vLLM, DeepSpeed / model load) is outside both; the process walls are printed,
split by each side's timeline (RUN/<side>.timeline: every output line with its seconds since the process was
launched) into start-up (fbrl: to `workers ready`; TRL: to `trl trainer built`, less its step-0 eval), the step-0
eval, the steps, the final eval and teardown (the end of the last eval to the process's exit). TRL's step-1
gradient check is bench work fbrl's process does not do: it is shown apart and left out of TRL's total.

Where a step goes: fbrl's own timings (rollout, reward, mismatch parts, learner, sync; `other` = the rest of the
step: advantages, the metrics row, logging, the batch queue), TRL's split by run_trl.py (rollout = its
`_generate_single_turn`, reward = the reward call, learner = the rest). fbrl skips the optimizer step (and the
whole learner phase) when no group has a usable signal (every reward in every group equal), TRL never does; so
fbrl's medians are also given over its trained steps, which are the ones to compare with TRL's steps.
Learner tokens/s = the step's real prompt + response tokens (all G samples; fbrl: step_prompts.json's prompt
tokens + `learner/tokens`; TRL: its rows' prompt + completion ids) / the learner phase's seconds. With
RUN/bench_torch.json (run_compare.sh --bench) the bare-torch figures for the same model are printed too.
The last line is the one-line summary.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def fbrl_side(run: Path, n: int):
    p = run / "fbrl" / "metrics.jsonl"
    if not p.exists():
        return None
    rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r.get("step", 0) >= 1 and "time_step_s" in r]
    e0 = next((r for r in rows if r.get("step") == 0), {})
    prompts = {}
    sp = run / "step_prompts.json"
    if sp.exists():
        prompts = {s["step"]: s for s in json.loads(sp.read_text())}
    per = []
    for r in steps:
        t = r["time_step_s"]
        if "eval_accuracy" in r or r["step"] == n:
            t = r["time_wait_s"] + r.get("time_mismatch_parts_s", 0.0) + r["time_learner_s"] + r["time_sync_s"]
        parts = {k: r.get(f"time_{k}_s", 0.0) for k in ("rollout", "reward", "mismatch_parts", "learner", "sync")}
        parts["other"] = t - sum(parts.values())
        trained = not r.get("skipped")
        tokens = None
        if trained and r["step"] in prompts and r.get("learner/tokens") is not None:
            q = prompts[r["step"]]
            if q["digest"] == r.get("prompts_digest"):
                tokens = q["prompt_tokens"] + r["learner/tokens"]
        per.append(
            {
                "step": r["step"],
                "time": t,
                "trained": trained,
                "parts": parts,
                "tokens": tokens,
                "tokens_per_s": tokens / parts["learner"] if tokens else None,
            }
        )
    trained = [s for s in per if s["trained"]]

    def medians(sel):
        return {
            k: _median(s["parts"][k] for s in sel)
            for k in ("rollout", "reward", "mismatch_parts", "learner", "sync", "other")
        }

    return {
        "times": [s["time"] for s in per],
        "digests": [r.get("prompts_digest") for r in steps],
        "trained_times": [s["time"] for s in trained],
        "trained_steps": [s["step"] for s in trained],
        "acc0": e0.get("eval_accuracy_standard"),
        "acc1": steps[-1].get("eval_accuracy_standard") if steps and steps[-1]["step"] == n else None,
        "parts": medians(per),
        "parts_trained": medians(trained),
        "tokens": _median(s["tokens"] for s in trained),
        "tokens_per_s": _median(s["tokens_per_s"] for s in trained),
        "reward": [r["reward_mean"] for r in steps],
        "skipped": sum(r.get("skipped", 0) for r in steps),
        "wall": _wall(run / "fbrl.log", "fbrl"),
        "eval_n": _eval_n(run / "fbrl" / "config.yaml"),
    }


def trl_side(run: Path):
    p = run / "trl" / "result.json"
    if not p.exists():
        return None
    r = json.loads(p.read_text())
    s = r["steps"]
    parts = {k: _median(x[f"time_{k}_s"] for x in s) for k in ("rollout", "reward", "learner")}
    return {
        "times": [x["time_step_s"] for x in s],
        "digests": [x["prompts_digest"] for x in s],
        "acc0": r["eval_before"]["accuracy"],
        "acc1": r["eval_after"]["accuracy"],
        "parts": parts,
        "tokens": _median(
            (x["prompt_tokens"] + x["completion_tokens"]) if x.get("prompt_tokens") is not None else None for x in s
        ),
        "tokens_per_s": _median(x.get("learner_tokens_per_s") for x in s),
        "reward": [x["reward_mean"] for x in s],
        "grad": r.get("gradient_check") or {},
        "agree": (r["eval_before"]["scorer_agreement"], r["eval_after"]["scorer_agreement"], r["eval_after"]["n"]),
        "wall": _wall(run / "trl.log", "trl"),
        "eval_n": r["eval_after"]["n"],
        "threads": r.get("torch_threads"),
    }


def _timeline(path: Path) -> list[tuple[float, str]]:
    if not path.exists():
        return []
    return [(float(t), line) for t, _, line in (x.partition("\t") for x in path.read_text().splitlines()) if line]


def _at(timeline, pattern: str, last: bool = False) -> float | None:
    hits = [t for t, line in timeline if re.match(pattern, line)]
    return (hits[-1] if last else hits[0]) if hits else None


def fbrl_split(run: Path, n: int, wall: float | None) -> dict | None:
    """Seconds of fbrl's process: start-up, step-0 eval, steps, final eval, teardown."""
    tl = _timeline(run / "fbrl.timeline")
    ready, eval0, last = _at(tl, r"workers ready"), _at(tl, r"step\s+0/"), _at(tl, rf"step\s+{n}/{n} ")
    rows = [json.loads(x) for x in (run / "fbrl" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    r = next((x for x in rows if x.get("step") == n and "time_step_s" in x), None)
    if None in (ready, eval0, last, wall, r):
        return None
    step_n = r["time_wait_s"] + r.get("time_mismatch_parts_s", 0.0) + r["time_learner_s"] + r["time_sync_s"]
    final_eval = r["time_step_s"] - step_n
    return {
        "start-up": ready,
        "step-0 eval": eval0 - ready,
        "steps": last - eval0 - final_eval,
        "final eval": final_eval,
        "teardown": wall - last,
    }


def trl_split(run: Path, n: int, wall: float | None) -> dict | None:
    """Seconds of TRL's process, as fbrl_split, and its gradient check (bench work) apart."""
    tl = _timeline(run / "trl.timeline")
    p = run / "trl" / "result.json"
    built, eval0 = _at(tl, r"trl trainer built"), _at(tl, r"trl step\s+0/")
    last, final = _at(tl, rf"trl step\s+{n}/{n} \| reward"), _at(tl, rf"trl step\s+{n}/{n} \| eval")
    if None in (built, eval0, last, final, wall) or not p.exists():
        return None
    r = json.loads(p.read_text())
    check = (r.get("gradient_check") or {}).get("time_s", 0.0)
    e0 = r["eval_before"]["time_s"]
    return {
        "start-up": built - e0,
        "step-0 eval": e0,
        "steps": last - built - check,
        "final eval": final - last,
        "teardown": wall - final,
        "gradient check (bench, left out)": check,
    }


def _split_line(who: str, split: dict) -> str:
    kept = {k: v for k, v in split.items() if "left out" not in k}
    apart = "".join(f"; {k} {v:.1f}" for k, v in split.items() if "left out" in k)
    return (
        f"{who} process split (s): "
        + " + ".join(f"{k} {v:.1f}" for k, v in kept.items())
        + (f" = {sum(kept.values()):.1f}{apart}")
    )


def _wall(log: Path, who: str):
    m = re.search(rf"^{who} process wall ([0-9.]+) s", log.read_text(), re.M) if log.exists() else None
    return float(m.group(1)) if m else None


def _eval_n(config: Path):
    m = re.search(r"^  eval_n: (\d+)$", config.read_text(), re.M) if config.exists() else None
    return int(m.group(1)) if m else None


def main() -> int:
    run, n = Path(sys.argv[1]), int(sys.argv[2])
    f, t = fbrl_side(run, n), trl_side(run)
    fmt = lambda xs: " ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    acc = lambda a: "n/a" if a is None else f"{a:.3f}"  # noqa: E731
    parts = lambda d: ", ".join(f"{k} {v:.2f}" for k, v in d.items())  # noqa: E731

    def gain(s):
        return (
            "n/a"
            if s is None or s["acc0"] is None or s["acc1"] is None
            else f"{100 * (s['acc1'] - s['acc0']):+.1f} pts"
        )

    if f:
        print(
            f"fbrl s/step: {fmt(f['times'])}  (median parts: {parts(f['parts'])}; skipped steps {f['skipped']}; "
            f"process wall {f['wall']} s); reward per step: {fmt(f['reward'])}"
        )
        if f["skipped"]:
            print(
                f"fbrl trained steps {f['trained_steps']}: s/step {fmt(f['trained_times'])}  (median parts: "
                f"{parts(f['parts_trained'])})"
            )
        print(
            f"fbrl learner phase (trained steps): median {f['tokens']:.0f} tokens (prompt + response, all samples)"
            f" = {f['tokens_per_s']:.0f} tokens/s"
        )
    if t:
        print(
            f"trl  s/step: {fmt(t['times'])}  (median parts: {parts(t['parts'])}; torch threads {t['threads']}; "
            f"process wall {t['wall']} s); reward per step: {fmt(t['reward'])}"
        )
        print(
            f"trl  learner phase: median {t['tokens']:.0f} tokens (prompt + completion, all samples) = "
            f"{t['tokens_per_s']:.0f} tokens/s"
        )
        g = t["grad"]
        if g:
            agree = (
                ""
                if t["agree"][0] is None
                else (
                    f"; eval scorer agreement (fbrl math vs arith.score): {t['agree'][0]}/{t['agree'][2]} before, "
                    f"{t['agree'][1]}/{t['agree'][2]} after"
                )
            )
            print(
                f"step-1 gradient, fbrl learner on TRL's samples vs TRL: cosine {g['cosine']:.6f}, norm ratio "
                f"{g['norm_fbrl'] / g['norm_trl']:.5f}{agree}"
            )
    b = run / "bench_torch.json"
    if b.exists():
        for x in json.loads(b.read_text())["results"]:
            what = "fbrl PolicyUpdater + TorchBackend, no Ray / DeepSpeed" if x.get("fbrl_updater") else "bare torch"
            print(
                f"{what} ({x['threads']} thread(s), micro-batches of <= {x['rows_per_micro_batch']} rows): "
                f"{x['step_s']:.2f} s per fwd+bwd+AdamW step of {x['tokens']} tokens = {x['tokens_per_s']:.0f} "
                f"tokens/s"
            )
    if f and t:
        same = sum(a == b for a, b in zip(f["digests"], t["digests"]))
        print(f"same prompts per step (fbrl metrics prompts_digest vs TRL's batches): {same}/{n}")
    fs = fbrl_split(run, n, f["wall"]) if f else None
    ts = trl_split(run, n, t["wall"]) if t else None
    for who, split in (("fbrl", fs), ("trl ", ts)):
        if split:
            print(_split_line(who, split))
    if fs and ts:
        whole = {k: sum(v for x, v in s.items() if "left out" not in x) for k, s in (("fbrl", fs), ("trl", ts))}
        print(
            f"whole process: fbrl {whole['fbrl']:.1f} s, trl {whole['trl']:.1f} s (without its gradient check), "
            f"fbrl/trl {whole['fbrl'] / whole['trl']:.2f}x"
        )
    mf = statistics.median(f["times"]) if f and f["times"] else float("nan")
    mt = statistics.median(t["times"]) if t and t["times"] else float("nan")
    ratio = mf / mt if mt == mt and mt > 0 else float("nan")
    trained = ""
    if f and f["skipped"] and f["trained_times"]:
        mft = statistics.median(f["trained_times"])
        trained = f" (fbrl trained steps only: {mft:.2f}, {mft / mt if mt == mt and mt > 0 else float('nan'):.2f}x)"
    eval_n = (t or {}).get("eval_n") or (f or {}).get("eval_n") or "?"
    print(
        f"SUMMARY {n} steps | median s/step: fbrl {mf:.2f}, trl {mt:.2f}, fbrl/trl {ratio:.2f}x{trained} | held-out "
        f"greedy acc (standard, {eval_n}): fbrl {acc(f['acc0'] if f else None)} -> {acc(f['acc1'] if f else None)} "
        f"({gain(f)}), trl {acc(t['acc0'] if t else None)} -> {acc(t['acc1'] if t else None)} ({gain(t)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
