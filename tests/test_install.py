"""`pip install .` (not editable), then `fbrl train` from an empty directory runs the default job (docs/INSTALL.md).

Installing every dependency into a fresh venv takes minutes and a package index, so the test installs fbrl alone:
it builds fbrl's wheel from a copy of the working tree (as a clone would have it), installs it with `--no-deps`
into a fresh venv, and gives that venv this environment's packages through a .pth file. Python adds a .pth line's
directory to sys.path but does not run the .pth files inside it, so an editable install of fbrl there (the dev
venv's) stays inert: the copy under test is the only fbrl that can be imported, which the test checks. Then the
console script runs the embedded default (configs/tiny.yaml on checkpoints/tiny-arith-mixed, found in the
installed data package) for two steps, from a directory that holds nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

REPO = ROOT


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def copy_of_the_tree(dest: Path) -> Path:
    """The files a clone would have (tracked, and untracked but not ignored: what `git status` would commit)."""
    files = run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO).stdout.split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def fresh_venv_with_fbrl(tmp: Path) -> Path:
    """A venv holding only the fbrl wheel; its dependencies come from this environment's site-packages."""
    src = copy_of_the_tree(tmp / "src")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp / "wheel", src])
    (wheel,) = (tmp / "wheel").glob("fbrl-*.whl")
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    purelib = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (purelib / "dependencies.pth").write_text("".join(p + "\n" for p in site.getsitepackages()))
    run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed", wheel], env=clean_env())
    return venv


def clean_env() -> dict:
    """This environment without anything that would put a source tree on sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return env | {
        "WANDB_MODE": "offline",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }


def test_pip_install_then_fbrl_train_from_an_empty_directory(tmp_path):
    venv = fresh_venv_with_fbrl(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    where = run(
        [
            venv / "bin" / "python",
            "-c",
            "import rl, rollout, rewards, actors, rl.config.loading as l; print(rl.__file__); print(l.DEFAULT_CONFIG)",
        ],
        cwd=work,
        env=clean_env(),
    ).stdout.split()
    installed = str(venv.resolve())
    assert where[0].startswith(installed), f"rl imported from {where[0]}, not the installed copy under {installed}"
    assert where[1].startswith(installed) and where[1].endswith("fbrl_data/configs/tiny.yaml"), where

    proc = subprocess.run(
        [venv / "bin" / "fbrl", "train", "train.steps=2", "run_dir=run"],
        cwd=work,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    steps = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r["step"] > 0] == [1, 2], steps
    # The job read the installed default checkpoint, not one of a source tree.
    model_path = yaml.safe_load((work / "run" / "config.yaml").read_text())["model"]["path"]
    assert model_path.startswith(installed) and model_path.endswith("fbrl_data/checkpoints/tiny-arith-mixed")
    assert sorted(p.name for p in work.iterdir()) == ["run"]


@pytest.mark.slow  # (~1-2 min of index lookups; untested on a GPU: this only checks that the GPU stack resolves)
def test_the_gpu_install_resolves():
    """`make venv-gpu`'s second line, as pip's dry run: fbrl's gpu extra (vLLM 0.32 for CUDA) with the dev extra
    and constraints.txt resolves to one consistent set (torch 2.13, vllm 0.32, transformers 5.19)."""
    proc = run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "-c",
            "constraints.txt",
            ".[gpu,dev]",
        ],
        cwd=REPO,
        env=dict(os.environ, DS_BUILD_OPS="0"),
    )
    wanted = proc.stdout.splitlines()[-1]
    assert wanted.startswith("Would install")
    for pin in ("vllm-0.32.", "transformers-5.19.0", "torch-2.13.0"):
        assert pin in wanted, wanted
