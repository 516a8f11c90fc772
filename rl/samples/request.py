"""What a rollout request asks for: `SamplingParams`, the one request type every engine takes."""

from __future__ import annotations

from dataclasses import dataclass

from rl.decode_modes import DECODE_MODES
from rl.samples.states import STATE_DTYPES
from rl.samples.temperature import TEMPERATURE_MAX, TEMPERATURE_MIN


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
            ("decode_mode", self.decode_mode in DECODE_MODES, f"must be one of {DECODE_MODES}"),
            ("states_dtype", self.states_dtype in STATE_DTYPES, f"must be one of {STATE_DTYPES}"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{name}={getattr(self, name)!r}: {why}")
