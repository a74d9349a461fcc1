"""The named checks of :class:`~grpoplus.algo.AlgoConfig`'s values: ranges and the combinations of its own fields.

Each is one row of :data:`CHECKS`: a name, the condition, and the sentence a config that breaks it gets (formatted
with the config's fields). ``AlgoConfig`` applies them in order as it is built (after the type and name checks); the
config's rules page (``reference/rules.md``) lists them beside the rules across sections.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grpoplus.algo.registries import ADVANTAGES

if TYPE_CHECKING:
    from grpoplus.algo.config import AlgoConfig

RATIO_CLIP_LOSSES = ("clip", "gspo", "gspo_token")
"""Losses whose trust region is [1-eps_low, 1+eps_high] on the ratio: eps_low must stay below 1."""


@dataclass(frozen=True)
class AlgoCheck:
    """One check: ``holds(cfg)`` is True for a valid config; ``says`` is the error, formatted with its fields."""

    name: str
    holds: Callable[[AlgoConfig], bool]
    says: str

    @property
    def what(self) -> str:
        """The requirement in words, without the values a config had (for the rules page)."""
        text = self.says.split(", got ")[0]
        return text.replace("!r}", "}").replace("{", "`").replace("}", "`")


def _whitens_over_batch(c: AlgoConfig) -> bool:
    return c.reward_aggregation == "gdpo" or getattr(ADVANTAGES.get(c.adv_estimator), "batch_whitened", False)


CHECKS: tuple[AlgoCheck, ...] = (
    AlgoCheck("adv_eps_positive", lambda c: c.adv_eps > 0, "adv_eps must be > 0, got {adv_eps}"),
    AlgoCheck("token_whitening_needs_batch_whitening", lambda c: c.adv_whiten == "response" or _whitens_over_batch(c),
              "adv_whiten='token' acts on an estimator that whitens over the batch (reinforce_pp) or with "
              "reward_aggregation='gdpo'; adv_estimator={adv_estimator!r} does neither"),
    AlgoCheck("trust_region_widths", lambda c: c.eps_low >= 0 and c.eps_high >= 0,
              "eps_low/eps_high must be >= 0, got {eps_low}/{eps_high}"),
    AlgoCheck("ratio_clip_below_one", lambda c: c.loss not in RATIO_CLIP_LOSSES or c.eps_low < 1,
              "eps_low must be < 1 for loss={loss!r} (ratio clip 1-eps_low), got {eps_low}"),
    AlgoCheck("dual_clip_above_one", lambda c: c.dual_clip_c is None or c.dual_clip_c > 1,
              "dual_clip_c must be > 1 (or None = off), got {dual_clip_c}"),
    AlgoCheck("pg_cap_positive", lambda c: c.pg_cap > 0, "pg_cap must be > 0, got {pg_cap}"),
    AlgoCheck("sapo_temperatures", lambda c: c.tau_pos > 0 and c.tau_neg > 0,
              "tau_pos/tau_neg must be > 0, got {tau_pos}/{tau_neg}"),
    AlgoCheck("cov_ratio_range", lambda c: 0 < c.cov_ratio <= 1, "cov_ratio must be in (0, 1], got {cov_ratio}"),
    AlgoCheck("cov_bounds_ordered", lambda c: c.cov_lb < c.cov_ub, "cov_lb must be < cov_ub, got {cov_lb}/{cov_ub}"),
    AlgoCheck("kl_cov_coef_nonnegative", lambda c: c.kl_cov_coef >= 0, "kl_cov_coef must be >= 0, got {kl_cov_coef}"),
    AlgoCheck("max_len_positive", lambda c: c.max_len >= 1, "max_len must be >= 1, got {max_len}"),
    # entropy (section 6)
    AlgoCheck("entropy_bonus_nonnegative", lambda c: c.entropy_coef >= 0,
              "entropy_coef must be >= 0 (a bonus), got {entropy_coef}"),
    AlgoCheck("entropy_target_nonnegative", lambda c: c.entropy_target >= 0,
              "entropy_target must be >= 0, got {entropy_target}"),
    AlgoCheck("entropy_step_positive", lambda c: c.entropy_coef_delta > 0,
              "entropy_coef_delta must be > 0, got {entropy_coef_delta}"),
    AlgoCheck("entropy_coef_bounds", lambda c: 0 <= c.entropy_coef_min <= c.entropy_coef_max,
              "entropy_coef_min/max must satisfy 0 <= min <= max, got {entropy_coef_min}/{entropy_coef_max}"),
    AlgoCheck("adaptive_entropy_starts_inside_bounds",
              lambda c: not c.entropy_adaptive or c.entropy_coef_min <= c.entropy_coef <= c.entropy_coef_max,
              "entropy_coef must lie in [entropy_coef_min, entropy_coef_max] with entropy_adaptive, got {entropy_coef}"),
    # the reference model and KL (section 3)
    AlgoCheck("beta_nonnegative", lambda c: c.beta >= 0, "beta must be >= 0, got {beta}"),
    AlgoCheck("k3_is_in_loss", lambda c: not (c.kl_estimator == "k3_is" and c.kl_placement == "in_reward"),
              "kl_estimator='k3_is' needs kl_placement='in_loss' (in_reward always uses k1)"),
    AlgoCheck("gdpo_kl_in_loss",
              lambda c: not (c.reward_aggregation == "gdpo" and c.beta > 0 and c.kl_placement == "in_reward"),
              "reward_aggregation='gdpo' normalises reward components, not a summed reward: use kl_placement='in_loss'"),
    AlgoCheck("reference_reset_period", lambda c: c.ref_reset_every >= 0,
              "ref_reset_every must be >= 0 (0 = never), got {ref_reset_every}"),
    AlgoCheck("reference_reset_needs_kl", lambda c: not (c.ref_reset_every > 0 and c.beta == 0),
              "ref_reset_every > 0 needs beta > 0 (with beta = 0 there is no reference model to reset)"),
    AlgoCheck("soft_update_alpha_range", lambda c: 0 < c.ref_update_alpha <= 1,
              "ref_update_alpha must be in (0, 1], got {ref_update_alpha}"),
    AlgoCheck("soft_update_needs_period", lambda c: c.ref_update_alpha == 1 or c.ref_reset_every > 0,
              "ref_update_alpha needs ref_reset_every > 0 (the period of the soft update), got {ref_update_alpha}"),
    AlgoCheck("optimizer_reset_with_hard_reset", lambda c: not (c.ref_reset_optimizer and c.ref_update_alpha < 1),
              "ref_reset_optimizer goes with the hard reset (ref_update_alpha = 1), not with a soft update"),
    # on-policy distillation (section 11)
    AlgoCheck("lambda_opd_nonnegative", lambda c: c.lambda_opd >= 0, "lambda_opd must be >= 0 (0 = off), got {lambda_opd}"),
    AlgoCheck("distill_coef_nonnegative", lambda c: c.distill_coef >= 0, "distill_coef must be >= 0, got {distill_coef}"),
    AlgoCheck("gjsd_beta_range", lambda c: 0 <= c.gjsd_beta <= 1, "gjsd_beta must be in [0, 1], got {gjsd_beta}"),
    AlgoCheck("opd_without_outcome_needs_teacher", lambda c: c.opd_outcome or c.lambda_opd > 0,
              "opd_outcome=false drops the outcome advantage, leaving the teacher's term: set lambda_opd > 0"),
    # rollout corrections (section 4)
    AlgoCheck("correction_cap_positive", lambda c: c.correction_cap > 0,
              "correction_cap must be > 0, got {correction_cap}"),
    AlgoCheck("correction_cap_low_range",
              lambda c: c.correction_cap_low is None or 0 < c.correction_cap_low <= c.correction_cap,
              "correction_cap_low must be in (0, correction_cap={correction_cap}] or None, got {correction_cap_low}"),
    AlgoCheck("correction_low_nonnegative", lambda c: c.correction_low is None or c.correction_low >= 0,
              "correction_low must be >= 0, got {correction_low}"),
    AlgoCheck("correction_bounds_ordered",
              lambda c: c.correction_low is None or c.correction_high is None or c.correction_low <= c.correction_high,
              "correction_low must be <= correction_high, got {correction_low}/{correction_high}"),
    AlgoCheck("rs_threshold_positive", lambda c: c.rs_threshold > 0, "rs_threshold must be > 0, got {rs_threshold}"),
    AlgoCheck("rs_sum_threshold_positive", lambda c: c.rs_sum_threshold is None or c.rs_sum_threshold > 0,
              "rs_sum_threshold must be > 0 or None, got {rs_sum_threshold}"),
    # sampling and filters (section 5)
    AlgoCheck("sampling_rounds_positive", lambda c: c.max_sampling_rounds >= 1,
              "max_sampling_rounds must be >= 1, got {max_sampling_rounds}"),
    AlgoCheck("one_zero_variance_filter", lambda c: not (c.dynamic_sampling and c.zero_variance_filter),
              "dynamic_sampling and zero_variance_filter are exclusive (dynamic sampling already drops all-equal "
              "groups, with refill)"),
    AlgoCheck("overlong_cache_range", lambda c: c.overlong_cache is None or 0 < c.overlong_cache <= c.max_len,
              "overlong_cache must be in [1, max_len={max_len}], got {overlong_cache}"),
    AlgoCheck("gfpo_keep_nonnegative", lambda c: c.gfpo_keep >= 0, "gfpo_keep must be >= 0 (0 = off), got {gfpo_keep}"),
    AlgoCheck("entropy_mask_rho_range", lambda c: 0 < c.entropy_mask_rho <= 1,
              "entropy_mask_rho must be in (0, 1], got {entropy_mask_rho}"),
    # update structure (section 7)
    AlgoCheck("iterations_positive", lambda c: c.num_iterations >= 1, "num_iterations must be >= 1, got {num_iterations}"),
    AlgoCheck("minibatches_positive", lambda c: c.num_minibatches >= 1,
              "num_minibatches must be >= 1, got {num_minibatches}"),
)


def check_values(cfg: AlgoConfig) -> None:
    """Raise ``ValueError("AlgoConfig.<the first check it breaks>")``."""
    for item in CHECKS:
        if not item.holds(cfg):
            fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
            raise ValueError(f"AlgoConfig.{item.says.format(**fields)}")
