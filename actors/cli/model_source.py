"""`model.path` as a user gives it → the FBT checkpoint a job trains.

- A Hugging Face Hub id (`org/name`) in `model.path` or `model.tokenizer` is resolved to its snapshot in the local
  cache (downloaded when missing and the machine may go online; `rl.hub`).
- A stock checkpoint of a supported backbone (Llama, Qwen2, Qwen3, Mistral) is converted to an FBT when the job
  starts, into `RUN_DIR/base_model/` (`model.convert_init`: identity by default, so the job starts exactly at the
  stock model). The choice is printed, written to `RUN_DIR/base_model/conversion.json`, and the run's
  config.yaml names the converted checkpoint, so `--resume` loads it as it is.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path


def resolve_hub_ids(cfg):
    """`cfg` with Hub ids in model.path / model.tokenizer replaced by their local snapshot directories."""
    from rl.hub import local_model_dir

    model = cfg.model
    local = dataclasses.replace(
        model,
        path=local_model_dir(model.path, "model.path"),
        tokenizer=local_model_dir(model.tokenizer, "model.tokenizer"),
    )
    return cfg if local == model else dataclasses.replace(cfg, model=local)


def convert_stock_model(cfg, run_path: Path, log=print):
    """`cfg` unchanged for an FBT checkpoint; for a stock one, converted into `run_path/base_model` and `cfg` with
    model.path pointing there."""
    from rl.backbones import stock_backbone

    src = Path(cfg.model.path)
    config = json.loads((src / "config.json").read_text())
    kind = stock_backbone(config)
    if kind is None:
        return cfg
    from rl.model.conversion import convert_checkpoint  # the model classes: only when there is a model to convert

    init = cfg.model.convert_init
    # gate_product has no identity point: the identity conversion uses linear_addition unless told otherwise
    mode = cfg.model.fusion_mode if init == "random" or cfg.model.fusion_mode != "gate_product" else "linear_addition"
    out = run_path / "base_model"
    convert_checkpoint(src, out, mode, init, seed=cfg.train.seed)
    (out / "conversion.json").write_text(
        json.dumps({"source": str(src), "backbone": kind, "fusion_mode": mode, "init": init}, indent=1) + "\n"
    )
    starts = (
        "it decodes exactly like the stock model until training moves it"
        if init == "identity"
        else ("random fusion weights: multi-pass training (`fbrl pretrain`) should come first")
    )
    log(
        f"model.path: {src} is a stock {config['architectures'][0]} checkpoint: converted to an FBT ({mode}, "
        f"model.convert_init={init}: {starts}) in {out}"
    )
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(out)))
