"""A clone stands alone: what the tracked files name exists in the tree, and nothing points outside it (a machine's
shared directories, a scratch area, a tracker, a branch)."""

import re
import subprocess

import pytest
from conftest import ROOT

TOP = "configs|docs|rl|actors|rollout|rewards|bench|tools|scripts|examples|checkpoints|tests"
# a file of the tree named by its path: `rl/model/fbt.py`, configs/tiny.yaml (metric names like rewards/total/mean
# carry no extension and are not paths)
FILE_REF = re.compile(rf"(?<![\w./-])((?:{TOP})/[\w./-]*\.(?:py|md|yaml|yml|sh|txt|toml|cfg|json))\b")
# a file removed on purpose, named with the commit that has it
REMOVED = re.compile(r"git\s+show\s+[0-9a-f]{7,40}:([\w./-]+)")
OUTSIDE = re.compile(r"/shared/|\.\./shared|(?<![\w-])scratch/|/work/|branch (?:head|base)|issue[- ]?\d|tracker issue")


def _tracked_text_files():
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        if name.endswith((".safetensors", ".png", ".json", ".parquet")):
            continue
        try:
            yield name, (ROOT / name).read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue


def test_every_file_path_the_tree_names_exists():
    files = dict(_tracked_text_files())
    if not files:
        pytest.skip("not a git checkout")
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split())
    missing = []
    for name, text in files.items():
        if name.startswith("tests/"):  # tests name files they make or that must not exist
            continue
        removed = set(REMOVED.findall(text))
        for lineno, line in enumerate(text.splitlines(), 1):
            for ref in FILE_REF.findall(line):
                if ref not in tracked and ref not in removed:
                    missing.append(f"{name}:{lineno}: {ref}")
    assert not missing, "paths that are not in the tree:\n" + "\n".join(missing)


def test_nothing_points_outside_the_repository():
    found = []
    for name, text in _tracked_text_files():
        if name in (".gitignore", "tests/test_references.py"):
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            m = OUTSIDE.search(line)
            if m:
                found.append(f"{name}:{lineno}: {m.group(0)!r} in {line.strip()[:100]!r}")
    assert not found, "references outside the repository:\n" + "\n".join(found)


# ---- names in the docs --------------------------------------------------------------------------------------------
PACKAGES = ("rl", "rollout", "rewards", "actors")
TICKED = re.compile(r"`([^`\n]+)`")
# `rl.train.heldout`, `rl.samples.states.decode`, `actors.learner_rank.LearnerRank.update`, `rl.loop.train(...)`
DOTTED = re.compile(rf"^((?:{'|'.join(PACKAGES)})(?:\.\w+)+)(?:\(.*\))?$")


def _module_file(parts: list[str]):
    path = ROOT.joinpath(*parts)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _top_level_names(tree) -> dict[str, object]:
    """{name: its node} of what a module defines or imports at the top level (assignments included)."""
    import ast

    names: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name):
                        names[t.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
    return names


def _dotted_problem(name: str) -> str | None:
    """None when `name` is a module of the tree, or a module and what it defines; else what is missing."""
    import ast

    parts = name.split(".")
    if parts[0] == "rollout" and len(parts) == 2 and parts[1] in _rollout_config_keys():
        return None  # `rollout.weight_sync`: a config key of the rollout section, not a module
    cut = max((i for i in range(1, len(parts) + 1) if _module_file(parts[:i])), default=0)
    if not cut:
        return f"no module {parts[0]}"
    rest = parts[cut:]
    if not rest or rest[0].startswith("__"):  # the module itself, or a module attribute (`rl.__file__`)
        return None
    module = ".".join(parts[:cut])
    tree = ast.parse(_module_file(parts[:cut]).read_text())
    names = _top_level_names(tree)
    if rest[0] not in names:
        return f"{module} has no {rest[0]}"
    owner = names[rest[0]]
    if len(rest) > 1 and isinstance(owner, ast.ClassDef):
        members = {n.name for n in owner.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        members |= {
            t.id
            for n in ast.walk(owner)
            if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in ast.walk(n)
            if isinstance(t, ast.Name)
        }
        if rest[1] not in members:
            return f"{module}.{rest[0]} has no {rest[1]}"
    return None


def _rollout_config_keys() -> set[str]:
    import dataclasses

    from rl.config.schema import RolloutConfig

    return {f.name for f in dataclasses.fields(RolloutConfig)}


def test_every_module_and_function_the_docs_name_exists():
    """A backticked dotted name in docs/*.md (`rl.train.heldout`, `rl.samples.states.decode`,
    `actors.learner_rank.LearnerRank.update`) is a module of the tree and what it names is defined there."""
    missing = []
    for md in sorted((ROOT / "docs").glob("*.md")):
        for lineno, line in enumerate(md.read_text().splitlines(), 1):
            for span in TICKED.findall(line):
                m = DOTTED.match(span)
                problem = m and _dotted_problem(m.group(1))
                if problem:
                    missing.append(f"docs/{md.name}:{lineno}: `{span}`: {problem}")
    assert not missing, "names in the docs that the tree does not have:\n" + "\n".join(missing)
