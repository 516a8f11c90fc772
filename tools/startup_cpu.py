"""CPU seconds each process of an `fbrl train` job spent before its `workers ready` line: where start-up goes.

    python -m tools.startup_cpu [CONFIG] [key=value ...]       # default: configs/tiny.yaml

Starts `fbrl train CONFIG` in a fresh temporary run directory, reads its output until `workers ready`, then sums
user + system CPU time over the driver's process tree (a local Ray is started by the driver, so its daemons and
every actor descend from it), grouped by role, and stops the job. The sum over the cores is the floor of the
start-up's wall time however the work is overlapped: what the `workers ready in N s` line can at best come down
to without doing less work. Linux only.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.actor_memory import tree

ROLES = (  # (role, what its command line holds), first match wins
    ("rollout engine", "RolloutActor"),
    ("rollout engine", "EngineHost"),
    ("learner rank", "RankActor"),
    ("reward actor", "RewardHost"),
    ("driver (fbrl train)", "fbrl train"),
    ("Ray's own processes", ""),
)


def cpu_seconds(pid: int) -> tuple[float, str] | None:
    """(user + system CPU seconds, command line) of a live process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), cmd


def role(cmd: str) -> str:
    return next(name for name, mark in ROLES if mark in cmd)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", default="configs/tiny.yaml")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the job")
    ap.add_argument("--processes", action="store_true", help="also list every process with its CPU seconds")
    args = ap.parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="fbrl-startup-")) / "run"
    cmd = [sys.executable, "-m", "actors.cli", "train", args.config, f"train.run_dir={run_dir}"]
    cmd += ["logging.progress=false", *args.overrides]
    t0 = time.perf_counter()
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ready, by_role, processes = None, {}, []
    for line in job.stdout:
        if "workers ready" in line:
            ready = line.strip()
            for pid in tree(job.pid):
                found = cpu_seconds(pid)
                if found:
                    name = role(found[1]) if pid != job.pid else "driver (fbrl train)"
                    by_role[name] = by_role.get(name, 0.0) + found[0]
                    processes.append((found[0], pid, found[1]))
            break
    wall = time.perf_counter() - t0
    job.send_signal(signal.SIGINT)  # twice: stop at once, the job tears its Ray down
    time.sleep(1)
    job.send_signal(signal.SIGINT)
    job.communicate(timeout=120)
    if ready is None:
        print("the job ended before its workers were ready", file=sys.stderr)
        return 1
    print(f"{ready}\n(this tool's clock: {wall:.1f} s; {os.cpu_count()} cores)")
    for name, cpu in sorted(by_role.items(), key=lambda kv: -kv[1]):
        print(f"{cpu:7.1f} CPU s  {name}")
    if args.processes:
        for cpu, pid, command in sorted(processes, reverse=True):
            print(f"{cpu:7.1f} CPU s  pid {pid:<7d} {command[:110]}")
    total = sum(by_role.values())
    print(f"{total:7.1f} CPU s  in all: at least {total / (os.cpu_count() or 1):.1f} s of wall time on these cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
