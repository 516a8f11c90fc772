"""What a rollout request asks for (`SamplingParams`), and the loop's requests made from the config
(`sampling_params`: the training samples, and the greedy held-out evaluation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rl.decode_modes import MODES as PROMPT_MODES
from rl.estimators.logprob_contract import TEMPERATURE_MAX, TEMPERATURE_MIN
from rl.estimators.states import STATE_DTYPES, params_states_dtype

if TYPE_CHECKING:
    from rl.config import Config


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    decode_mode: str = "soft"
    record_states: bool = False
    states_dtype: str = "float32"

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        checks = [
            ("n", self.n >= 1, "must be >= 1"),
            (
                "temperature",
                self.temperature == 0 or TEMPERATURE_MIN <= self.temperature <= TEMPERATURE_MAX,
                f"must be 0 (greedy) or in [{TEMPERATURE_MIN}, {TEMPERATURE_MAX}] (vLLM rejects higher ones and "
                f"silently raises lower ones to {TEMPERATURE_MIN}: both engines refuse them)",
            ),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", self.top_k >= 0, "must be >= 0 (0 = off)"),
            ("max_tokens", self.max_tokens >= 1, "must be >= 1"),
            ("decode_mode", self.decode_mode in PROMPT_MODES, f"must be one of {PROMPT_MODES}"),
            ("states_dtype", self.states_dtype in STATE_DTYPES, f"must be one of {STATE_DTYPES}"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{name}={getattr(self, name)!r}: {why}")


def sampling_params(cfg: Config, eos_id: int, greedy: bool = False, decode_mode: str | None = None, seed=None):
    """The request for a training step (G samples per prompt, recording states for the `replay` estimator) or,
    `greedy`, for a held-out evaluation in `decode_mode`."""
    r = cfg.rollout
    return SamplingParams(
        n=1 if greedy else r.n_samples_per_prompt,
        temperature=0.0 if greedy else r.temperature,
        top_p=1.0 if greedy else r.top_p,
        top_k=0 if greedy or r.top_k < 0 else r.top_k,
        max_tokens=r.max_tokens,
        stop_token_ids=(eos_id,),
        seed=seed,
        decode_mode=decode_mode or r.decode_mode,
        record_states=not greedy and cfg.likelihood.estimator == "replay",
        states_dtype=params_states_dtype(r.record_states_dtype, engines_on_gpu=r.num_gpus_per_engine > 0),
    )
