"""Where dataset rows come from, as plain dicts: JSON lines, a JSON file, parquet, CSV, a `datasets.save_to_disk`
directory, or a dataset on the Hugging Face Hub by id. Each reader returns `(rows, where)`, `where(i)` naming row
i for errors (`file:line` for JSON lines, `file: row i` otherwise).

Hub datasets (`data.task: hub`, `data.train_path: org/name`, `data.hub_config`, the split from `data.*_split`): the
repository's files are taken from the local Hugging Face cache first (`HF_HUB_OFFLINE=1` never goes online) and
read by `datasets` from that snapshot, so a verl or TRL dataset on the Hub, or one prepared for them on disk
(parquet with a chat `prompt` column and a nested `reward_model.ground_truth`), is read as it is.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

from rl.data.jsonl import DataError, read_numbered

Rows = tuple[list[dict], Callable[[int], str]]


def read_rows(task: str, path: str, split: str, hub_config: str | None = None) -> Rows:
    """The rows of one source. `split` picks a split of a saved or Hub dataset (files have none)."""
    if task == "hub":
        return _hub(path, split, hub_config)
    p = Path(path)
    if not p.exists():
        raise DataError(f"{path}: no such {'directory' if task == 'hf_disk' else 'file'}")
    if task == "jsonl":
        numbered = read_numbered(p)
        return [row for _, row in numbered], lambda i: f"{path}:{numbered[i][0]}"
    readers = {"json": _json, "parquet": _parquet, "csv": _csv, "hf_disk": _hf_disk}
    if task not in readers:
        raise DataError(f"data.task: {task!r} is not a file task (expected jsonl, json, parquet, csv, hf_disk, hub)")
    rows, where = readers[task](p, split)
    return rows, lambda i: f"{where}: row {i}"


def _json(path: Path, split: str) -> tuple[list[dict], str]:
    """A JSON array of objects, or an object holding one (`{"data": [...]}`, or one list per split name)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not a JSON file ({e})") from None
    if isinstance(data, dict):
        lists = {k: v for k, v in data.items() if isinstance(v, list)}
        key = split if split in lists else next(iter(lists)) if len(lists) == 1 else None
        if key is None:
            raise DataError(f"{path}: expected a list of rows, or an object with one (lists: {sorted(lists)})")
        data = data[key]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DataError(f"{path}: expected a JSON list of objects (rows)")
    return data, str(path)


def _parquet(path: Path, split: str) -> tuple[list[dict], str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
    import pyarrow as pa

    try:
        return pq.read_table(path).to_pylist(), str(path)
    except (pa.ArrowException, OSError) as e:  # a corrupt or truncated file, or not parquet at all
        raise DataError(f"{path}: not a readable parquet file ({str(e)[:200]})") from None


def _csv(path: Path, split: str) -> tuple[list[dict], str]:
    """A header row, then one row per problem; values are strings (the answer is compared as text)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return [dict(r) for r in csv.DictReader(f)], str(path)
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 ({e})") from None


def _hf_disk(path: Path, split: str) -> tuple[list[dict], str]:
    try:
        import datasets
    except ImportError:
        raise DataError(f"{path}: reading a saved Hugging Face dataset needs `datasets`") from None
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"{path}: no split {split!r} (splits: {sorted(ds)})")
        return ds[split].to_list(), f"{path}[{split}]"
    return ds.to_list(), str(path)


def _hub(repo_id: str, split: str, config: str | None) -> Rows:
    try:
        import datasets
    except ImportError:
        raise DataError(f"{repo_id}: reading a Hub dataset needs `datasets`") from None
    from rl.hub import snapshot

    local = snapshot(repo_id, "dataset", key="data.train_path")
    try:
        ds = datasets.load_dataset(local, name=config, split=split)
    except ValueError as e:  # an unknown split or config: datasets names the ones there are
        raise DataError(f"{repo_id} (data.hub_config={config}, split {split!r}): {e}") from None
    where = f"{repo_id}[{config + '/' if config else ''}{split}]"
    return ds.to_list(), lambda i: f"{where}: row {i}"


def field(row: dict, dotted: str):
    """`row[a][b]...` for `dotted` = "a.b" (a key that itself holds dots is looked up whole first); None when
    absent, so that verl's nested `reward_model.ground_truth` is a field like any other."""
    if dotted in row:
        return row[dotted]
    value = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value
