"""docs/RELIABILITY.md's two generated tables, from the fault tests' records (tools/reliability_table.py runs them).

A record is one JSON object per passed test (`tests/fault_harness.py`'s `fault_record` writes it, the runner adds
what it measured after the test's process ended, and the commit the test ran at). `docs/reliability_records.jsonl`
holds the records both tables are rendered from, so an `--update` of a few tests re-renders the whole page.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

FIELDS = (
    "test",
    "kind",
    "wall_s",
    "commit",
    "fault",
    "staleness",
    "transport",
    "detected_s",
    "exit_code",
    "outcome",
    "steps_lost",
    "rows_once",
    "data_lost",
    "temporaries_left",
    "processes_left",
)
HEADER = [
    "| fault (test; CI or slow; wall s; commit) | staleness, transport | detected after | exit code | outcome "
    "| steps lost | metrics rows once each | data lost | temporaries left | processes left |",
    "|---|---|---|---|---|---|---|---|---|---|",
]
TRANSPORTS = ("file", "ray", "native_ray", "nccl", "ipc")
GPU_ONLY = ("nccl", "ipc")
# the kinds of fault the transport x staleness table has a row for (a record's `matrix`), in its order
MATRIX_ROWS = ("rollout actor dies", "learner rank dies", "an engine hangs", "partly non-finite update")

# The code the fault table covers: a commit after a row's own that touches one of these makes the row stale
# (tests/test_reliability_table.py fails until the table is generated again).
COVERED = (
    "tests/test_faults.py",
    "tests/test_faults_async.py",
    "tests/test_faults_longrun.py",
    "tests/fault_harness.py",
    "tests/test_reliability_waits.py",
    "tests/test_reliability_resume.py",
    "tests/test_reliability_signals.py",
    "tests/test_reliability_disk.py",
    "actors/supervision.py",
    "actors/rollout_fleet.py",
    "actors/learner_group.py",
    "actors/reward_workers.py",
    "actors/weight_sync.py",
    "rl/loop.py",
    "rl/train/faults.py",
    "rl/train/checkpoints.py",
    "rl/train/run_dir.py",
    "rl/train/rollout_queue.py",
    "rl/atomic_files.py",
)


# The code the bad-input table covers: the checks `fbrl train` runs before any worker starts, and the script that runs them.
INPUT_COVERED = ("actors/cli/preflight.py", "actors/cli/launch.py", "bench/bad_input.py")


def cell(text) -> str:
    """A value as one markdown table cell: on one line, its pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def seconds(value) -> str:
    """`detected_s`: a number of seconds, or the test's words where nothing is waited for."""
    return f"{float(value):.1f} s" if isinstance(value, (int, float)) else str(value)


def check(records: list[dict]) -> None:
    """Refuses records that would make a half-made-up row: a missing or empty field, an unknown kind."""
    if not records:
        raise ValueError("no fault records: nothing to put in the table")
    for i, r in enumerate(records):
        missing = [f for f in FIELDS if r.get(f) in (None, "")]
        if missing:
            raise ValueError(f"fault record {i} ({r.get('test', 'unnamed test')}) lacks {', '.join(missing)}")
        if r["kind"] not in ("CI", "slow"):
            raise ValueError(f"fault record {i} ({r['test']}): kind must be CI or slow, got {r['kind']!r}")
        if r.get("matrix") not in (None, *MATRIX_ROWS):
            raise ValueError(f"fault record {i} ({r['test']}): matrix must be one of {MATRIX_ROWS}")


def render(records: list[dict]) -> list[str]:
    """The fault table's lines, one row per record in the order given."""
    check(records)
    rows = list(HEADER)
    for r in records:
        kind = "**CI**" if r["kind"] == "CI" else "slow"
        values = (
            f"s = {r['staleness']}, {r['transport']}",
            seconds(r["detected_s"]),
            r["exit_code"],
            r["outcome"],
            r["steps_lost"],
            r["rows_once"],
            r["data_lost"],
            r["temporaries_left"],
            r["processes_left"],
        )
        rows.append(
            f"| {cell(r['fault'])} (`{r['test']}`; {kind}; {float(r['wall_s']):.0f} s; {r['commit']}) | "
            + " | ".join(cell(v) for v in values)
            + " |"
        )
    return rows


def transport_of(record: dict) -> str:
    return str(record["transport"]).split()[0]


def matrix(records: list[dict]) -> list[str]:
    """The transport x staleness table: for each kind of fault and staleness (0, >= 1), what each transport's runs
    did, from the records that name that kind; a cell no record fills says it was not run, and why when this
    machine cannot run it (nccl and ipc move GPU tensors)."""
    check(records)
    lines = [
        "| fault | staleness | " + " | ".join(TRANSPORTS) + " |",
        "|---|---|" + "---|" * len(TRANSPORTS),
    ]
    for kind in MATRIX_ROWS:
        for stale in ("0", "≥ 1"):
            cells = []
            for transport in TRANSPORTS:
                hits = [
                    r
                    for r in records
                    if r.get("matrix") == kind
                    and transport_of(r) == transport
                    and ("0" if int(r["staleness"]) == 0 else "≥ 1") == stale
                ]
                if hits:
                    cells.append(
                        "; ".join(f"`{r['test']}`: exit {r['exit_code']}, steps lost {r['steps_lost']}" for r in hits)
                    )
                elif transport in GPU_ONLY:
                    cells.append("not run: needs GPUs (stand-ins only: tests/test_native_sync_faults.py)")
                else:
                    cells.append("not run")
            lines.append(f"| {kind} | {stale} | " + " | ".join(cell(c) for c in cells) + " |")
    return lines


def rewrite(page: str, begin: str, end: str, lines: list[str]) -> str:
    """`page` with everything between the `begin` and `end` markers replaced by `lines`."""
    if page.count(begin) != 1 or page.count(end) != 1 or page.index(begin) > page.index(end):
        raise ValueError(f"the page needs exactly one {begin!r} followed by one {end!r}")
    head, rest = page.split(begin)
    _, tail = rest.split(end)
    return head + begin + "\n" + "\n".join(lines) + "\n" + end + tail


def merged(old: list[dict], new: list[dict], names: list[str], allow_missing: bool = False) -> list[dict]:
    """`old` records with `new` ones in place of the same tests' (or added), in the order of `names` (every fault
    test's case, `test_x[case]`). Refused when a case would have no record, unless `allow_missing`."""
    by_test = {r["test"]: r for r in old} | {r["test"]: r for r in new}
    missing = [n for n in names if n not in by_test]
    if missing and not allow_missing:
        raise ValueError(f"no record for {', '.join(missing)}: run them too (--update ID ...)")
    return [by_test[n] for n in names if n in by_test]


def git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)


def staleness(commit: str, root: Path, paths: tuple[str, ...]) -> str | None:
    """Why a table measured at `commit` no longer describes the code at `paths` (None: it does): a commit since
    touched them, or `commit` ran on uncommitted changes or is not a commit of this checkout."""
    if " " in commit or git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        return f"recorded at {commit!r}, not a commit of this checkout"
    changed = git(root, "log", "--format=%h %s", f"{commit}..HEAD", "--", *paths).stdout.strip()
    if changed:
        return f"recorded at {commit}, older than the code they cover (changed since: {changed.splitlines()[0]} ...)"
    return None


def stale_rows(records: list[dict], root: Path) -> list[str]:
    """One line per commit of `records` that is stale for the code the fault table covers (`COVERED`)."""
    problems = []
    for commit in dict.fromkeys(str(r["commit"]) for r in records):
        why = staleness(commit, root, COVERED)
        if why:
            problems.append(f"{', '.join(r['test'] for r in records if str(r['commit']) == commit)}: {why}")
    return problems
