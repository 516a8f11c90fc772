"""One address per name: no two modules of fbrl share a file name, no module re-exports another's names, and a
top-level name is defined in one module only — except the interfaces below, where modules implement the same
names on purpose."""

import ast
import collections
from pathlib import Path

from test_layering import ROOT, sources

# name -> (the modules that define it, why)
INTERFACES = {
    # a generated task's module: its split rule, problem maker and generator (rl/data/tasks.py lists the tasks)
    **{
        name: ({"rl/data/arith.py", "rl/data/track.py", "rl/data/word_problems.py"}, "generated task")
        for name in ("SPLITS", "generate", "make_problem", "problem_hash", "split_of")
    },
    "LEVELS": ({"rl/data/arith.py", "rl/data/word_problems.py"}, "generated task with levels"),
    "score": ({"rl/data/arith.py", "rl/data/track.py"}, "generated task with its own scorer"),
    # an `fbrl` command's module (actors/cli/__init__.py imports it by name)
    **{
        name: (
            {
                "actors/cli/compare.py",
                "actors/cli/convert.py",
                "actors/cli/evaluate.py",
                "actors/cli/launch.py",
                "actors/cli/pretraining.py",
            },
            "fbrl command",
        )
        for name in ("add_arguments", "run")
    },
    # the entry points: a job from Python, the RL loop, multi-pass pretraining
    "train": ({"actors/api.py", "rl/loop.py", "rl/pretrain/trainer.py"}, "entry point"),
    # vLLM finds a model class by the architecture name in config.json: the plugin's classes carry the HF names
    **{
        f"FBT{b}ForCausalLM": ({"rl/model/fbt_backbones.py", "rollout/vllm_plugin.py"}, "architecture name")
        for b in ("Llama", "Mistral", "Qwen2", "Qwen3")
    },
}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_no_two_modules_share_a_file_name():
    by_name = collections.defaultdict(list)
    for path in sources():
        if path.name != "__init__.py":
            by_name[path.stem].append(_rel(path))
    assert not {k: v for k, v in by_name.items() if len(v) > 1}


def test_no_module_re_exports_another():
    """A package's __init__ may gather its modules' names; a module imports names it uses, and nothing else (an
    `import package` for its side effect, such as registering the FBT classes with transformers, is not a name)."""
    found = []
    for path in sources():
        if path.name == "__init__.py":
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            from_import = code.lstrip().startswith("from ") and " import " in code
            if (from_import and ("F401" in line or code.rstrip().endswith("import *"))) or "re-export" in line:
                found.append(f"{_rel(path)}:{lineno}: {line.strip()}")
    assert not found, "\n".join(found)


def test_every_top_level_name_is_defined_once():
    where = collections.defaultdict(set)
    for path in sources():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            else:
                continue
            for name in names:
                if not name.startswith("_") and name != "log":
                    where[name].add(_rel(path))
    twice = {
        name: sorted(paths)
        for name, paths in where.items()
        if len(paths) > 1 and not (name in INTERFACES and paths <= INTERFACES[name][0])
    }
    assert not twice, f"names defined in several modules: {twice}"
