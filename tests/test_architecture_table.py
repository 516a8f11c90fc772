"""docs/ARCHITECTURE.md's module table names every module of rl/, rollout/, rewards/ and actors/, and names
nothing that is not there: a module added, moved or removed changes the table in the same commit.

A row's first column holds the paths it describes, in backticks: a module (`rl/loop.py`) or a package
(`rl/algos/`, which names the modules directly inside it)."""

import re

from conftest import ROOT

PACKAGES = ("rl", "rollout", "rewards", "actors")
HEADER = "| module | what it is |"


def table_paths(text: str) -> list[str]:
    """The backticked paths of the first column of the module table in `text`."""
    lines = text.splitlines()
    start = lines.index(HEADER)
    paths = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        first = line.split("|")[1]
        paths += re.findall(r"`([^`]+)`", first)
    return paths


def modules() -> set[str]:
    return {str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if p.name != "__init__.py"}


def covered(paths: list[str]) -> set[str]:
    """The modules `paths` name: a module path itself, a package path every module directly in it."""
    out = set()
    for path in paths:
        if path.endswith("/"):
            out |= {str(p.relative_to(ROOT)) for p in (ROOT / path).glob("*.py") if p.name != "__init__.py"}
        else:
            out.add(path)
    return out


def test_every_module_is_in_the_table():
    paths = table_paths((ROOT / "docs" / "ARCHITECTURE.md").read_text())
    missing = sorted(modules() - covered(paths))
    assert not missing, f"modules missing from docs/ARCHITECTURE.md's module table: {missing}"


def test_the_table_names_only_what_exists():
    paths = table_paths((ROOT / "docs" / "ARCHITECTURE.md").read_text())
    gone = [p for p in paths if not (ROOT / p).exists()]
    assert not gone, f"docs/ARCHITECTURE.md's module table names paths that do not exist: {gone}"
    outside = [p for p in paths if p.split("/")[0] not in PACKAGES]
    assert not outside, f"the module table is about {PACKAGES}: {outside}"


def test_reading_the_table():
    text = (
        f"x\n{HEADER}\n|---|---|\n| `rl/loop.py`, `rl/algos/` | the loop |\n| `rewards/base.py` | `rl/x.py` |\n\nafter"
    )
    assert table_paths(text) == ["rl/loop.py", "rl/algos/", "rewards/base.py"]
    assert "rl/algos/losses.py" in covered(["rl/algos/"])


def test_each_new_piece_names_a_test_that_adds_one():
    """docs/ARCHITECTURE.md's "where a new piece goes": every kind of piece names the test that adds one, and that
    test exists (so the files the row lists are the ones a working addition touched)."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("### Where a new piece goes", 1)[1].split("###", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| piece")]
    pieces = {row.split("|")[1].strip(): row.split("|")[3] for row in rows}
    assert set(pieces) == {
        "advantage estimator",
        "policy loss",
        "likelihood estimator",
        "rollout engine",
        "reward convention",
        "task",
        "weight transport",
        "tool environment",
    }
    for piece, cell in pieces.items():
        path, name = re.match(r"\s*(tests/\w+\.py) `(\w+)`", cell).groups()
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), f"{piece}: {path} has no {name}"
