"""Loading a Config from YAML plus dotted `key=value` overrides, with strict validation.

The loader is generic: it reads the schema's dataclass annotations, so adding a field is adding one line to a
section. Unknown key, wrong type or bad choice -> `ConfigError` naming the full dotted key, the file and line (or
the override), and what was expected.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import difflib
import importlib.util
import itertools
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from rl.config.bounds import bound_problems
from rl.config.schema import AUTO_TIS_CAP, Config, ConfigError
from rl.config.serialize import flatten, is_under, join_key

UNIONS = (Union, types.UnionType)  # Optional[X] and X | None alike

# ---------------------------------------------------------------------------------------------- loading

# Keys that no longer exist, with what replaced them (the loader's error says so instead of "unknown key").
RETIRED_KEYS = {
    "likelihood.micro_batch_size": "removed (it was never read); learner.micro_batch_size, "
    "max_tokens_per_micro_batch and max_response_tokens_per_micro_batch now bound "
    "old, reference and policy log-probs alike",
}

# Top-level sections that earlier versions wrote into every saved config (a run's config.yaml, a checkpoint's
# pretrain_config.yaml) and never read: skipped, so those run directories and checkpoints still load.
UNREAD_SECTIONS = ("eval", "compare")


class _Loader(yaml.SafeLoader):
    pass


# PyYAML implements YAML 1.1, which reads `1e-6` (no dot) as a string; users mean a float.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def _parse_yaml(text: str, where: str) -> tuple[Any, dict[str, str]]:
    """YAML text -> (data, {dotted key: 'where line N'}); duplicate keys are errors (PyYAML keeps the last)."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"invalid YAML ({where}{line}): {e.problem or e}") from None
    finally:
        loader.dispose()
    origins: dict[str, str] = {}
    if node is not None:
        _index_marks(node, "", where, origins)
    return data, origins


def _index_marks(node, prefix: str, where: str, origins: dict[str, str]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for knode, vnode in node.value:
            path = join_key(prefix, str(knode.value))
            loc = f"{where} line {knode.start_mark.line + 1}"
            if knode.value in seen:
                raise ConfigError(f"{path}: duplicate key ({loc})")
            seen.add(knode.value)
            origins[path] = loc
            _index_marks(vnode, path, where, origins)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            origins[f"{prefix}[{i}]"] = f"{where} line {item.start_mark.line + 1}"
            _index_marks(item, f"{prefix}[{i}]", where, origins)


def _apply_override(raw: dict, origins: dict[str, str], text: str) -> None:
    key, eq, value_text = text.partition("=")
    key = key.strip()
    where = f"override {text!r}"
    if not eq or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", key):
        raise ConfigError(f"{where}: expected dotted.key=value")
    value, _ = _parse_yaml(value_text, where)  # a YAML scalar or flow collection: 1e-6, soft, [1,2], null
    parts = key.split(".")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(parts[: i + 1])}: is a value, not a section ({where})")
        node = child
    node[parts[-1]] = value
    for k in [k for k in origins if is_under(k, key)]:
        del origins[k]  # the override replaced whatever the file said beneath this key
    origins[key] = where


def _where(path: str, origins: dict[str, str]) -> str:
    for k in origins:  # a key that only exists in the input: report where its first child came from
        if is_under(k, path):
            return f" ({origins[k]})"
    p = path
    while p:  # else its nearest parent that has a location (e.g. a whole override)
        if p in origins:
            return f" ({origins[p]})"
        parent = re.sub(r"(\.[^.\[\]]+|\[\d+\])$", "", p)
        p = "" if parent == p else parent
    return ""


def _type_name(tp) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in UNIONS:
        rest = [a for a in args if a is not type(None)]
        return " or ".join(_type_name(a) for a in rest) + (" or null" if len(rest) < len(args) else "")
    if origin is list:
        return f"a list of {_type_name(args[0])}"
    if origin is tuple:
        return "[" + ", ".join(_type_name(a) for a in args) + "]"
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return f"a mapping (section {tp.__name__})"
    return getattr(tp, "__name__", str(tp))


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _coerce(tp, value, path: str, origins: dict[str, str]):
    """Check `value` against annotation `tp`, returning the typed value; errors name path and location."""

    def fail(extra: str = ""):
        raise ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}{extra}{_where(path, origins)}")

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in UNIONS:
        if value is None:
            if type(None) in args:
                return None
            fail()
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            try:
                return _coerce(rest[0], value, path, origins)
            except ConfigError as e:  # re-say a mismatch of this very key as "X or null"
                if not str(e).startswith(f"{path}: expected "):
                    raise
                fail(" (quote it to make it a string)" if rest[0] is str else "")
        for a in rest:
            try:
                return _coerce(a, value, path, origins)
            except ConfigError:
                pass
        fail()
    if origin is Literal:
        if value in args and not isinstance(value, bool):
            return value
        close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
        fail(f" (did you mean {close[0]!r}?)" if close else "")
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path, origins)
    if origin is list:
        if not isinstance(value, list):
            fail()
        return [_coerce(args[0], v, f"{path}[{i}]", origins) for i, v in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            fail()
        return tuple(_coerce(a, v, f"{path}[{i}]", origins) for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, dict):
            fail()
        return {str(k): _coerce(args[1], v, f"{path}.{k}", origins) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        fail()
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():  # `steps: 1e3`
            return int(value)
        fail()
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        fail()
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (datetime.date, datetime.datetime)):  # YAML 1.1 reads 2026-12-05T20:00:00Z as a time
            return value.isoformat()
        fail(" (quote it to make it a string)" if value is not None else "")
    raise TypeError(f"{path}: unsupported annotation {tp!r} in the config schema")


def _build(cls, raw, path: str, origins: dict[str, str]):
    if raw is None and not path:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected {_type_name(cls)}, got {raw!r}{_where(path, origins)}")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in raw:
        if key not in names:
            sub = join_key(path, str(key))
            if sub in RETIRED_KEYS:
                raise ConfigError(f"{sub}: {RETIRED_KEYS[sub]}{_where(sub, origins)}")
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"{sub}: unknown key ({hint}valid keys under "
                f"{path or 'the top level'}: {', '.join(names)}){_where(sub, origins)}"
            )
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in raw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{join_key(path, missing[0])}: required{_where(path, origins)}")
    obj = cls(**{k: _coerce(hints[k], v, join_key(path, k), origins) for k, v in raw.items()})
    for name, msg in section_problems(obj):
        sub = join_key(path, name)
        raise ConfigError(f"{sub}: {msg}{_where(sub, origins)}")
    return obj


def section_problems(section):
    """(field, message) for every problem of one config section: its fields' declared bounds (rl/config/bounds.py),
    then its own rules (`validate()`)."""
    return itertools.chain(bound_problems(section), getattr(section, "validate", lambda: ())())


def config_from_dict(
    data: dict | None, overrides: list[str] | tuple = (), origins: dict[str, str] | None = None
) -> Config:
    """Build a Config from plain data (e.g. a saved run's config) plus overrides."""
    return _config_and_origins(data, overrides, dict(origins or {}))


def _config_and_origins(data: dict | None, overrides, origins: dict[str, str]) -> Config:
    """As `config_from_dict`; `origins` is updated in place with where each key finally came from."""
    raw = copy.deepcopy(data or {})
    if isinstance(raw, dict):  # (anything else is refused by _build, naming the file)
        raw = {k: v for k, v in raw.items() if k not in UNREAD_SECTIONS}
    for text in overrides:
        _apply_override(raw, origins, text)
    return _build(Config, raw, "", origins)


def load_config(source: str | Path | dict | Config | None = None, overrides: list[str] | tuple = ()) -> Config:
    """Load `source` and apply dotted `key=value` overrides in order. `source`: a YAML file; a mapping of sections
    or a `Config` (checked as a file would be, errors naming "the given config"); None: the defaults.

    Relative input paths (`INPUT_PATH_KEYS`) of the package's own configs and of the schema's defaults are made
    absolute from the package root (`resolve_packaged_paths`)."""
    data, origins = None, {}
    packaged = False
    if isinstance(source, (Config, dict)):
        data = source.to_dict() if isinstance(source, Config) else source
        origins = {key: "the given config" for key in flatten(data)}
    elif source is not None:
        p = Path(source)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        data, origins = _parse_yaml(p.read_text(), str(p))
        if data is not None and not isinstance(data, dict):
            raise ConfigError(f"{p}: expected a mapping of sections at the top level, got {type(data).__name__}")
        packaged = p.resolve().parent == PACKAGED_CONFIGS
    origins_after = dict(origins)
    cfg = _config_and_origins(data, overrides, origins_after)
    resolve_packaged_paths(cfg, origins_after, packaged)
    resolve_auto_correction(cfg)
    return cfg


def tis_cap_in_force(cfg: Config) -> float | None:
    """`algo.tis_cap` with `auto` made concrete from `train.max_staleness` (a rule across two sections): the cap
    when samples can be stale, else none. The trainer asks this, so a Config built in code (left at `auto`)
    behaves as a loaded one."""
    if cfg.algo.tis_cap == "auto":
        return AUTO_TIS_CAP if cfg.train.max_staleness >= 1 else None
    return cfg.algo.tis_cap


def resolve_auto_correction(cfg: Config) -> None:
    """`algo.tis_cap: auto` made concrete in place (what `--print-config` and the saved config show)."""
    cfg.algo.tis_cap = tis_cap_in_force(cfg)


# ---------------------------------------------------------------------------------------------- paths

# Where fbrl's own configs/ and checkpoints/ are (docs/INSTALL.md): in a source checkout (and an editable install)
# at the repository root beside rl/; after `pip install .` in the data package `fbrl_data`, which setup.py builds
# from the same two folders (fbrl_data/configs, fbrl_data/checkpoints in site-packages).
DATA_PACKAGE = "fbrl_data"


def package_root() -> Path:
    """The directory holding fbrl's configs/ and checkpoints/: the source checkout's root if this module runs from
    one, else the installed data package's folder (found without importing anything)."""
    source = Path(__file__).resolve().parents[2]
    if (source / "configs" / "tiny.yaml").is_file():
        return source
    spec = importlib.util.find_spec(DATA_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / "configs" / "tiny.yaml").is_file():
            return Path(location)
    return source  # neither: paths then name the source layout, and the error says which file is missing


PACKAGE_ROOT = package_root()
PACKAGED_CONFIGS = PACKAGE_ROOT / "configs"
DEFAULT_CONFIG = PACKAGED_CONFIGS / "tiny.yaml"  # the embedded default job (`fbrl train` with no config)
# Paths a job reads. Outputs (train.run_dir, pretrain.out_dir) stay relative to the working directory.
INPUT_PATH_KEYS = ("model.path", "model.tokenizer", "data.train_path", "data.test_path")


def resolve_packaged_paths(cfg: Config, origins: dict[str, str], packaged_file: bool) -> None:
    """A relative input path that comes from the schema's defaults, or from a config file shipped in the
    package's configs/ (the embedded default among them), names a file of the package: resolve it from the
    package root, so `fbrl train` works from any directory. Paths in your own files and in overrides keep their
    usual meaning (relative to the working directory)."""
    for key in INPUT_PATH_KEYS:
        value = cfg.get(key)
        if not value or Path(value).is_absolute():
            continue
        origin = origins.get(key)
        if origin is None or (packaged_file and not origin.startswith("override")):
            section, name = key.split(".")
            setattr(getattr(cfg, section), name, str(PACKAGE_ROOT / value))
