"""Soak test: the default job for many steps with its rollout actor killed every ~50 steps.

    python bench/soak.py                       # 300 steps of configs/tiny.yaml, a SIGKILL every 50 steps
    python bench/soak.py --steps 60 --kill-every 20 --out runs/soak-short

Runs `fbrl train configs/tiny.yaml train.steps=N` as a subprocess and, while it runs:
- SIGKILLs the rollout actor's process (`ray::EngineHost`) each time the job passes another `--kill-every` steps;
- samples the resident memory (RSS) of the driver and of every actor (engine, learner ranks, reward actor and its
  pool, Ray's own processes) every `--sample-s` seconds, with the step the job is at.
After the job exits it counts the processes of the job that are still alive (everything the job started carries
an environment marker). Goals (docs/RELIABILITY.md): every step finishes, RSS grows < 5 % per 100 steps after
warm-up, 0 processes left.

Writes OUT/samples.jsonl (one row per process per sample), OUT/summary.json and prints the table that goes into
docs/RELIABILITY.md. The rollout actor is restarted every kill, so its growth is measured within each life.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A process's role from its command line (Ray names actor processes `ray::ClassName[.method]`).
ROLES = (("ray::EngineHost", "rollout actor"), ("ray::RankActor", "learner rank"), ("ray::RewardHost", "reward actor"),
         ("multiprocessing.forkserver", "reward pool"), ("raylet", "ray raylet"), ("gcs_server", "ray gcs"))


def job_processes(mark: str) -> dict[int, str]:
    """{pid: command line} of live processes carrying FBRL_SOAK_MARK=mark (the driver and all it started)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if f"FBRL_SOAK_MARK={mark}".encode() not in open(f"/proc/{name}/environ", "rb").read().split(b"\0"):
                continue
            if open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            out[int(name)] = open(f"/proc/{name}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            pass
    return out


def rss_mib(pid: int) -> float | None:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def role_of(pid: int, cmd: str, driver: int) -> str:
    if pid == driver:
        return "driver"
    for needle, role in ROLES:
        if needle in cmd:
            return role
    return "other"


def last_step(metrics: Path) -> int:
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError):
            continue
    return 0


def growth_per_100(points: list[tuple[int, float]], warmup: int) -> float | None:
    """Least-squares slope of RSS over steps after `warmup`, as % of the fitted RSS at warm-up, per 100 steps."""
    pts = [(s, r) for s, r in points if s >= warmup]
    if len(pts) < 3 or pts[-1][0] - pts[0][0] < 10:
        return None
    n = len(pts)
    ms, mr = sum(s for s, _ in pts) / n, sum(r for _, r in pts) / n
    var = sum((s - ms) ** 2 for s, _ in pts)
    if var == 0:
        return None
    slope = sum((s - ms) * (r - mr) for s, r in pts) / var
    base = mr + slope * (pts[0][0] - ms)
    return 100.0 * slope * 100 / base


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--kill-every", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=50, help="steps before RSS growth is measured")
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--out", default="runs/soak")
    ap.add_argument("--max-minutes", type=float, default=None,
                    help="SIGTERM the job after this long (it checkpoints its step and exits 143); the summary "
                         "reports the steps completed")
    ap.add_argument("overrides", nargs="*", help="more `fbrl train` overrides")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    mark = uuid.uuid4().hex
    env = dict(os.environ, FBRL_SOAK_MARK=mark, WANDB_MODE="offline", RAY_AUTH_MODE="disabled",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    cmd = [sys.executable, "-m", "actors.cli", "train", str(ROOT / "configs" / "tiny.yaml"),
           f"train.steps={args.steps}", f"train.run_dir={run_dir}", "logging.progress=false", "--overwrite",
           *args.overrides]
    log = open(out / "train.log", "w")
    t0 = time.monotonic()
    job = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    samples, kills, next_kill, stopped_at = [], [], args.kill_every, None
    with open(out / "samples.jsonl", "w") as f:
        while job.poll() is None:
            step = last_step(run_dir / "metrics.jsonl")
            procs = job_processes(mark)
            now = time.monotonic() - t0
            for pid, cmdline in procs.items():
                rss = rss_mib(pid)
                if rss is not None:
                    row = {"t": round(now, 1), "step": step, "pid": pid, "role": role_of(pid, cmdline, job.pid),
                           "rss_mib": round(rss, 1)}
                    samples.append(row)
                    f.write(json.dumps(row) + "\n")
            f.flush()
            if step >= next_kill and step < args.steps:
                engines = [pid for pid, c in procs.items() if "ray::EngineHost" in c]
                for pid in engines:
                    os.kill(pid, signal.SIGKILL)
                kills.append({"step": step, "pids": engines, "t": round(now, 1)})
                print(f"[soak] step {step}: SIGKILL rollout actor {engines}", flush=True)
                next_kill += args.kill_every
            if args.max_minutes is not None and stopped_at is None and now > 60 * args.max_minutes:
                job.send_signal(signal.SIGTERM)
                stopped_at = step
                print(f"[soak] {args.max_minutes} minutes are up at step {step}: SIGTERM to the job", flush=True)
            time.sleep(args.sample_s)
    wall = time.monotonic() - t0
    time.sleep(5)  # what is still alive 5 s after the driver exited was left behind
    left = job_processes(mark)
    for pid in left:  # clean up after reporting them
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps_done = sorted({m["step"] for m in metrics if m["step"] > 0})
    last = metrics[-1] if metrics else {}
    # growth: long-lived roles over the whole run; the rollout actor within each life (pid)
    series: dict[str, list[tuple[int, float]]] = {}
    for s in samples:  # one series per process; the roles with one process each are named by role alone
        single = s["role"] in ("driver", "reward actor", "ray raylet", "ray gcs")
        key = s["role"] if single else f"{s['role']} (pid {s['pid']})"
        series.setdefault(key, []).append((s["step"], s["rss_mib"]))
    table = []
    for key, pts in sorted(series.items()):
        by_step: dict[int, float] = {}
        for st, r in pts:
            by_step[st] = r
        if len(by_step) < 2:
            continue
        # warm-up: `--warmup` steps after the process's first sample; a short life (a rollout actor killed every
        # 50 steps) gets 10
        life = max(by_step) - min(by_step)
        warm = min(by_step) + (args.warmup if life >= 2 * args.warmup else 10)
        table.append({"process": key, "first_step": min(by_step), "last_step": max(by_step),
                      "rss_start_mib": by_step[min(by_step)], "rss_end_mib": by_step[max(by_step)],
                      "rss_max_mib": max(by_step.values()),
                      "growth_pct_per_100_steps": growth_per_100(sorted(by_step.items()), warm)})
    summary = {"command": " ".join(cmd), "exit_code": job.returncode, "wall_s": round(wall, 1),
               "steps_requested": args.steps, "steps_completed": len(steps_done),
               "every_step_once": steps_done == list(range(1, args.steps + 1)),
               "stopped_by_time_limit_at_step": stopped_at, "kills": kills, "faults": {k: v for k, v in last.items() if k.startswith("faults/")},
               "processes_left": [{"pid": p, "cmd": c[:100]} for p, c in left.items()], "rss": table}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"exit code {job.returncode}, {len(steps_done)}/{args.steps} steps in {wall:.0f} s, "
          f"{len(kills)} rollout actor kills, faults {summary['faults']}, {len(left)} processes left")
    print("| process | steps | RSS start → end (max), MiB | growth / 100 steps after warm-up |")
    print("|---|---|---|---|")
    for r in table:
        g = r["growth_pct_per_100_steps"]
        print(f"| {r['process']} | {r['first_step']}–{r['last_step']} | {r['rss_start_mib']:.0f} → "
              f"{r['rss_end_mib']:.0f} ({r['rss_max_mib']:.0f}) | {'-' if g is None else f'{g:+.1f} %'} |")
    return 0 if job.returncode == 0 and summary["every_step_once"] and not left else 1


if __name__ == "__main__":
    sys.exit(main())
