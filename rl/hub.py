"""Hugging Face Hub ids where fbrl takes a local directory (`model.path`, `model.tokenizer`, `fbrl convert`, a Hub
dataset): the local Hugging Face cache first, the Hub only when that misses and the machine may go online
(`HF_HUB_OFFLINE=1` never does), and an error naming the key and what to do otherwise. Model repositories are
fetched without pickle weights: safetensors, configs and tokenizer files only."""

from __future__ import annotations

import os
import re
from pathlib import Path

from rl.errors import InputError

# what a model snapshot needs: weights only as safetensors (never *.bin / *.pt), configs, tokenizer files
MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class HubError(InputError):
    """A Hub id that cannot be resolved to a local directory; the message names the key."""


def is_hub_id(text: str | None) -> bool:
    """`org/name` that is not a path on this machine (a local directory always wins)."""
    return bool(text) and _HUB_ID.fullmatch(text) is not None and not Path(text).expanduser().exists()


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").strip().upper() in ("1", "ON", "YES", "TRUE")


def snapshot(repo_id: str, repo_type: str = "model", key: str = "model.path") -> str:
    """The local directory of `repo_id`'s files (its snapshot in the Hugging Face cache)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = os.environ.get("HF_HUB_CACHE") or None  # read now: the library reads its constants once, at import
    patterns = MODEL_FILES if repo_type == "model" else None
    try:
        return snapshot_download(
            repo_id, repo_type=repo_type, cache_dir=cache, local_files_only=True, allow_patterns=patterns
        )
    except LocalEntryNotFoundError:
        pass
    where = f"the local Hugging Face cache ({cache or 'HF_HUB_CACHE, default ~/.cache/huggingface/hub'})"
    if offline():
        raise HubError(
            f"{key}: {repo_id} is not in {where}, and HF_HUB_OFFLINE=1 forbids downloading it: fetch it on a "
            f"machine with network (`hf download {repo_id}{' --repo-type dataset' if repo_type != 'model' else ''}`)"
            f" into that cache, or give a local directory"
        )
    try:
        return snapshot_download(repo_id, repo_type=repo_type, cache_dir=cache, allow_patterns=patterns)
    except Exception as e:  # no network, an unknown id, a gated repository without a token
        raise HubError(
            f"{key}: {repo_id} is not in {where} and could not be downloaded ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200] if str(e) else ''}); give a local directory, or fetch it first"
        ) from None


def local_model_dir(path: str | None, key: str = "model.path") -> str | None:
    """`path` itself when it is a local directory (or None), else the snapshot of the Hub id it names. `org/name`
    is also how a relative path looks: when it is neither, the error says both."""
    if not is_hub_id(path):
        return path
    try:
        return snapshot(path, "model", key)
    except HubError as e:
        raise HubError(
            f"{key}: checkpoint not found: {Path(path).expanduser().resolve()} is no directory (relative paths are "
            f"taken from the working directory, {Path.cwd()}), and as a Hugging Face Hub id: "
            f"{str(e).removeprefix(key + ': ')}"
        ) from None
