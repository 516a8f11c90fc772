"""Secrets in configs: values under secret-looking keys (a reward's API key, a token) are never written to
config.yaml, logs or wandb (rl/train/run_dir.py, actors/cli/launch.py); a resumed run asks for the config that holds
them."""

from __future__ import annotations

import re

# Keys whose values are secrets (a reward's API key, a token): never written to config.yaml, logs or wandb.
SECRET_KEY = re.compile(
    r"(?i)^(?:.*[_-])?(?:api[_-]?key|apikey|secret|password|passwd|token|access[_-]?key|"
    r"credentials?)$"
)
REDACTED = "<redacted>"


def redacted(data):
    """`data` (plain dicts / lists) with the value of every secret-looking key replaced by "<redacted>"."""
    if isinstance(data, dict):
        return {
            k: REDACTED if isinstance(k, str) and SECRET_KEY.match(k) and v is not None else redacted(v)
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [redacted(v) for v in data]
    return data
