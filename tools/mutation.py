"""Mutation testing of the pure modules: does the suite notice a small change to the code it claims to pin?

    python -m tools.mutation                      # every target below, all ~470 mutants (hours on 2 busy cores)
    python -m tools.mutation --max-per-target 16  # a seeded sample per target (docs/TESTING.md's run: ~50 min)
    python -m tools.mutation --target algos.losses --list   # the mutants, without running them
    python -m tools.mutation --only algos.losses:17         # one mutant (after a fix: is it killed now?)

Not part of CI. Each mutant is one AST edit of one target file (an operator swapped, a comparison made strict or
loose, a number nudged, a boolean or a sign flipped, `and`/`or` exchanged, a `not` dropped); strings (regexes,
messages, docstrings) are never edited. The parent process imports torch, transformers and pytest once; each
mutant runs in a forked child that serves the mutated source for the target module (the rest of the tree is
imported fresh) and runs the target's fast test files in-process with `-x`. Killed = a test failed or errored
(or the child ran past --timeout-s: an infinite loop counts as caught); survived = every test passed. A mutant
the baseline can not even import (a syntax error) is not generated: every edit keeps the AST valid.

The report (stdout, and --json PATH) lists every survivor with its line and edit, for triage in docs/TESTING.md.
"""

from __future__ import annotations

import argparse
import ast
import importlib.machinery
import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# target name -> (file, functions to mutate or None for the whole file, fast test files that pin it)
TARGETS = {
    "algos.advantages": ("rl/algos/advantages.py", None, ["tests/test_algos.py", "tests/test_loop_filters.py"]),
    "algos.losses": ("rl/algos/losses.py", None, ["tests/test_algos.py", "tests/test_algos_mismatch.py"]),
    "algos.mismatch": ("rl/algos/mismatch.py", None, ["tests/test_algos_mismatch.py"]),
    "registry": ("rl/registry.py", None, ["tests/test_algos.py"]),
    "rewards.answer": ("rewards/answer.py", None, ["tests/test_rewards_answer.py", "tests/test_rewards_math.py"]),
    "rewards.math": (
        "rewards/math.py",
        {
            "plain_number_gold",
            "gold_text",
            "score_literal",
            "score_completion",
            "_finish_reasons",
            "_result",
            "math_reward",
            "format_reward",
        },
        ["tests/test_rewards_math.py", "tests/test_rewards_answer.py"],
    ),
    "task.arith_score": (
        "rl/data/arith.py",
        {"extract_boxed", "score"},
        ["tests/test_rewards_answer.py", "tests/test_data.py"],
    ),
}
# tests that start a subprocess or a model and check nothing about the targets' values
DESELECT = ["test_no_ray_vllm_deepspeed"]

BINOP_SWAP = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
}
CMP_SWAP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}


@dataclass
class Mutant:
    target: str
    index: int  # the index-th mutable node of the file, in ast.walk order
    line: int
    edit: str


def _in_scope(tree: ast.Module, functions):
    """Nodes to mutate: all, or those inside the named top-level functions / classes."""
    if functions is None:
        return tree
    return [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in functions]


def _docstring_ids(tree) -> set[int]:
    out = set()
    for n in ast.walk(tree):
        if (
            isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        ):
            out.add(id(n.body[0].value))
    return out


def _edits(node, skip: set[int]):
    """The edits that apply to one node: [(description, apply_fn)]."""
    out = []
    if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in BINOP_SWAP:
        new = BINOP_SWAP[type(node.op)]
        out.append((f"{type(node.op).__name__} -> {new.__name__}", lambda n, new=new: setattr(n, "op", new())))
    elif isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in CMP_SWAP:
                new = CMP_SWAP[type(op)]
                out.append(
                    (f"{type(op).__name__} -> {new.__name__}", lambda n, i=i, new=new: n.ops.__setitem__(i, new()))
                )
    elif isinstance(node, ast.BoolOp):
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        out.append((f"{type(node.op).__name__} -> {new.__name__}", lambda n, new=new: setattr(n, "op", new())))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        out.append((f"drop {type(node.op).__name__}", "unwrap"))
    elif isinstance(node, ast.Constant) and id(node) not in skip:
        v = node.value
        if isinstance(v, bool):
            out.append((f"{v} -> {not v}", lambda n: setattr(n, "value", not n.value)))
        elif isinstance(v, int):
            out.append((f"{v} -> {v + 1}", lambda n: setattr(n, "value", n.value + 1)))
        elif isinstance(v, float):
            new = v * 2 if v != 0 else 1.0
            out.append((f"{v} -> {new}", lambda n, new=new: setattr(n, "value", new)))
    return out


def _mutable_nodes(tree, functions):
    skip = _docstring_ids(tree)
    nodes = []
    for root in [_in_scope(tree, functions)] if functions is None else _in_scope(tree, functions):
        for node in ast.walk(root):
            # annotations and the string parts of f-strings are not behaviour
            if isinstance(node, ast.JoinedStr):
                skip.update(id(c) for c in ast.walk(node))
            for desc, fn in _edits(node, skip):
                nodes.append((node, desc, fn))
    return nodes


def list_mutants(target: str) -> list[Mutant]:
    path, functions, _ = TARGETS[target]
    tree = ast.parse((ROOT / path).read_text())
    return [
        Mutant(target, i, getattr(n, "lineno", 0), desc)
        for i, (n, desc, _) in enumerate(_mutable_nodes(tree, functions))
    ]


class _Unwrap(ast.NodeTransformer):
    def __init__(self, victim):
        self.victim = victim

    def generic_visit(self, node):
        super().generic_visit(node)
        return node.operand if node is self.victim else node


def mutated_source(m: Mutant) -> str:
    path, functions, _ = TARGETS[m.target]
    tree = ast.parse((ROOT / path).read_text())
    node, _, fn = _mutable_nodes(tree, functions)[m.index]
    if fn == "unwrap":
        tree = _Unwrap(node).visit(tree)
    else:
        fn(node)
    return ast.unparse(ast.fix_missing_locations(tree))


def _serve(path: Path, source: str | None) -> None:
    """Make the import system read `source` for `path` (and never its .pyc)."""
    sys.dont_write_bytecode = True
    if source is None:
        return
    data = source.encode()
    real_get_data, real_stats = (
        importlib.machinery.SourceFileLoader.get_data,
        importlib.machinery.SourceFileLoader.path_stats,
    )
    target = str(path)

    def get_data(self, p):
        return data if p == target else real_get_data(self, p)

    def path_stats(self, p):
        return {"mtime": 0, "size": len(data)} if p == target else real_stats(self, p)

    importlib.machinery.SourceFileLoader.get_data = get_data
    importlib.machinery.SourceFileLoader.path_stats = path_stats


def run_one(target: str, source: str | None, timeout_s: float) -> str:
    """'killed' | 'survived' | 'timeout' (counted as killed) for one mutant (`source` None: the baseline)."""
    path, _, tests = TARGETS[target]
    pid = os.fork()
    if pid == 0:  # child: mutated module, fresh import of the tree, the target's tests in-process
        try:
            os.setpgid(0, 0)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            _serve(ROOT / path, source)
            import pytest

            code = pytest.main(
                [
                    "-x",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    "-k",
                    " and ".join(f"not {t}" for t in DESELECT),
                    *[str(ROOT / t) for t in tests],
                ]
            )
        except BaseException:  # noqa: BLE001 — an import that fails under the mutant is a kill
            code = 3
        os._exit(int(code))
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return "survived" if os.waitstatus_to_exitcode(status) == 0 else "killed"
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout"
        time.sleep(0.05)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", action="append", choices=sorted(TARGETS), help="default: all")
    ap.add_argument("--max-per-target", type=int, default=0, help="a seeded random sample per target (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument(
        "--only",
        action="append",
        metavar="TARGET:INDEX",
        help="run just these mutants (the index printed by --list / stored in --json)",
    )
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("--json", help="write the per-mutant results here")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    only = {}
    for spec in args.only or []:
        t, _, i = spec.rpartition(":")
        only.setdefault(t, set()).add(int(i))
    targets = args.target or (list(only) if only else list(TARGETS))
    plan = []
    for t in targets:
        ms = list_mutants(t)
        if t in only:
            ms = [m for m in ms if m.index in only[t]]
        elif args.max_per_target and len(ms) > args.max_per_target:
            ms = sorted(random.Random(f"{args.seed}:{t}").sample(ms, args.max_per_target), key=lambda m: m.index)
        plan.append((t, ms))
    if args.list:
        for t, ms in plan:
            for m in ms:
                print(f"{t}:{m.index}  line {m.line}  {m.edit}")
        return 0
    import pytest  # noqa: F401  (imported once here; every child inherits them)
    import torch  # noqa: F401
    import transformers  # noqa: F401

    results, t0 = [], time.monotonic()
    for t, ms in plan:
        base = run_one(t, None, args.timeout_s * 3)
        if base != "survived":
            raise SystemExit(f"{t}: its tests fail without any mutation ({base}); fix them first")
        for m in ms:
            outcome = run_one(t, mutated_source(m), args.timeout_s)
            results.append({"target": t, "line": m.line, "edit": m.edit, "index": m.index, "outcome": outcome})
            print(f"{t}:{m.line:<4} {m.edit:<24} {outcome}  ({time.monotonic() - t0:.0f}s)", flush=True)
    print("\nscore per target (killed incl. timeouts / mutants):")
    for t, _ in plan:
        rs = [r for r in results if r["target"] == t]
        k = sum(r["outcome"] != "survived" for r in rs)
        print(f"  {t:<20} {k}/{len(rs)}")
    k = sum(r["outcome"] != "survived" for r in results)
    print(f"  {'total':<20} {k}/{len(results)} = {100 * k / max(len(results), 1):.1f} % killed")
    print("\nsurvivors:")
    for r in results:
        if r["outcome"] == "survived":
            print(f"  {TARGETS[r['target']][0]}:{r['line']}  {r['edit']}  (--only {r['target']}:{r['index']})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
