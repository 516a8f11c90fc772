"""Writes a reader never sees half of: a file written beside its final name and renamed over it, and a directory
built beside its final name and swapped in. Checkpoints, the exported policy, adapters, the run's own files and
generated datasets all go through these, so a crash leaves the last complete version in place."""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path


def write_text(path: str | Path, text: str) -> None:
    """`text` into `path`: written and fsynced under a temporary name beside it, then renamed over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def replace_dir(tmp: str | Path, final: str | Path) -> None:
    """Swap the fully written directory `tmp` in as `final`. A non-empty directory cannot be renamed over, so the
    old one is first renamed aside and removed after the swap: at every moment one complete directory exists under
    one of the two names."""
    tmp, final = Path(tmp), Path(final)
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    """A process with this id runs on this machine (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


# The temporaries of the writers above and of the checkpoint writer, each ending in its writer's pid:
# `.NAME.old-PID` (replace_dir's old copy), `.NAME.tmp-PID` (write_text, a policy export),
# `.tmp-NAME-PID` / `.tmp-pruned-NAME-PID` (a checkpoint being written or deleted).
_OLD = re.compile(r"\.(?P<name>.+)\.old-(?P<pid>\d+)")
_TMP = re.compile(r"\.(?:.+\.)?tmp-(?:.+-)?(?P<pid>\d+)")


def is_temporary(name: str) -> bool:
    """`name` is one of the temporaries above (`.NAME.old-PID`, `.NAME.tmp-PID`, `.tmp-NAME-PID`)."""
    return bool(_OLD.fullmatch(name) or _TMP.fullmatch(name))


def sweep_leftovers(parent: str | Path) -> list[str]:
    """Recover or delete what writers that are gone (a dead pid, or this process, which is writing nothing when it
    calls this) left in `parent`: a directory renamed aside by `replace_dir` whose replacement never arrived is
    renamed back (the last complete version); other old copies and temporaries are deleted. Returns one line per
    entry handled. Call it only while holding the directory (the run-directory lock)."""
    done = []
    for entry in sorted(Path(parent).iterdir()) if Path(parent).is_dir() else []:
        m = _OLD.fullmatch(entry.name) or _TMP.fullmatch(entry.name)
        if m is None or (int(m["pid"]) != os.getpid() and pid_alive(int(m["pid"]))):
            continue
        final = entry.with_name(m["name"]) if m.re is _OLD else None
        if final is not None and not final.exists():
            os.replace(entry, final)
            done.append(f"{final}: restored from {entry.name} (a crash between replace_dir's two renames)")
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        done.append(f"{entry}: deleted (left by process {m['pid']}, which is gone)")
    return done


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """fsync every file under `root`, then every directory bottom up (new names are durable only so)."""
    dirs = []
    for here, _, files in os.walk(root):
        dirs.append(Path(here))
        for name in files:
            fd = os.open(Path(here) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for d in reversed(dirs):
        fsync_dir(d)


def disk_full(error: BaseException) -> bool:
    """`error` says the disk (or the user's quota) has no room left: an OSError with ENOSPC / EDQUOT, or a worker's
    error that carries one in its text (Ray re-raises an actor's exception as its own type)."""
    text = str(error)
    return (
        getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
        or "No space left on device" in text
        or "Disk quota exceeded" in text
    )
