"""`train.keep_best`: the n best checkpoints by a metric of metrics.jsonl, which pruning never deletes, listed in
RUN_DIR/checkpoints/best.json.

A checkpoint's value is the metric in its own step's row. The ranking is taken again at every checkpoint from
metrics.jsonl (read incrementally: the file only grows, except when a resume rewrites it) and the complete
checkpoints on disk, so a resumed run, a rebuilt learner (whose rows after the restored step are dropped) and a
resume that changes the metric all keep the right ones. best.json is the record for the user and for tools:

    {"metric": "eval_accuracy", "mode": "max", "n": 2,
     "checkpoints": [{"step": 40, "name": "step_000040", "value": 0.71}, ...]}     best first
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

from rl.atomic_files import fsync_dir, write_text
from rl.config.checkpointing import KeepBestConfig

BEST_FILE = "best.json"


class MetricHistory:
    """One metric's values in metrics.jsonl by step, read incrementally: each `refresh` parses only the lines
    appended since the last (a file replaced or cut shorter is read again from the start)."""

    def __init__(self, path: Path, metric: str):
        self.path, self.metric = path, metric
        self.values: dict[int, float] = {}
        self.rows = 0  # complete rows read
        self.seen = False  # the metric is a key of some row (null or not)
        self._offset, self._inode = 0, None
        self.last_keys: list[str] = []

    def refresh(self) -> dict[int, float]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return self.values
        if st.st_ino != self._inode or st.st_size < self._offset:  # rewritten (a resume truncates the rows)
            self.values, self.rows, self.seen, self._offset, self._inode = {}, 0, False, 0, st.st_ino
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a last line without its newline is still being written (or torn)
        for line in data[:end].splitlines():
            self._take(line)
        self._offset += end
        return self.values

    def _take(self, line: bytes) -> None:
        try:
            row = json.loads(line)
        except ValueError:
            return  # read_metrics names a bad row; the ranking just skips it
        if not isinstance(row, dict) or "step" not in row:
            return
        self.rows += 1
        self.last_keys = sorted(row)
        if self.metric in row:
            self.seen = True
        value = row.get(self.metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            self.values[int(row["step"])] = float(value)


class BestCheckpoints:
    """The ranking of `rule` over a run's checkpoints (`Checkpoints.save_checkpoint` asks it after each one)."""

    def __init__(self, rule: KeepBestConfig, metrics_path: Path):
        self.rule = rule
        self.history = MetricHistory(metrics_path, rule.metric)
        self.warned = False

    def choose(self, complete: list[Path], ckpt_root: Path) -> list[Path]:
        """The `n` best of `complete` (checkpoint directories named step_NNNNNN), best first; a tie keeps the
        earlier step. Written to `ckpt_root/best.json` atomically. Warns once when no row has the metric."""
        values = self.history.refresh()
        steps = {int(p.name.rpartition("_")[2]): p for p in complete}
        ranked = sorted((s for s in steps if s in values), key=lambda s: (self._sign() * values[s], s))
        best = ranked[: self.rule.n]
        record = {
            "metric": self.rule.metric,
            "mode": self.rule.mode,
            "n": self.rule.n,
            "checkpoints": [{"step": s, "name": steps[s].name, "value": values[s]} for s in best],
        }
        write_text(ckpt_root / BEST_FILE, json.dumps(record, indent=1) + "\n")
        fsync_dir(ckpt_root)
        if not self.history.seen and self.history.rows and not self.warned:
            self.warned = True
            warnings.warn(self._missing_line(), stacklevel=3)
        return [steps[s] for s in best]

    def _sign(self) -> int:
        return -1 if self.rule.mode == "max" else 1

    def _missing_line(self) -> str:
        keys = ", ".join(self.history.last_keys[:12]) + (", ..." if len(self.history.last_keys) > 12 else "")
        return (
            f"train.keep_best.metric={self.rule.metric!r} is in none of the {self.history.rows} rows of "
            f"{self.history.path} so far: no checkpoint is kept as best until it appears (the last row's keys: "
            f"{keys})"
        )


def read_best(ckpt_root: Path) -> dict | None:
    """RUN_DIR/checkpoints/best.json as written, None without one."""
    path = ckpt_root / BEST_FILE
    return json.loads(path.read_text()) if path.is_file() else None
