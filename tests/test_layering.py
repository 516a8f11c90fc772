"""The package arrows: actors → rollout → rl, actors → rewards, nothing pointing back.

Every import in rl/, rollout/, rewards/ and actors/ counts — module level and inside functions, `from . import`
resolved against the importing module — so a lazy import cannot hide a dependency. rl/ stays free of Ray, vLLM
and DeepSpeed: the learning side is plain torch + transformers and runs (and is tested) without a cluster.
"""

import ast
import pathlib

import pytest
from conftest import ROOT

PACKAGES = ("rl", "rollout", "rewards", "actors")

# package -> top-level names it must never import
FORBIDDEN = {
    "rl": {"rollout", "rewards", "actors", "ray", "vllm", "deepspeed"},
    "rollout": {"actors", "rewards"},
    "rewards": {"actors", "rollout"},
    "actors": set(),
}


def module_name(path: pathlib.Path) -> str:
    """rl/algos/losses.py -> rl.algos.losses; rl/algos/__init__.py -> rl.algos."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, name: str, is_package: bool) -> list[tuple[int, str]]:
    """Every module the source of module `name` imports, as (line, absolute dotted name): `import x`,
    `from x import y`, `from . import y` resolved against `name`, and `import_module("x")` / `__import__("x")`
    with a literal name, wherever they stand (module level, function, branch)."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                found.append((node.lineno, ".".join(base + ([node.module] if node.module else []))))
            else:
                found.append((node.lineno, node.module or ""))
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def imported_modules(path: pathlib.Path) -> list[tuple[int, str]]:
    return imports_of(path.read_text(), module_name(path), path.name == "__init__.py")


def sources():
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def violations(path: pathlib.Path) -> list[str]:
    pkg = path.relative_to(ROOT).parts[0]
    return [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for line, target in imported_modules(path)
        if target.split(".")[0] in FORBIDDEN[pkg]
    ]


def test_every_package_has_sources():
    for pkg in PACKAGES:
        assert (ROOT / pkg / "__init__.py").exists(), pkg
    assert len(sources()) > 50


@pytest.mark.parametrize("pkg", PACKAGES)
def test_arrows(pkg):
    bad = [v for p in sources() if p.relative_to(ROOT).parts[0] == pkg for v in violations(p)]
    assert not bad, "imports pointing against the arrows actors → rollout → rl, actors → rewards:\n" + "\n".join(bad)


def test_every_import_form_is_seen():
    """Relative, function-level and import_module imports all count, so none can slip past the rule."""
    src = (
        "from . import losses\nfrom ..config import schema\nfrom .. import model\n"
        "def f():\n    import ray.util\n    from vllm import LLM\n"
        "    return importlib.import_module('deepspeed')\n"
    )
    assert [t for _, t in imports_of(src, "rl.algos.advantages", False)] == [
        "rl.algos",
        "rl.config",
        "rl",
        "ray.util",
        "vllm",
        "deepspeed",
    ]
    assert [t for _, t in imports_of("from . import x\nfrom .sub import y\n", "rl.algos", True)] == [
        "rl.algos",
        "rl.algos.sub",
    ]
    assert module_name(ROOT / "rl" / "algos" / "losses.py") == "rl.algos.losses"
    assert module_name(ROOT / "rl" / "algos" / "__init__.py") == "rl.algos"


# The floors of rl/, lowest first: a unit imports its own floor's units and lower ones, never a higher floor.
RL_FLOORS = [
    # plain helpers, the registries' helper, the GRPO math
    {"rl.errors", "rl.atomic_files", "rl.decode_modes", "rl.backbones", "rl.registry", "rl.algos"},
    {"rl.samples", "rl.hub"},  # what engines and learners exchange; where models come from
    {"rl.model"},
    {"rl.data"},
    {"rl.config"},
    {"rl.estimators"},
    {"rl.pretrain"},
    {"rl.report"},
    {"rl.train"},
    {"rl.loop"},
]
# what rollout/ may take from rl/: the ground floor, the model, and the plain helpers under them
ROLLOUT_FROM_RL = {"rl.samples", "rl.model", "rl.decode_modes", "rl.atomic_files", "rl.errors"}


def _product_modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in sources()}


def _resolve(target: str, modules) -> str | None:
    """The product module an import names (`from rl.model import X` -> rl.model), None outside the product."""
    parts = target.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or None


def _rl_unit(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_rl_floors():
    modules = _product_modules()
    floor_of = {unit: i for i, units in enumerate(RL_FLOORS) for unit in units}
    units = {_rl_unit(m) for m in modules if m.startswith("rl.")} - {"rl"}
    assert units == set(floor_of), f"units of rl/ without a floor (or floors without a unit): {units ^ set(floor_of)}"
    bad = []
    for name, path in modules.items():
        if not name.startswith("rl."):
            continue
        for line, target in imported_modules(path):
            dep = _resolve(target, modules)
            if dep and dep != "rl" and floor_of[_rl_unit(dep)] > floor_of[_rl_unit(name)]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {dep}, a higher floor")
    assert not bad, "\n".join(bad)


def test_rollout_stands_on_the_ground_floor_only():
    modules = _product_modules()
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for name, path in modules.items()
        if name.startswith("rollout")
        for line, target in imported_modules(path)
        if target.split(".")[0] in ("ray", "deepspeed")
        or (target.startswith("rl.") and _rl_unit(_resolve(target, modules) or target) not in ROLLOUT_FROM_RL)
    ]
    assert not bad, "\n".join(bad)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_anywhere():
    """Module by module over the whole tree, lazy imports included: a circle inside a package counts too."""
    modules = _product_modules()
    graph = {
        name: {d for _, t in imported_modules(path) if (d := _resolve(t, modules)) and d != name}
        for name, path in modules.items()
    }
    assert not import_cycles(graph)
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_one_learner_assembly():
    """The policy updater is built in one place of the packages, `actors.learner_assembly.PolicyLearner`, which both
    learners (the DeepSpeed rank, the torch learner) are assembled by: no second copy of the assembly to drift."""
    updaters = {"PolicyUpdater", "_EngineUpdater", "updater_class"}
    built = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in updaters:
                    built.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert len(built) == 1 and built[0].startswith("actors/learner_assembly.py:"), built
