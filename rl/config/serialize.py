"""A config as plain data: nested dicts and lists (`plain`), one leaf per dotted key (`flatten`, `join_key`,
`is_under`), and YAML text in the layout fbrl writes everywhere (`yaml_dump`: config.yaml of a run,
pretrain_config.yaml of a checkpoint, `fbrl train --print-config`).

Generic over dataclasses, so it imports nothing of the schema: schema.py's `Config.to_dict / to_yaml / flat` and
the loader (loading.py) both build on it, and reading it back is the loader's job."""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml


def plain(obj):
    """Dataclasses -> dicts (in field order), tuples -> lists, recursively; scalars as they are."""
    if dataclasses.is_dataclass(obj):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    return obj


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{'learner': {'lr': 1e-5}} -> {'learner.lr': 1e-5}; lists and empty mappings are leaves."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, join_key(prefix, k)))
        else:
            out[join_key(prefix, k)] = v
    return out


def join_key(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def is_under(key: str, prefix: str) -> bool:
    """`key` is `prefix` or beneath it (`prefix.x`, `prefix[0]`)."""
    return key == prefix or key.startswith(prefix + ".") or key.startswith(prefix + "[")


class _Dumper(yaml.SafeDumper):
    """Sections as blocks, lists of scalars (and of scalar pairs) inline: `pass_schedule: [[0.75, 1], ...]`."""

    def represent_list(self, data):
        flat = all(
            not isinstance(v, (dict, list)) or (isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v))
            for v in data
        )
        return self.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat)


_Dumper.add_representer(list, _Dumper.represent_list)


def yaml_dump(data: dict) -> str:
    """Plain data (`plain`) as YAML, keys in their given (schema) order."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)
