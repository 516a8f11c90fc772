"""Soak test: the default job for many steps with its rollout actor killed every ~50 steps.

    python -m tools.soak                       # 300 steps of configs/tiny.yaml, a SIGKILL every 50 steps
    python -m tools.soak --steps 60 --kill-every 20 --out runs/soak-short

Runs `fbrl train configs/tiny.yaml rollout.engine=vllm train.steps=N` (the vLLM engine: the one real-model jobs
decode with, and the one whose memory a long job must keep flat; later overrides win) as a subprocess and, while
it runs:
- SIGKILLs the rollout actor's process (`ray::RolloutActor`) each time the job passes another `--kill-every` steps;
- samples the memory of the driver and of every actor (engine, learner ranks, reward actor and its pool, Ray's own
  processes) every `--sample-s` seconds, with the step the job is at: RSS, and USS / PSS (RSS counts shared pages
  the process touched, Ray's object store among them; USS only what the process alone holds); for the rollout
  actor and the driver also their RSS by mapping (the object store, the KV cache and other large tensors, the
  heap, files).
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
ROLES = (
    ("ray::RolloutActor", "rollout actor"),
    ("ray::EngineHost", "rollout actor"),
    ("ray::RankActor", "learner rank"),
    ("ray::RewardHost", "reward actor"),
    ("multiprocessing.forkserver", "reward pool"),
    ("raylet", "ray raylet"),
    ("gcs_server", "ray gcs"),
)


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


def memory_mib(pid: int) -> dict[str, float] | None:
    """RSS, PSS and USS of a process, in MiB, from /proc/PID/smaps_rollup. USS (Private_Clean + Private_Dirty, as
    psutil's `memory_full_info().uss`) is the memory only this process holds; RSS also counts shared pages it has
    touched (libraries, and Ray's object store, which is mapped into every worker)."""
    try:
        fields = {}
        for line in open(f"/proc/{pid}/smaps_rollup"):
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) / 1024
    except OSError:
        return None
    if "Rss" not in fields:
        return None
    return {
        "rss_mib": fields["Rss"],
        "pss_mib": fields.get("Pss", 0.0),
        "uss_mib": fields.get("Private_Clean", 0.0) + fields.get("Private_Dirty", 0.0),
    }


BIG_MAPPING_KIB = 256 * 1024


def rss_by_mapping(pid: int) -> dict[str, float] | None:
    """The resident memory of a process split by what is mapped, in MiB, from /proc/PID/smaps: `plasma` (Ray's
    object store, /dev/shm/plasma*), `big_anon` (anonymous mappings of 256 MiB or more: vLLM's KV cache and other
    large tensors), `heap` (malloc's main arena, the brk heap: Python objects and small allocations of the main
    thread), `anon` (the other anonymous mappings: malloc's per-thread arenas, mid-sized tensors, stacks), `file`
    (libraries and other mapped files). Costly on a large process (thousands of mappings), so sampled for the
    rollout actor and the driver only."""
    out = {"plasma": 0.0, "big_anon": 0.0, "heap": 0.0, "anon": 0.0, "file": 0.0}
    kind, size = "anon", 0
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split(None, 6)
                if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                    path = head[5].strip() if len(head) > 5 else ""
                    lo, hi = head[0].split("-")
                    size = (int(hi, 16) - int(lo, 16)) // 1024
                    if "plasma" in path:
                        kind = "plasma"
                    elif path == "[heap]":  # malloc's main arena (brk)
                        kind = "heap"
                    elif not path or path.startswith("["):  # anonymous: mmapped tensors, malloc's other arenas
                        kind = "big_anon" if size >= BIG_MAPPING_KIB else "anon"
                    else:
                        kind = "file"
                elif head[0] == "Rss:":
                    out[kind] += int(head[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return {f"{k}_mib": round(v, 1) for k, v in out.items()}


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


def memory_row(process: str, rows: list[dict], warmup: int) -> dict | None:
    """One process's line of the memory table: RSS and USS at its first and last step, and their growth after
    warm-up; for the rollout actor and the driver also what their RSS grew by after warm-up, by mapping
    (`rss_by_mapping`)."""
    by_step = {r["step"]: r for r in rows}  # the last sample at each step
    if len(by_step) < 2:
        return None
    first, last = min(by_step), max(by_step)
    # warm-up: `warmup` steps after the process's first sample; a short life (a rollout actor killed every 50
    # steps) gets 10
    warm = first + (warmup if last - first >= 2 * warmup else 10)
    out = {"process": process, "first_step": first, "last_step": last, "warmup_until_step": warm}
    for m in ("rss", "uss", "pss"):
        pts = sorted((s, r[f"{m}_mib"]) for s, r in by_step.items() if f"{m}_mib" in r)
        if not pts:
            continue
        out.update(
            {
                f"{m}_start_mib": pts[0][1],
                f"{m}_end_mib": pts[-1][1],
                f"{m}_max_mib": max(v for _, v in pts),
                f"{m}_growth_pct_per_100_steps": growth_per_100(pts, warm),
            }
        )
    after = [by_step[s] for s in sorted(by_step) if s >= warm and "plasma_mib" in by_step[s]]
    if len(after) >= 2:
        out["rss_change_after_warmup_by_mapping_mib"] = {
            k.removesuffix("_mib"): round(after[-1][k] - after[0][k], 1)
            for k in ("plasma_mib", "big_anon_mib", "heap_mib", "anon_mib", "file_mib")
            if k in after[0]
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--kill-every", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=50, help="steps before RSS growth is measured")
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--out", default="runs/soak")
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="SIGTERM the job after this long (it checkpoints its step and exits 143); the summary "
        "reports the steps completed",
    )
    ap.add_argument("overrides", nargs="*", help="more `fbrl train` overrides")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    mark = uuid.uuid4().hex
    env = dict(
        os.environ,
        FBRL_SOAK_MARK=mark,
        WANDB_MODE="offline",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        TOKENIZERS_PARALLELISM="false",
    )
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    cmd = [
        sys.executable,
        "-m",
        "actors.cli",
        "train",
        str(ROOT / "configs" / "tiny.yaml"),
        "rollout.engine=vllm",
        f"train.steps={args.steps}",
        f"train.run_dir={run_dir}",
        "logging.progress=false",
        "--overwrite",
        *args.overrides,
    ]
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
                mem = memory_mib(pid)
                if mem is not None:
                    row = {
                        "t": round(now, 1),
                        "step": step,
                        "pid": pid,
                        "role": role_of(pid, cmdline, job.pid),
                        **{k: round(v, 1) for k, v in mem.items()},
                    }
                    if row["role"] in ("rollout actor", "driver"):
                        row.update(rss_by_mapping(pid) or {})
                    samples.append(row)
                    f.write(json.dumps(row) + "\n")
            f.flush()
            if step >= next_kill and step < args.steps:
                engines = [pid for pid, c in procs.items() if role_of(pid, c, job.pid) == "rollout actor"]
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
    series: dict[str, list[dict]] = {}
    for s in samples:  # one series per process; the roles with one process each are named by role alone
        single = s["role"] in ("driver", "reward actor", "ray raylet", "ray gcs")
        key = s["role"] if single else f"{s['role']} (pid {s['pid']})"
        series.setdefault(key, []).append(s)
    table = [row for key, rows in sorted(series.items()) if (row := memory_row(key, rows, args.warmup))]
    summary = {
        "command": " ".join(cmd),
        "exit_code": job.returncode,
        "wall_s": round(wall, 1),
        "steps_requested": args.steps,
        "steps_completed": len(steps_done),
        "every_step_once": steps_done == list(range(1, args.steps + 1)),
        "stopped_by_time_limit_at_step": stopped_at,
        "kills": kills,
        "faults": {k: v for k, v in last.items() if k.startswith("faults/")},
        "processes_left": [{"pid": p, "cmd": c[:100]} for p, c in left.items()],
        "memory": table,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(
        f"exit code {job.returncode}, {len(steps_done)}/{args.steps} steps in {wall:.0f} s, "
        f"{len(kills)} rollout actor kills, faults {summary['faults']}, {len(left)} processes left"
    )
    print(
        "| process | steps | RSS start → end (max), MiB | RSS growth / 100 steps after warm-up "
        "| USS start → end, MiB | USS growth |"
    )
    print("|---|---|---|---|---|---|")
    pct = lambda g: "-" if g is None else f"{g:+.1f} %"  # noqa: E731
    for r in table:
        print(
            f"| {r['process']} | {r['first_step']}–{r['last_step']} | {r['rss_start_mib']:.0f} → "
            f"{r['rss_end_mib']:.0f} ({r['rss_max_mib']:.0f}) | {pct(r['rss_growth_pct_per_100_steps'])} | "
            f"{r['uss_start_mib']:.0f} → {r['uss_end_mib']:.0f} | {pct(r['uss_growth_pct_per_100_steps'])} |"
        )
    for r in table:
        if "rss_change_after_warmup_by_mapping_mib" in r:
            print(
                f"{r['process']}: RSS change from step {r['warmup_until_step']} to {r['last_step']} by mapping "
                f"(MiB): {r['rss_change_after_warmup_by_mapping_mib']}"
            )
    return 0 if job.returncode == 0 and summary["every_step_once"] and not left else 1


if __name__ == "__main__":
    sys.exit(main())
