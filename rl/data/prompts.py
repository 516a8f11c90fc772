"""Prompts that fit the rollout engine: the token limit, and what happens to a longer prompt.

A prompt whose tokens plus `rollout.max_tokens` exceed the engine's context is refused by the engine, and the
whole step with it, whenever the sampler draws it (possibly hours into a job). So the limit is applied once, when
the data is loaded (`PromptFitter.fit`): such prompts are dropped with a count (`data.overlong_prompts: drop`, the
default), stop the job at load (`error`), or are cut to the limit when they are encoded (`truncate_left` keeps
the end of the prompt, where the question usually is, after the leading BOS; `truncate_right` keeps the start).
"""

from __future__ import annotations

from rl.data.jsonl import DataError
from rl.data.loaders import encode_prompt

# vLLM's per-sequence bound when the config sets none: the model's positions, at most this many (a longer bound
# makes the no-preemption KV budget of max_num_seqs sequences large on CPU).
VLLM_DEFAULT_MAX_LEN = 2048


def vllm_max_model_len(cfg, model_config) -> int:
    """vLLM's per-sequence bound: `rollout.vllm.max_model_len`, else the model's positions (at most 2048)."""
    if cfg.rollout.vllm.max_model_len:
        return int(cfg.rollout.vllm.max_model_len)
    return int(
        min(
            getattr(model_config, "max_position_embeddings", VLLM_DEFAULT_MAX_LEN) or VLLM_DEFAULT_MAX_LEN,
            VLLM_DEFAULT_MAX_LEN,
        )
    )


def engine_context_len(cfg, model_config) -> int:
    """Tokens one sequence (prompt + response) may hold in the configured rollout engine: vLLM's max_model_len,
    the torch engine's max_position_embeddings."""
    if cfg.rollout.engine == "torch":
        return int(getattr(model_config, "max_position_embeddings", None) or VLLM_DEFAULT_MAX_LEN)
    return vllm_max_model_len(cfg, model_config)


def prompt_token_limit(cfg, model_config=None) -> int:
    """`data.max_prompt_tokens`, else the engine's context minus `rollout.max_tokens` (room for a full response)."""
    if cfg.data.max_prompt_tokens:
        return int(cfg.data.max_prompt_tokens)
    if model_config is None:
        from rl.model.files import load_fbt_config

        model_config = load_fbt_config(cfg.model.path)
    context = engine_context_len(cfg, model_config)
    limit = context - cfg.rollout.max_tokens
    if limit < 1:
        raise DataError(
            f"rollout.max_tokens={cfg.rollout.max_tokens} leaves no room for a prompt in the rollout "
            f"engine's context of {context} tokens (rollout.vllm.max_model_len or the model's "
            f"max_position_embeddings)"
        )
    return limit


class PromptFitter:
    """Encodes prompts for the engine and applies the limit (`data.overlong_prompts`)."""

    def __init__(self, tokenizer, limit: int, mode: str = "drop"):
        if mode not in ("drop", "truncate_left", "truncate_right", "error"):
            raise ValueError(f"data.overlong_prompts: unknown mode {mode!r}")
        self.tokenizer, self.limit, self.mode = tokenizer, int(limit), mode

    def encode(self, row: dict) -> list[int]:
        """Token ids of a row's prompt (`rl.data.loaders.encode_prompt`: chats already templated), cut to the limit
        when the mode truncates."""
        ids = encode_prompt(self.tokenizer, row)
        if len(ids) <= self.limit or self.mode not in ("truncate_left", "truncate_right"):
            return ids
        if self.mode == "truncate_right":
            return ids[: self.limit]
        head = ids[:1] if ids[0] == self.tokenizer.bos_token_id else []  # feedback resets at BOS: keep it
        return head + ids[len(ids) - (self.limit - len(head)) :]

    def fit(self, rows: list[dict], what: str) -> tuple[list[dict], int]:
        """(rows to use, number of over-long prompts among `rows`). `drop` leaves them out; `error` raises naming
        the first; truncation keeps them (`encode` cuts them)."""
        if not rows:
            return rows, 0
        lengths = self._lengths(rows)
        over = [i for i, n in enumerate(lengths) if n > self.limit]
        if not over:
            return rows, 0
        if self.mode == "error":
            i = over[0]
            raise DataError(
                f"{what}: row {i} (from 0) has a prompt of {lengths[i]} tokens, more than the limit of "
                f"{self.limit} ({len(over)} of {len(rows)} rows are over it); set "
                f"data.overlong_prompts to drop or truncate them, or raise data.max_prompt_tokens"
            )
        if self.mode != "drop":
            return rows, len(over)
        dropped = set(over)
        kept = [r for i, r in enumerate(rows) if i not in dropped]
        if not kept:
            raise DataError(
                f"{what}: every one of the {len(rows)} prompts is longer than the limit of "
                f"{self.limit} tokens (data.max_prompt_tokens, or the engine's context minus "
                f"rollout.max_tokens)"
            )
        return kept, len(over)

    def _lengths(self, rows: list[dict]) -> list[int]:
        """Each row's prompt length in tokens, as `encode_prompt` counts them (batched per kind of row)."""
        out = [0] * len(rows)
        for templated in (False, True):
            idx = [i for i, r in enumerate(rows) if bool(r.get("chat_templated", False)) == templated]
            if idx:
                ids = self.tokenizer([rows[i]["prompt"] for i in idx], add_special_tokens=not templated)["input_ids"]
                for i, x in zip(idx, ids):
                    out[i] = len(x)
        return out
