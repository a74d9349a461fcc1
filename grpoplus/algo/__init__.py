"""The algorithm core of grpoplus, usable without the trainer (see docs/concepts/algorithm-core.md).

    from grpoplus.algo import AlgoConfig, compute_advantages, policy_loss

    A = compute_advantages(rewards, group_ids, estimator="grpo")        # [N] -> [N]
    loss, metrics = policy_loss(logp, logp_old, A, mask, AlgoConfig.preset("dapo"))

    A = compute_advantages_multi(components, group_ids, weights)        # GDPO: [N, K] -> [N]

Everything is specified in ALGORITHMS.md; each estimator, loss, correction, KL estimator
and aggregation is a pure function in a registry, so a user adds one with a decorator.

The names below are imported on first use, so ``grpoplus.algo.config`` (the ``AlgoConfig`` the config schema
holds) and the registries load without torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpoplus.algo.advantages import (
        batch_whitened,
        compute_advantages,
        compute_advantages_multi,
        group_relative,
        group_stats,
        process_advantages,
        return_to_go_advantages,
        whiten_tokens,
    )
    from grpoplus.algo.aggregation import LossNorm, sequence_mean
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
    from grpoplus.algo.corrections import Correction
    from grpoplus.algo.covariance import clip_cov_select, kl_cov_select, token_covariance
    from grpoplus.algo.distill import generalized_jsd, opd_advantages, opd_metrics, opd_token_kl, reverse_kl
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
        kl_in_reward,
        reset_reference,
        should_reset_reference,
        soft_update_reference,
        update_reference,
    )
    from grpoplus.algo.losses import per_sequence, ratio_dependent, selects_tokens
    from grpoplus.algo.registries import ADVANTAGES, AGGREGATIONS, CORRECTIONS, DISTILL_LOSSES, KL_ESTIMATORS, LOSSES

_HOMES = {
    "batch_whitened": "grpoplus.algo.advantages",
    "compute_advantages": "grpoplus.algo.advantages",
    "compute_advantages_multi": "grpoplus.algo.advantages",
    "group_relative": "grpoplus.algo.advantages",
    "group_stats": "grpoplus.algo.advantages",
    "process_advantages": "grpoplus.algo.advantages",
    "return_to_go_advantages": "grpoplus.algo.advantages",
    "whiten_tokens": "grpoplus.algo.advantages",
    "LossNorm": "grpoplus.algo.aggregation",
    "sequence_mean": "grpoplus.algo.aggregation",
    "AlgoConfig": "grpoplus.algo.config",
    "PRESETS": "grpoplus.algo.config",
    "apply_mask_corrections": "grpoplus.algo.core",
    "correction_weights": "grpoplus.algo.core",
    "mismatch_metrics": "grpoplus.algo.core",
    "needs_token_selection": "grpoplus.algo.core",
    "policy_loss": "grpoplus.algo.core",
    "prepare_loss": "grpoplus.algo.core",
    "select_tokens": "grpoplus.algo.core",
    "Correction": "grpoplus.algo.corrections",
    "clip_cov_select": "grpoplus.algo.covariance",
    "kl_cov_select": "grpoplus.algo.covariance",
    "token_covariance": "grpoplus.algo.covariance",
    "generalized_jsd": "grpoplus.algo.distill",
    "opd_advantages": "grpoplus.algo.distill",
    "opd_metrics": "grpoplus.algo.distill",
    "opd_token_kl": "grpoplus.algo.distill",
    "reverse_kl": "grpoplus.algo.distill",
    "EntropyControl": "grpoplus.algo.entropy",
    "dynamic_sampling_keep": "grpoplus.algo.filters",
    "gfpo_select": "grpoplus.algo.filters",
    "high_entropy_mask": "grpoplus.algo.filters",
    "overlong_filter_mask": "grpoplus.algo.filters",
    "soft_overlong_penalty": "grpoplus.algo.filters",
    "zero_variance_groups": "grpoplus.algo.filters",
    "kl_in_reward": "grpoplus.algo.kl",
    "reset_reference": "grpoplus.algo.kl",
    "should_reset_reference": "grpoplus.algo.kl",
    "soft_update_reference": "grpoplus.algo.kl",
    "update_reference": "grpoplus.algo.kl",
    "per_sequence": "grpoplus.algo.losses",
    "ratio_dependent": "grpoplus.algo.losses",
    "selects_tokens": "grpoplus.algo.losses",
    "ADVANTAGES": "grpoplus.algo.registries",
    "AGGREGATIONS": "grpoplus.algo.registries",
    "CORRECTIONS": "grpoplus.algo.registries",
    "DISTILL_LOSSES": "grpoplus.algo.registries",
    "KL_ESTIMATORS": "grpoplus.algo.registries",
    "LOSSES": "grpoplus.algo.registries",
}

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
    "mismatch_metrics",
    "needs_token_selection",
    "opd_advantages",
    "opd_metrics",
    "opd_token_kl",
    "overlong_filter_mask",
    "per_sequence",
    "policy_loss",
    "prepare_loss",
    "process_advantages",
    "ratio_dependent",
    "reset_reference",
    "return_to_go_advantages",
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


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'grpoplus.algo' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
