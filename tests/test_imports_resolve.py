"""Every `from <fbrl module> import name` in the tree names something that exists — the lazy ones inside functions
too, which a linter cannot see and which fail only when that code path runs (a renamed helper, a moved module)."""

import ast
import importlib

from test_layering import PACKAGES, ROOT

TREES = (*PACKAGES, "bench", "tools", "scripts", "examples", "tests")


def _from_imports():
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    if node.module.split(".")[0] in PACKAGES:
                        yield path.relative_to(ROOT).as_posix(), node.lineno, node.module, [a.name for a in node.names]


def test_every_name_imported_from_fbrl_exists():
    missing = []
    for where, line, module, names in _from_imports():
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{where}:{line}: module {module} ({e})")
            continue
        for name in names:
            if name != "*" and not hasattr(mod, name):
                try:  # `from package import submodule`
                    importlib.import_module(f"{module}.{name}")
                except ImportError:
                    missing.append(f"{where}:{line}: {module} has no {name}")
    assert not missing, "\n".join(missing)
