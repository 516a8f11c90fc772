"""A calculator tool on a real FBT: RL with and without it, from the FBT and from its matched standard model.

    .venv/bin/python scripts/smollm_calc.py --gsm8k GSM8K_TRAIN.jsonl [--work runs/smollm2] [--out runs/smollm_calc]
        [--steps N] [key=value ...]

(`make smollm-calc GSM8K=...` runs it; docs/TOOLS.md.) Each stage keeps what it made, so the command continues
where it stopped:

1. `<work>/fbt-identity` (scripts/smollm_rl.py's `prepare`).
2. `<work>/calc-data/{train,val}.jsonl`: GSM8K's training rows with their calculator annotations kept as tool
   calls, beside generated word problems written the same way (`data.calculator`).
3. Multi-pass continued training (configs/smollm_fbt.yaml) on them → `<work>/fbt-calc`, and its matched one-pass
   standard model → `<work>/std-calc`, each trained just before its first RL run. The tool's part of each
   annotation (`24>>`) is not trained on and gets no feedback, as a rollout reads it. `--pretrain-stop-after N`
   ends both at step N of the 64-step schedule (the checkpoint the full run writes at that step).
4. Four RL runs of configs/smollm_calc_rl.yaml under `OUT/`: {fbt, std} × {tool, notool}. The FBT decodes soft,
   the standard model standard; the tool runs add `env: {name: calculator}`.
5. `OUT/comparison.md` / `.json`: held-out greedy accuracy (300 word problems of 1-2 operations, standard
   numbers) at the start and the end of each run; tool vs no tool for each model, paired on the same problems
   (McNemar's exact p); tool calls per problem and how often the calculator's result is then written; the
   latent channel at the first token after a calculator result (the FBT's tool run).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
T0 = time.time()
RUNS = {  # name: (model under <work>, decode mode, with the calculator)
    "fbt-tool": ("fbt-calc", "soft", True),
    "fbt-notool": ("fbt-calc", "soft", False),
    "std-tool": ("std-calc", "standard", True),
    "std-notool": ("std-calc", "standard", False),
}


def log(msg: str) -> None:
    print(f"[smollm-calc {time.time() - T0:6.0f}s] {msg}", flush=True)


def write_data(gsm8k: Path, out: Path, word_problems: int) -> dict[str, int]:
    from rl.data import gsm8k as g
    from rl.data import word_problems as wp
    from rl.data.jsonl import write_jsonl

    counts = {}
    for split in ("train", "val"):
        rows = g.rows_from_file(gsm8k, split, shots=0, calculator=True)
        if split == "train" and word_problems:
            made = wp.generate("train", word_problems, difficulties=(1, 2, 3, 4), shots=0, calculator=True)
            rows += [dict(r, source="word_problems") for r in made]
        write_jsonl(rows, out / f"{split}.jsonl")
        counts[split] = len(rows)
    return counts


def continued_training(work: Path, start: Path, data: Path, names: set[str], stop_after: int | None = None) -> None:
    """The continued-training models among `names` ({"fbt-calc", "std-calc"}) that do not exist yet."""
    from rl.config import load_config
    from rl.pretrain.trainer import train

    common = [f"model.path={start}", f"data.train_path={data / 'train.jsonl'}", f"data.test_path={data / 'val.jsonl'}"]
    common += [f"pretrain.stop_after={stop_after}"] if stop_after else []
    for name, extra in (("fbt-calc", []), ("std-calc", ["pretrain.pass_schedule=[[1.0, 1]]"])):
        if name not in names:
            continue
        if (work / name / "config.json").is_file():
            log(f"{work / name} exists: continued training skipped")
            continue
        cfg = load_config(ROOT / "configs" / "smollm_fbt.yaml", [*common, f"pretrain.out_dir={work / name}", *extra])
        log(
            f"continued training -> {work / name} ({cfg.pretrain.stop_after or cfg.pretrain.steps} of {cfg.pretrain.steps} steps)"
        )
        summary = train(cfg, log=lambda m: log(f"  {m}"))
        log(f"{name}: {summary['wall_time_s']:.0f}s; val loss per pass {summary['final_val_loss_per_pass']}")


def rl_run(name: str, work: Path, out: Path, steps: int, overrides: list[str]) -> Path:
    from actors.cli import main as fbrl

    model, mode, tool = RUNS[name]
    run = out / name
    if (run / "eval").is_dir() and len(list((run / "eval").glob("step_*.json"))) >= 2:
        log(f"{run}: finished earlier, kept")
        return run
    argv = ["train", str(ROOT / "configs" / "smollm_calc_rl.yaml"), f"model.path={work / model}"]
    argv += [f"rollout.decode_mode={mode}", f"train.eval_decode_modes=[{mode}]", f"train.steps={steps}"]
    argv += [f"train.eval_every={steps}", f"train.checkpoint_every={steps}", f"train.run_dir={run}", "--overwrite"]
    argv += ["likelihood.estimator=replay" if mode == "soft" else "likelihood.estimator=standard"]
    argv += ["env={name: calculator}"] if tool else []
    log(f"RL {name}: fbrl {' '.join(argv[1:] + overrides)}")
    if fbrl(argv + overrides) != 0:
        raise SystemExit(f"RL run {name} failed")
    return run


def tool_use(record: dict) -> dict:
    """Per problem: calculator calls, and the share of results the model then wrote out ("<<a*b=" "12>>" "12")."""
    calls = record.get("tool_calls") or []
    used = total = 0
    for text in record["responses"]:
        for m in re.finditer(r"<<[^<>=]*=([^<>]*)>>", text):
            total += 1
            used += text[m.end() :].lstrip().startswith(m.group(1).strip())
    return {
        "calls_per_problem": sum(calls) / len(calls) if calls else None,
        "results_written": used / total if total else None,
    }


def latent_channel(run: Path) -> dict:
    """Mean over the run's steps of the latent-channel metrics (an FBT's): the fed-back state's share of the fused
    input and the policy's shift from it (nats per token), over all response tokens and at the first token after a
    calculator result."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    keys = ("state_share", "state_share_after_tool", "policy_shift", "policy_shift_after_tool")
    res = {}
    for key in keys:
        vals = [r[f"learner/latent/{key}"] for r in rows if f"learner/latent/{key}" in r]
        if vals:
            res[key] = sum(vals) / len(vals)
    return res


def summarize(out: Path) -> dict:
    sys.path.insert(0, str(ROOT / "scripts"))
    from smollm_fbt_rl import paired_difference

    from rl.train.run_dir import RunDir

    res = {"runs": {}, "tool_vs_notool": {}}
    ends = {}
    for name, (_, mode, _tool) in RUNS.items():
        if not (out / name).is_dir():
            continue
        evals = RunDir(str(out / name)).read_evals()
        if len(evals) < 2:
            continue
        first, last = evals[0]["modes"][mode], evals[-1]["modes"][mode]
        ends[name] = last["strict"]
        res["runs"][name] = {
            "start": sum(first["strict"]) / len(first["strict"]),
            "end": sum(last["strict"]) / len(last["strict"]),
            "lift": paired_difference(first["strict"], last["strict"]),
            "tool_use_end": tool_use(last),
            "latent": latent_channel(out / name),
        }
    for model in ("fbt", "std"):
        if f"{model}-tool" in ends and f"{model}-notool" in ends:
            res["tool_vs_notool"][model] = paired_difference(ends[f"{model}-notool"], ends[f"{model}-tool"])
    (out / "comparison.json").write_text(json.dumps(res, indent=1))
    lines = [
        "| run | start | end | lift (points, p) | tool calls / problem | results written | state share after a "
        "result (all tokens) | policy shift after a result (all tokens) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    num = lambda v, f="{:.3f}": "—" if v is None else f.format(v)
    for name, r in res["runs"].items():
        t, lat = r["tool_use_end"], r["latent"]
        lines.append(
            f"| {name} | {r['start']:.3f} | {r['end']:.3f} | {r['lift']['diff_points']:+.1f} "
            f"(p={r['lift']['p_value']:.3g}) | {num(t['calls_per_problem'], '{:.2f}')} | {num(t['results_written'])} | "
            f"{num(lat.get('state_share_after_tool'))} ({num(lat.get('state_share'))}) | "
            f"{num(lat.get('policy_shift_after_tool'))} ({num(lat.get('policy_shift'))}) |"
        )
    for model, d in res["tool_vs_notool"].items():
        lines.append(f"\n{model}: tool − no tool {d['diff_points']:+.1f} points (n={d['n']}, p={d['p_value']:.3g})")
    (out / "comparison.md").write_text("\n".join(lines) + "\n")
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gsm8k", required=True, help="GSM8K's training split as JSONL (question, answer per line)")
    ap.add_argument("--work", default=str(ROOT / "runs" / "smollm2"))
    ap.add_argument("--out", default=str(ROOT / "runs" / "smollm_calc"))
    ap.add_argument("--steps", type=int, default=5, help="RL steps per run")
    ap.add_argument(
        "--pretrain-stop-after", type=int, default=16, help="continued training: end at this step of its schedule"
    )
    ap.add_argument("--word-problems", type=int, default=2000)
    ap.add_argument("--runs", nargs="*", default=list(RUNS), choices=list(RUNS))
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides of the RL runs")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from scripts.smollm_rl import prepare

    work, out = Path(args.work), Path(args.out)
    start = prepare(work, log=log)
    data = work / "calc-data"
    if not (data / "train.jsonl").is_file():
        log(f"data: {write_data(Path(args.gsm8k), data, args.word_problems)} rows -> {data}")
    for name in args.runs:  # each model trained just before its first run: a cut study has whole pairs
        continued_training(work, start, data, {RUNS[name][0]}, args.pretrain_stop_after)
        rl_run(name, work, out, args.steps, args.overrides)
        summarize(out)
    log((out / "comparison.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
