"""Peak resident memory of every process of one `fbrl train` job (driver, Ray actors, vLLM, reward pool).

    python -m tools.actor_memory --pid DRIVER_PID [--every 10] [--out memory.json]
    python -m tools.actor_memory --match "fbrl train configs/smollm_rl.yaml" ...   # waits for that driver

Polls the driver's process tree (a local Ray is started by the driver, so its raylet and every actor descend from
it) and keeps, per process, the kernel's high-water mark of resident memory (`VmHWM` in /proc/PID/status: the
peak, not a sample) and its name (`ray::RankActor`, `ray::EngineHost`, ...). Runs until the driver exits, then
prints one row per process, largest first, and writes them as JSON. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def tree(root: int) -> list[int]:
    seen, todo = [], [root]
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo += children(pid)
    return seen


def peak_kib(pid: int) -> tuple[str, int] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    hwm = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
    return cmd[:80], hwm


def _is_driver(pid: int, match: str) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"python" in argv[0] and match in b" ".join(argv).decode(errors="replace")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    who = ap.add_mutually_exclusive_group(required=True)
    who.add_argument("--pid", type=int, help="the driver's pid (fbrl train)")
    who.add_argument("--match", help="wait for a python process whose command line contains this, and follow it")
    ap.add_argument("--every", type=float, default=10.0, help="seconds between polls")
    ap.add_argument("--out", default=None, help="write the table here as JSON")
    args = ap.parse_args(argv)
    while args.pid is None:
        args.pid = next(
            (
                p
                for p in (int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit())
                if p != os.getpid() and _is_driver(p, args.match)
            ),
            None,
        )
        time.sleep(0 if args.pid else 2)
    peaks: dict[int, tuple[str, int]] = {}
    while os.path.exists(f"/proc/{args.pid}"):
        for pid in tree(args.pid):
            found = peak_kib(pid)
            if found and found[1] >= peaks.get(pid, ("", -1))[1]:
                peaks[pid] = found
        time.sleep(args.every)
    rows = sorted(
        ({"pid": p, "process": c, "peak_rss_gib": round(k / 2**20, 2)} for p, (c, k) in peaks.items() if k > 50 * 1024),
        key=lambda r: -r["peak_rss_gib"],
    )
    for r in rows:
        print(f"{r['peak_rss_gib']:6.2f} GiB  {r['pid']:>7}  {r['process']}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
