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
