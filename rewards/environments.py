"""rewards.environments — tool environments a policy talks to over several turns (docs/TOOLS.md).

Owns the interface a user writes (`Environment`: `reset` from the data row, `step` on the model's text of one
turn, returning a `StepResult`), the built-in `calculator` (GSM8K's `<<48/2=24>>` annotations: the model writes
`<<48/2=`, the calculator appends `24>>`) and `python` (a sandboxed interpreter), and adapters that run environments written for other libraries
unchanged: TRL tool functions (`ToolFunctions`: a list of plain functions the model calls with
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) and SkyRL's `BaseTextEnv` shape (`TextEnvAdapter`:
`init(prompt)`, `step(action) -> {"observations", "reward", "done"}`). `load_environment(spec)` turns a config
string into a factory. Running them with deadlines, in processes of their own, is rewards/env_pool.py.
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rewards.loader import RewardLoadError, resolve_spec

__all__ = [
    "Environment",
    "StepResult",
    "Calculator",
    "ToolFunctions",
    "TextEnvAdapter",
    "PythonSandbox",
    "load_environment",
    "ENVIRONMENTS",
]


@dataclass
class StepResult:
    """What an environment says after one turn: text to append (None: nothing, the model goes on), a reward for
    this turn (summed over the episode), and whether the episode is over."""

    observation: str | None = None
    reward: float = 0.0
    done: bool = False


class Environment:
    """One episode's environment. Subclass it, or hand fbrl any object with these methods.

    `stop_strings`: text that ends a turn so the environment can answer (the turn also ends at the model's own
    stop tokens, which end the episode). Objects are pickled between steps (they run in worker processes), so
    keep state in plain attributes.
    """

    stop_strings: tuple[str, ...] = ()

    def reset(self, row: dict) -> None:
        """Start an episode for this data row (its prompt, answer and other columns)."""

    def step(self, text: str) -> StepResult:
        """The model's text of the turn that just ended (sampled tokens, decoded) → what comes next."""
        raise NotImplementedError


# ---- the calculator ----------------------------------------------------------------------------------------------
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_OPEN_CALL = re.compile(r"<<([^<>=]*)=$")


def evaluate_arithmetic(expr: str) -> float:
    """+, -, *, / and parentheses over decimal numbers; ValueError for anything else (no names, no calls, no
    powers: a policy cannot make the calculator do more than arithmetic or spend unbounded time)."""

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")

    text = expr.replace(",", "").replace("x", "*").replace("×", "*").replace("÷", "/").strip()
    if not text or len(text) > 200:
        raise ValueError(f"expression {expr!r}: empty or too long")
    return float(ev(ast.parse(text, mode="eval")))


def format_number(value: float) -> str:
    """24.0 → "24", 2.5 → "2.5" (at most 6 decimals), as GSM8K's annotations write results."""
    if not math.isfinite(value):
        raise ValueError("result is not finite")
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6f}".rstrip("0").rstrip(".")


class Calculator(Environment):
    """GSM8K's calculator annotations as a tool: a turn ending in `<<EXPR=` gets `RESULT>>` appended.

    A turn that ends otherwise (an `=` outside an annotation) gets nothing and the model goes on; an expression
    that is not arithmetic gets `?>>` and counts as a bad call. Reward 0: correctness is the reward functions'
    business on the final transcript.
    """

    stop_strings = ("=",)

    def reset(self, row: dict) -> None:
        self.calls, self.bad_calls = 0, 0

    def step(self, text: str) -> StepResult:
        m = _OPEN_CALL.search(text)
        if m is None:
            return StepResult(None)
        self.calls += 1
        try:
            return StepResult(format_number(evaluate_arithmetic(m.group(1))) + ">>")
        except (ValueError, SyntaxError, ZeroDivisionError, OverflowError):
            self.bad_calls += 1
            return StepResult("?>>")


# ---- TRL tool functions ------------------------------------------------------------------------------------------
_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>\s*$", re.S)


class ToolFunctions(Environment):
    """TRL's `tools=[fn, ...]`: plain functions (type hints, docstring) the model calls by writing
    `<tool_call>{"name": "fn", "arguments": {...}}</tool_call>` (the Hermes / Qwen format TRL parses). The result
    comes back as `<tool_response>...</tool_response>`; a turn that does not end in a call gets nothing (the model
    goes on; its stop token ends the episode). A call that names no tool or whose arguments do not fit returns the
    error as the response (the model sees it, as in TRL)."""

    stop_strings = ("</tool_call>",)

    def __init__(self, tools: list[Callable], response_format: str = "<tool_response>\n{}\n</tool_response>\n"):
        self.tools = {fn.__name__: fn for fn in tools}
        self.response_format = response_format

    def step(self, text: str) -> StepResult:
        m = _TOOL_CALL.search(text)
        if m is None:
            return StepResult(None)
        try:
            call = json.loads(m.group(1))
            fn = self.tools[call["name"]]
            result = fn(**call.get("arguments", {}))
        except Exception as e:  # noqa: BLE001 — the model's malformed call is its observation, as in TRL
            result = f"error: {type(e).__name__}: {e}"
        return StepResult(self.response_format.format(result))


# ---- SkyRL's BaseTextEnv shape -----------------------------------------------------------------------------------
class TextEnvAdapter(Environment):
    """An environment written for SkyRL's `BaseTextEnv` (`init(prompt)`, `step(action)` returning a dict with
    `observations` — a list of chat messages —, `reward`, `done`), run unchanged. The observation messages'
    contents are appended as text."""

    def __init__(self, env_cls: type, stop_strings: tuple[str, ...] = (), **env_kwargs):
        self.env_cls, self.env_kwargs, self.stop_strings = env_cls, env_kwargs, tuple(stop_strings)
        self.env = None

    def reset(self, row: dict) -> None:
        params = inspect.signature(self.env_cls).parameters
        kwargs = dict(self.env_kwargs)
        if "extras" in params:
            kwargs["extras"] = row
        self.env = self.env_cls(**kwargs)
        if hasattr(self.env, "init"):
            self.env.init(row.get("prompt"))

    def step(self, text: str) -> StepResult:
        out = self.env.step(text)
        observations = out.get("observations") or []
        content = "".join(m["content"] if isinstance(m, dict) else str(m) for m in observations)
        return StepResult(content or None, float(out.get("reward") or 0.0), bool(out.get("done")))


# ---- a Python sandbox --------------------------------------------------------------------------------------------
_CODE = re.compile(r"<python>(.*?)</python>\s*$", re.S)
# Runs in a fresh interpreter: an audit hook (it cannot be removed from inside) refuses sockets, new processes and
# writes outside the temporary working directory before the model's code runs.
_SANDBOX_MAIN = r"""
import os, sys
BLOCKED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.kill", "pty.",
           "shutil.rmtree", "os.remove", "os.unlink", "os.rename", "ctypes.")
def hook(event, args):
    if event.startswith(BLOCKED) or (event == "import" and args[0] in ("ctypes", "_ctypes")):
        raise PermissionError(f"not allowed in the sandbox: {event} {args[0] if event == 'import' else ''}")
    if event == "open" and len(args) > 1 and any(c in str(args[1]) for c in "wax+"):
        path = os.path.realpath(str(args[0]))
        if not path.startswith(os.path.realpath(os.getcwd())):
            raise PermissionError(f"not allowed in the sandbox: writing {args[0]}")
code = sys.stdin.read()
sys.addaudithook(hook)
exec(compile(code, "<python>", "exec"), {"__name__": "__main__"})
"""


def _limit_resources(cpu_s: int, memory_mb: int):
    def apply():
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    return apply


class PythonSandbox(Environment):
    """A Python tool: a turn ending in `<python>CODE</python>` gets `<output>STDOUT</output>` (or the error's last
    line). The code runs in a fresh interpreter with CPU-time, memory and file-size limits, a wall-clock timeout,
    an empty temporary working directory, and an audit hook that refuses sockets (no network), new processes and
    writes outside that directory. Output is cut to `max_output` characters."""

    stop_strings = ("</python>",)

    def __init__(self, timeout_s: float = 5.0, cpu_s: int = 5, memory_mb: int = 512, max_output: int = 400):
        self.timeout_s, self.cpu_s, self.memory_mb, self.max_output = timeout_s, cpu_s, memory_mb, max_output

    def step(self, text: str) -> StepResult:
        m = _CODE.search(text)
        if m is None:
            return StepResult(None)
        return StepResult(f"<output>{self.run(m.group(1))}</output>")

    def run(self, code: str) -> str:
        import subprocess
        import sys
        import tempfile

        with tempfile.TemporaryDirectory(prefix="fbrl-sandbox-") as cwd:
            try:
                done = subprocess.run(
                    [sys.executable, "-I", "-c", _SANDBOX_MAIN],
                    input=code,
                    capture_output=True,
                    text=True,
                    cwd=cwd,
                    timeout=self.timeout_s,
                    preexec_fn=_limit_resources(self.cpu_s, self.memory_mb),
                    env={"PATH": "/usr/bin:/bin"},
                )
            except subprocess.TimeoutExpired:
                return f"timed out after {self.timeout_s:g} s"
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            return (lines[-1] if lines else f"exit code {done.returncode}")[: self.max_output]
        return done.stdout.strip()[: self.max_output]


# ---- loading -----------------------------------------------------------------------------------------------------
ENVIRONMENTS: dict[str, Callable[..., Environment]] = {"calculator": Calculator, "python": PythonSandbox}


def load_environment(spec: str, options: dict[str, Any] | None = None) -> Callable[[], Environment]:
    """`env.name` → a factory of fresh environments. A built-in name (`calculator`), or `path/file.py:obj` /
    `package.module:obj` naming an `Environment` class (or any class with reset/step), a SkyRL-style class
    (init/step returning a dict: wrapped in `TextEnvAdapter`), or a list of TRL tool functions."""
    options = dict(options or {})
    if spec in ENVIRONMENTS:
        return lambda: ENVIRONMENTS[spec](**options)
    if ":" not in spec:
        raise RewardLoadError(
            f"env.name: {spec!r} is neither a built-in environment {sorted(ENVIRONMENTS)} nor 'path/file.py:obj' "
            f"/ 'package.module:obj'"
        )
    obj = resolve_spec(spec, what="environment")[0]
    if isinstance(obj, (list, tuple)) and obj and all(callable(f) for f in obj):
        return lambda: ToolFunctions(list(obj), **options)
    if inspect.isclass(obj) and callable(getattr(obj, "step", None)):
        if callable(getattr(obj, "reset", None)):
            return lambda: obj(**options)
        if callable(getattr(obj, "init", None)):
            return lambda: TextEnvAdapter(obj, **options)
    raise RewardLoadError(
        f"env.name: {spec!r} is a {type(obj).__name__}; expected an environment class (reset/step), a SkyRL-style "
        f"class (init/step) or a list of tool functions"
    )
