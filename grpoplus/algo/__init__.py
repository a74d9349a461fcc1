"""The algorithm core of grpoplus, usable without the trainer (see README.md, section The algorithm core).

    from grpoplus.algo import AlgoConfig, compute_advantages, policy_loss

    A = compute_advantages(rewards, group_ids, estimator="grpo")        # [N] -> [N]
    loss, metrics = policy_loss(logp, logp_old, A, mask, AlgoConfig.preset("dapo"))

Everything is specified in ALGORITHMS.md; each estimator, loss, correction, KL estimator
and aggregation is a pure function in a registry, so a user adds one with a decorator.
"""

from grpoplus.algo.advantages import ADVANTAGES, compute_advantages, group_stats, process_advantages
from grpoplus.algo.aggregation import AGGREGATIONS, LossNorm, sequence_mean
from grpoplus.algo.config import PRESETS, AlgoConfig
from grpoplus.algo.core import (
    apply_mask_corrections,
    correction_weights,
    prepare_loss,
    mismatch_metrics,
    policy_loss,
)
from grpoplus.algo.corrections import CORRECTIONS, Correction
from grpoplus.algo.filters import (
    dynamic_sampling_keep,
    gfpo_select,
    high_entropy_mask,
    overlong_filter_mask,
    soft_overlong_penalty,
    zero_variance_groups,
)
from grpoplus.algo.kl import KL_ESTIMATORS, kl_in_reward, reset_reference, should_reset_reference
from grpoplus.algo.losses import LOSSES, per_sequence

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "CORRECTIONS",
    "KL_ESTIMATORS",
    "LOSSES",
    "PRESETS",
    "AlgoConfig",
    "Correction",
    "LossNorm",
    "apply_mask_corrections",
    "compute_advantages",
    "correction_weights",
    "dynamic_sampling_keep",
    "prepare_loss",
    "gfpo_select",
    "group_stats",
    "high_entropy_mask",
    "kl_in_reward",
    "mismatch_metrics",
    "overlong_filter_mask",
    "per_sequence",
    "policy_loss",
    "process_advantages",
    "reset_reference",
    "sequence_mean",
    "should_reset_reference",
    "soft_overlong_penalty",
    "zero_variance_groups",
]
