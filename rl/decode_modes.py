"""Which decode modes a checkpoint was trained for, and the warning when a command asks for another.

An FBT checkpoint decodes in three modes (`standard`, `soft`, `fused`: docs/ARCHITECTURE.md), but serves only those
its training covered: a model trained with feedback on the response only has never seen a fused prompt and scores
near 0 in `fused` mode, truncating a third of its answers, with nothing else to say why. So checkpoints record
them in config.json, `fbt_decode_modes` (a sorted list):

- `fbrl pretrain` / SFT: what the multi-pass objective trained (`modes_of_pretraining`): `standard` when some steps
  run one pass (K=1 is the plain forward), and with K >= 2 `fused` when feedback reaches every position
  (`feedback_on: all`), `soft` when the prompt stays plain (`feedback_on: response`, or a plain-prefix mixin).
- `fbrl train`: the starting checkpoint's modes plus the rollout's decode mode (RL trains that mode).
- `fbrl convert`: `standard` (the fusion weights are new).

Checkpoints written before the record existed are read from their `pretrain_config.yaml` the same way; without
either, the modes are unknown and nothing is said.
"""

from __future__ import annotations

import json
from pathlib import Path

DECODE_MODES = ("standard", "soft", "fused")
CONFIG_KEY = "fbt_decode_modes"


def modes_of_pretraining(pcfg) -> list[str]:
    """The decode modes a `pretrain` section's objective trains (pcfg: rl.config.PretrainConfig or its dict)."""
    get = (lambda k: pcfg.get(k)) if isinstance(pcfg, dict) else (lambda k: getattr(pcfg, k))
    if get("schedule") == "mixture":
        passes = [k + 1 for k, p in enumerate(get("mixture_probs") or []) if p > 0]
    else:
        passes = [int(k) for _, k in get("pass_schedule") or []]
    modes = set()
    if 1 in passes:
        modes.add("standard")
    if any(k >= 2 for k in passes):
        if get("feedback_on") == "all":
            modes.add("fused")
        if get("feedback_on") == "response" or (get("prefix_mixin") or 0) > 0:
            modes.add("soft")
    return sorted(modes, key=DECODE_MODES.index)


def trained_decode_modes(checkpoint: str | Path) -> list[str] | None:
    """The modes a checkpoint directory was trained for: its config.json record, else its pretrain_config.yaml,
    else None (unknown)."""
    path = Path(checkpoint)
    try:
        recorded = json.loads((path / "config.json").read_text()).get(CONFIG_KEY)
    except (OSError, ValueError):
        recorded = None
    if recorded:
        return sorted(set(recorded) & set(DECODE_MODES), key=DECODE_MODES.index)
    saved = path / "pretrain_config.yaml"
    if saved.is_file():
        import yaml

        pcfg = (yaml.safe_load(saved.read_text()) or {}).get("pretrain")
        if isinstance(pcfg, dict):
            return modes_of_pretraining(pcfg) or None
    return None


def record(model_config, modes) -> None:
    """Set the record on a transformers config before `save_pretrained`."""
    setattr(model_config, CONFIG_KEY, sorted(set(modes) & set(DECODE_MODES), key=DECODE_MODES.index))


def rl_modes(checkpoint: str | Path, mode: str) -> list[str] | None:
    """RL trains the rollout's decode mode: the policy's modes are the starting checkpoint's plus that one (None,
    unknown, when the starting checkpoint's modes are)."""
    base = trained_decode_modes(checkpoint)
    return None if base is None else sorted({*base, mode}, key=DECODE_MODES.index)


def record_rl_mode(model_config, checkpoint: str | Path, mode: str) -> None:
    """`rl_modes` on a transformers config (the learner's, before its checkpoints are saved)."""
    modes = rl_modes(checkpoint, mode)
    if modes is not None:
        record(model_config, modes)


def mode_warning(checkpoint: str | Path, wanted, what: str) -> str | None:
    """A one-line warning when `wanted` (one mode or several) holds a mode the checkpoint was not trained for."""
    trained = trained_decode_modes(checkpoint)
    wanted = [wanted] if isinstance(wanted, str) else list(wanted)
    missing = [m for m in dict.fromkeys(wanted) if trained is not None and m not in trained]
    if not missing:
        return None
    return (
        f"warning: {checkpoint} was trained for decode mode{'s' if len(trained) > 1 else ''} "
        f"{', '.join(trained)}, not {', '.join(missing)} ({what}): expect low accuracy and truncated answers in "
        f"{'that mode' if len(missing) == 1 else 'those modes'} (docs/PRETRAINING.md says which objective "
        f"trains which mode)"
    )
