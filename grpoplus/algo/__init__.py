"""The algorithm core of grpoplus, usable without the trainer (see docs/concepts/algorithm-core.md).

    from grpoplus.algo import AlgoConfig, compute_advantages, policy_loss

    A = compute_advantages(rewards, group_ids, estimator="grpo")        # [N] -> [N]
    loss, metrics = policy_loss(logp, logp_old, A, mask, AlgoConfig.preset("dapo"))

    A = compute_advantages_multi(components, group_ids, weights)        # GDPO: [N, K] -> [N]

Everything is specified in ALGORITHMS.md; each estimator, loss, correction, KL estimator
and aggregation is a pure function in a registry, so a user adds one with a decorator.

The names below are imported on first use, so ``grpoplus.algo.config`` (the ``AlgoConfig`` the config schema
holds) and the registries load without torch."""

# ruff: noqa: F401  (the imports below are for type checkers: the names are handed out by __getattr__)

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the same names, for type checkers and editors (tests/config/test_schema.py ties them)
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

_EXPORTS = {  # module -> the names it hands out here
    "grpoplus.algo.advantages": ["batch_whitened", "compute_advantages", "compute_advantages_multi", "group_relative",
                                 "group_stats", "process_advantages", "return_to_go_advantages", "whiten_tokens"],
    "grpoplus.algo.aggregation": ["LossNorm", "sequence_mean"],
    "grpoplus.algo.config": ["AlgoConfig", "PRESETS"],
    "grpoplus.algo.core": ["apply_mask_corrections", "correction_weights", "mismatch_metrics", "needs_token_selection",
                           "policy_loss", "prepare_loss", "select_tokens"],
    "grpoplus.algo.corrections": ["Correction"],
    "grpoplus.algo.covariance": ["clip_cov_select", "kl_cov_select", "token_covariance"],
    "grpoplus.algo.distill": ["generalized_jsd", "opd_advantages", "opd_metrics", "opd_token_kl", "reverse_kl"],
    "grpoplus.algo.entropy": ["EntropyControl"],
    "grpoplus.algo.filters": ["dynamic_sampling_keep", "gfpo_select", "high_entropy_mask", "overlong_filter_mask",
                              "soft_overlong_penalty", "zero_variance_groups"],
    "grpoplus.algo.kl": ["kl_in_reward", "reset_reference", "should_reset_reference", "soft_update_reference",
                         "update_reference"],
    "grpoplus.algo.losses": ["per_sequence", "ratio_dependent", "selects_tokens"],
    "grpoplus.algo.registries": ["ADVANTAGES", "AGGREGATIONS", "CORRECTIONS", "DISTILL_LOSSES", "KL_ESTIMATORS",
                                 "LOSSES"],
}
_HOMES = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'grpoplus.algo' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
