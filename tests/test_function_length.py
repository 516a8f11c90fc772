"""No function of fbrl is over 60 lines unless docs/ARCHITECTURE.md names it, with its reason, under "Functions
longer than 60 lines"; and every function named there exists and is long (a split one leaves the list)."""

import ast
import re

from test_layering import ROOT, sources

LIMIT = 60


def _long_functions() -> set[tuple[str, str]]:
    found = set()
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > LIMIT:
                    found.add((path.relative_to(ROOT).as_posix(), node.name))
    return found


def _named() -> set[tuple[str, str]]:
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = doc.split("## Functions longer than 60 lines", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w/.]+\.py)` `(\w+)` \| (.+) \|$", section, re.M)
    assert rows and all(reason.strip() for _, _, reason in rows)
    return {(path, name) for path, name, _ in rows}


def test_every_long_function_is_named_with_its_reason():
    unnamed = sorted(_long_functions() - _named())
    assert not unnamed, f"functions over {LIMIT} lines that docs/ARCHITECTURE.md does not name: {unnamed}"


def test_every_named_function_is_still_long():
    stale = sorted(_named() - _long_functions())
    assert not stale, f"docs/ARCHITECTURE.md names functions that are no longer over {LIMIT} lines: {stale}"
