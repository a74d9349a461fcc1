"""The algorithm core of grpoplus, usable without the trainer (see docs/concepts/algorithm-core.md).

    from grpoplus.algo import AlgoConfig, compute_advantages, policy_loss

    A = compute_advantages(rewards, group_ids, estimator="grpo")        # [N] -> [N]
    loss, metrics = policy_loss(logp, logp_old, A, mask, AlgoConfig.preset("dapo"))

    A = compute_advantages_multi(components, group_ids, weights)        # GDPO: [N, K] -> [N]

Everything is specified in ALGORITHMS.md; each estimator, loss, correction, KL estimator
and aggregation is a pure function in a registry, so a user adds one with a decorator.
"""

from grpoplus.algo.advantages import (
    ADVANTAGES,
    batch_whitened,
    compute_advantages,
    compute_advantages_multi,
    group_relative,
    group_stats,
    process_advantages,
    return_to_go_advantages,
    whiten_tokens,
)
from grpoplus.algo.aggregation import AGGREGATIONS, LossNorm, sequence_mean
from grpoplus.algo.config import PRESETS, AlgoConfig
from grpoplus.algo.core import (
    apply_mask_corrections,
    correction_weights,
    mismatch_metrics,
    needs_token_selection,
    policy_loss,
    prepare_loss,
    select_tokens,
)
from grpoplus.algo.corrections import CORRECTIONS, Correction
from grpoplus.algo.covariance import clip_cov_select, kl_cov_select, token_covariance
from grpoplus.algo.distill import (
    DISTILL_LOSSES,
    generalized_jsd,
    opd_advantages,
    opd_metrics,
    opd_token_kl,
    reverse_kl,
)
from grpoplus.algo.entropy import EntropyControl
from grpoplus.algo.filters import (
    dynamic_sampling_keep,
    gfpo_select,
    high_entropy_mask,
    overlong_filter_mask,
    soft_overlong_penalty,
    zero_variance_groups,
)
from grpoplus.algo.kl import (
    KL_ESTIMATORS,
    kl_in_reward,
    reset_reference,
    should_reset_reference,
    soft_update_reference,
    update_reference,
)
from grpoplus.algo.losses import LOSSES, per_sequence, ratio_dependent, selects_tokens

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "CORRECTIONS",
    "DISTILL_LOSSES",
    "KL_ESTIMATORS",
    "LOSSES",
    "PRESETS",
    "AlgoConfig",
    "Correction",
    "EntropyControl",
    "LossNorm",
    "apply_mask_corrections",
    "batch_whitened",
    "clip_cov_select",
    "compute_advantages",
    "compute_advantages_multi",
    "correction_weights",
    "dynamic_sampling_keep",
    "generalized_jsd",
    "gfpo_select",
    "group_relative",
    "group_stats",
    "high_entropy_mask",
    "kl_cov_select",
    "kl_in_reward",
    "opd_advantages",
    "opd_metrics",
    "opd_token_kl",
    "mismatch_metrics",
    "needs_token_selection",
    "overlong_filter_mask",
    "per_sequence",
    "policy_loss",
    "prepare_loss",
    "process_advantages",
    "return_to_go_advantages",
    "ratio_dependent",
    "reset_reference",
    "reverse_kl",
    "select_tokens",
    "selects_tokens",
    "sequence_mean",
    "should_reset_reference",
    "soft_overlong_penalty",
    "soft_update_reference",
    "token_covariance",
    "update_reference",
    "whiten_tokens",
    "zero_variance_groups",
]
