"""Writes a reader never sees half of: a file written beside its final name and renamed over it, and a directory
built beside its final name and swapped in. Checkpoints, the exported policy, adapters, the run's own files and
generated datasets all go through these, so a crash leaves the last complete version in place."""

from __future__ import annotations

import os
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
