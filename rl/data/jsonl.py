"""JSON-lines files (errors name `file:line`) and `DataError`, the error of a dataset problem. The task generators
(rl/data/arith.py, ...) and the loaders (rl/data/loaders.py) both use them."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from rl.atomic_files import write_text
from rl.errors import InputError


class DataError(InputError):
    """A dataset problem; the message names the file (and line or row) at fault."""


def write_jsonl(rows: Iterable[dict], path: str | Path) -> None:
    """Write rows as JSON lines, atomically (a half-written file never appears under `path`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def read_jsonl(path: str | Path) -> list[dict]:
    """Every non-blank line must be a JSON object; errors name `file:line`."""
    return [row for _, row in read_numbered(path)]


def read_numbered(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, row) of every non-blank line, so that a later error can name the line."""
    out = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path}:{lineno}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                    "JSON lines files must be UTF-8 encoded"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            out.append((lineno, row))
    return out
