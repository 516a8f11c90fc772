"""rewards.loader — turns config strings into reward functions and a `RewardSet`.

Owns: `load_reward_fn` for user functions named `path/to/file.py:fn` or `package.module:fn` (a dotted name
after the colon reaches into an object, `mod:scorer.score`), the signature check, the built-in names
(`math`, `format`), and `build_reward_set` for a config's list of rewards. Every failure raises
`RewardLoadError` naming the spec and the file, module or function that is missing or does not fit, so a bad
config stops the job at start-up instead of scoring 0 for hours.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rewards.base import RewardEntry, RewardSet
from rewards.conventions import adapt
from rl.errors import InputError

BUILTINS = ("math", "format")
log = logging.getLogger(__name__)


class RewardLoadError(InputError):
    """A reward named in config cannot be loaded or cannot be called as a reward."""


def check_reward_signature(fn: Any, name: str) -> None:
    """Raise unless fn can be called as fn(prompts, completions, answers, **row_fields).

    Extra required parameters after the first three are allowed: they are filled from row fields of the same
    name at call time (a missing one is then a counted call error, not a load error: the rows are not known
    here). Keyword-only parameters likewise.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and C callables: nothing to check
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 3:
        raise RewardLoadError(
            f"reward function {name!r} must accept (prompts, completions, answers, "
            f"**row_fields); its signature is {sig}"
        )
    extra_pos_only = [p.name for p in positional[3:] if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if extra_pos_only:
        raise RewardLoadError(
            f"reward function {name!r} has required positional-only parameters "
            f"{extra_pos_only} beyond (prompts, completions, answers); its signature is {sig}"
        )


def _import_file(path_str: str, spec: str, base_dir: Path) -> Any:
    path = Path(path_str).expanduser()
    path = path if path.is_absolute() else base_dir / path
    if not path.is_file():
        raise RewardLoadError(f"reward file not found: {path} (from {spec!r})")
    path = path.resolve()
    # A stable, unique module name per file, registered in sys.modules so dataclasses and pickling by reference
    # inside that file work.
    mod_name = f"fbrl_reward_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    mspec = importlib.util.spec_from_file_location(mod_name, path)
    if mspec is None or mspec.loader is None:
        raise RewardLoadError(f"reward file {path} cannot be imported as Python (from {spec!r})")
    module = importlib.util.module_from_spec(mspec)
    sys.modules[mod_name] = module
    try:
        mspec.loader.exec_module(module)
    except BaseException as e:
        del sys.modules[mod_name]
        raise RewardLoadError(f"importing reward file {path} failed: {type(e).__name__}: {e}") from e
    return module


def _import_module(mod: str, spec: str) -> Any:
    try:
        return importlib.import_module(mod)
    except ModuleNotFoundError as e:
        if e.name and (mod == e.name or mod.startswith(e.name + ".")):
            raise RewardLoadError(
                f"reward module {mod!r} not found (from {spec!r}); is it installed or on "
                f"PYTHONPATH? A file is written as path/to/file.py:fn"
            ) from e
        raise RewardLoadError(f"importing reward module {mod!r} failed: {e}") from e
    except BaseException as e:
        raise RewardLoadError(f"importing reward module {mod!r} failed: {type(e).__name__}: {e}") from e


def load_reward_fn(
    spec: str, base_dir: str | os.PathLike | None = None, convention: str = "fbrl", python_fns: dict | None = None
) -> Callable:
    """Load `path/to/file.py:fn` (relative paths from base_dir, default the working directory) or
    `package.module:fn`, or take `python:NAME` from `python_fns` (functions handed to `actors.api.train`). A class
    is instantiated without arguments (for rewards that keep state). With fbrl's convention the result must be
    callable with the reward signature; another convention (trl, verl, openrlhf, or auto: by signature;
    rewards/conventions.py) returns it wrapped into fbrl's contract."""
    if isinstance(spec, str) and spec.startswith(PYTHON_PREFIX):
        name = spec.removeprefix(PYTHON_PREFIX)
        return _adapted(_python_fn(name, spec, python_fns or {}), name, spec, convention)
    obj, attr, label = resolve_spec(spec, base_dir)
    if inspect.isclass(obj):
        try:
            obj = obj()
        except Exception as e:
            raise RewardLoadError(
                f"reward class {attr!r} in {label} cannot be created without arguments: {type(e).__name__}: {e}"
            ) from e
    if not callable(obj):
        raise RewardLoadError(f"{attr!r} in {label} is a {type(obj).__name__}, not a function")
    if not getattr(obj, "__name__", None):
        try:  # an instance: metrics and error messages use the name from the config
            obj.__name__ = attr
        except (AttributeError, TypeError):
            pass
    return _adapted(obj, attr, spec, convention)


def resolve_spec(spec: str, base_dir: str | os.PathLike | None = None, what: str = "reward") -> tuple[Any, str, str]:
    """(object, its name, where it came from) for `path/to/file.py:obj` (relative paths from base_dir, default
    the working directory) or `package.module:obj`; a dotted name after the colon reaches into an object."""
    if not isinstance(spec, str) or spec.count(":") < 1:
        raise RewardLoadError(f"{what} spec {spec!r} must look like 'path/to/file.py:fn' or 'package.module:fn'")
    where, attr = spec.rsplit(":", 1)
    if not where or not attr:
        raise RewardLoadError(f"{what} spec {spec!r} must look like 'path/to/file.py:fn' or 'package.module:fn'")
    is_file = where.endswith(".py") or "/" in where or os.sep in where
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    module = _import_file(where, spec, base) if is_file else _import_module(where, spec)
    label = f"{what} file {where}" if is_file else f"{what} module {where!r}"
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
            raise RewardLoadError(
                f"{label} has no {'function' if what == 'reward' else 'object'} {attr!r} (from {spec!r}); callables "
                f"there: {', '.join(names[:20]) or 'none'}"
            )
        obj = getattr(obj, part)
    return obj, attr, label


def _adapted(obj: Callable, name: str, spec: str, convention: str) -> Callable:
    """`obj` called with `convention` (rewards/conventions.py); fbrl's own must take the reward signature."""
    try:
        fn, resolved = adapt(obj, convention)
    except ValueError as e:
        raise RewardLoadError(f"reward {spec!r}: {e}") from None
    if resolved == "fbrl":
        check_reward_signature(obj, name)
    if convention == "auto":
        log.info("reward %s: called with the %s convention (auto, by its signature)", spec, resolved)
    return fn


PYTHON_PREFIX = "python:"  # a reward passed as a Python function to actors.api.train, by name


def _python_fn(name: str, spec: str, python_fns: dict) -> Callable:
    if name not in python_fns:
        raise RewardLoadError(
            f"reward {spec!r} was a Python function handed to actors.api.train (reward_fns=[...]); it exists only "
            f"in that call: resume the run with `api.train(resume=RUN_DIR, reward_fns=[{name}])`"
        )
    return python_fns[name]


def make_reward(
    spec: str,
    base_dir: str | os.PathLike | None = None,
    convention: str = "fbrl",
    python_fns: dict | None = None,
    **options,
) -> Callable:
    """A built-in reward by name (`math` -> MathReward(**options), `format` -> format_reward) or a user one
    called with `convention` (rewards/conventions.py)."""
    if spec == "math":
        from rewards.math import MathReward

        return MathReward(**options)
    if spec == "format":
        from rewards.math import format_reward

        return format_reward
    if options:
        raise RewardLoadError(f"options {sorted(options)} are only for built-in rewards, not {spec!r}")
    return load_reward_fn(spec, base_dir, convention, python_fns)


def build_reward_set(
    entries: Sequence[str | dict],
    base_dir: str | os.PathLike | None = None,
    default_timeout_s: float = 60.0,
    num_workers: int | None = None,
    python_fns: dict | None = None,
) -> RewardSet:
    """A RewardSet from config entries: a spec string, or {fn, weight?, timeout_s?, name?, options?, convention?}
    (convention: how a user function is called, rewards/conventions.py; default auto, by its signature).

    `timeout_s` is the deadline of what can hang: a user function's whole call (default `default_timeout_s`),
    but for the built-in `math` reward the per-item deadline of its pool (its call then runs inline, since the
    pool already bounds every item). `num_workers` sizes the math reward's pool unless its options say.
    """
    out = []
    for e in entries:
        e = {"fn": e} if isinstance(e, str) else dict(e)
        unknown = set(e) - {"fn", "weight", "timeout_s", "name", "options", "convention"}
        if "fn" not in e or unknown:
            raise RewardLoadError(
                f"reward entry {e!r}: needs 'fn'; allowed keys fn, weight, timeout_s, name, options, convention"
            )
        options = dict(e.get("options") or {})
        timeout = e.get("timeout_s")
        if e["fn"] == "math":
            if timeout is not None:
                options.setdefault("timeout_s", timeout)
            if num_workers is not None:
                options.setdefault("num_workers", num_workers)
            timeout = None
        elif timeout is None:
            timeout = default_timeout_s
        fn = make_reward(e["fn"], base_dir, e.get("convention", "auto"), python_fns, **options)
        out.append(RewardEntry(fn, float(e.get("weight", 1.0)), e.get("name", ""), timeout))
    return RewardSet(out)
