"""GRPO family as pure tensor functions: advantage estimators, policy losses, loss aggregation, KL to a reference
policy, train/rollout mismatch (metrics, off-policy corrections: TIS, masks, IcePop / seq-MIS), dynamic sampling,
overlong penalty, skip decision.

Registries map config names to functions (`ADVANTAGE_ESTIMATORS`, `POLICY_LOSSES`, `LOSS_AGG_MODES`,
`KL_ESTIMATORS`, `IS_CORRECTIONS`); add one with the matching `register_*` decorator, look one up with `get_*`
(an unknown name raises ValueError listing the valid ones). Only torch is imported — never Ray, vLLM or DeepSpeed.
"""
from .advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    dr_grpo_advantages,
    dynamic_sampling_mask,
    get_advantage_estimator,
    group_index,
    group_stats,
    grpo_advantages,
    overlong_penalty,
    register_advantage_estimator,
    rloo_advantages,
)
from .losses import (
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    PolicyLossConfig,
    agg_seq_mean_token_mean,
    agg_seq_mean_token_sum_norm,
    agg_token_mean,
    aggregate_loss,
    compute_policy_loss,
    get_kl_estimator,
    get_loss_agg_mode,
    get_policy_loss,
    kl_k1,
    kl_k2,
    kl_k3,
    no_usable_signal,
    ppo_clip_loss,
    register_kl_estimator,
    register_loss_agg_mode,
    register_policy_loss,
    reinforce_loss,
    seq_count,
    token_count,
)
from .mismatch import (
    IS_CORRECTIONS,
    IS_LEVELS,
    IS_MODES,
    get_is_correction,
    masked_is,
    mismatch_decomposition,
    mismatch_metrics,
    register_is_correction,
    rejection_mask,
    rollout_correction,
    sequence_log_ratio,
    truncated_is,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS", "POLICY_LOSSES", "LOSS_AGG_MODES", "KL_ESTIMATORS", "IS_MODES", "IS_LEVELS",
    "register_advantage_estimator", "register_policy_loss", "register_loss_agg_mode", "register_kl_estimator",
    "get_advantage_estimator", "get_policy_loss", "get_loss_agg_mode", "get_kl_estimator",
    "group_index", "group_stats", "grpo_advantages", "dr_grpo_advantages", "rloo_advantages",
    "compute_advantages", "dynamic_sampling_mask", "overlong_penalty",
    "PolicyLossConfig", "ppo_clip_loss", "reinforce_loss", "agg_token_mean", "agg_seq_mean_token_mean",
    "agg_seq_mean_token_sum_norm", "aggregate_loss", "token_count", "seq_count", "kl_k1", "kl_k2", "kl_k3",
    "compute_policy_loss", "no_usable_signal",
    "mismatch_metrics", "rollout_correction", "sequence_log_ratio", "IS_CORRECTIONS", "register_is_correction",
    "get_is_correction", "truncated_is", "rejection_mask", "masked_is", "mismatch_decomposition",
]
