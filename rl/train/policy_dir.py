"""What `RUN_DIR/policy/` holds: the trained policy as a save_pretrained directory (config, weights, tokenizer) that
AutoModelForCausalLM and vLLM load; built here, swapped in by `rl.train.run_dir.RunDir.export_policy`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from rl.backbones import TOKENIZER_FILES

POLICY_CONFIG_FILES = ("config.json", "generation_config.json")


def build_policy_dir(tmp: Path, weights_file, model_dir, tokenizer_dir=None, decode_modes=None) -> None:
    """Make `tmp` a save_pretrained directory of the policy: the weights file the learner exported (one safetensors
    file) as `model.safetensors`, the starting checkpoint's config (with `fbt_decode_modes` set to `decode_modes` when
    given: rl/decode_modes.py), generation config and tokenizer files. `RunDir.export_policy` swaps it in."""
    tmp.mkdir(parents=True)
    try:  # a hard link costs nothing; the learner replaces (never rewrites) its export file
        os.link(weights_file, tmp / "model.safetensors")
    except OSError:
        shutil.copy2(weights_file, tmp / "model.safetensors")
    for src, names in ((model_dir, POLICY_CONFIG_FILES), (tokenizer_dir or model_dir, TOKENIZER_FILES)):
        for name in names:
            if (Path(src) / name).is_file():
                shutil.copy2(Path(src) / name, tmp / name)
    if decode_modes is not None and (tmp / "config.json").is_file():
        from rl.decode_modes import CONFIG_KEY

        config = json.loads((tmp / "config.json").read_text())
        (tmp / "config.json").write_text(json.dumps({**config, CONFIG_KEY: decode_modes}, indent=2) + "\n")
