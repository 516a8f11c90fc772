"""The loop's rollout requests made from the config (`sampling_params`): the training samples, and the greedy
held-out evaluation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl.estimators.likelihood import needs_recorded_states
from rl.samples.request import SamplingParams
from rl.samples.states import params_states_dtype

if TYPE_CHECKING:
    from rl.config import Config


def sampling_params(cfg: Config, eos_id: int, greedy: bool = False, decode_mode: str | None = None, seed=None):
    """The request for a training step (G samples per prompt, recording states when the likelihood estimator reads them) or,
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
        record_states=not greedy and needs_recorded_states(cfg.likelihood.estimator),
        states_dtype=params_states_dtype(r.record_states_dtype, engines_on_gpu=r.num_gpus_per_engine > 0),
    )
