"""Every named check of AlgoConfig refuses a config that breaks it, with its own sentence, and only then: one
breaking case per check (a check with no case here fails the coverage test)."""

import pytest

from grpoplus.algo import AlgoConfig
from grpoplus.algo.checks import CHECKS

BREAKS = {
    "adv_eps_positive": {"adv_eps": 0.0},
    "token_whitening_needs_batch_whitening": {"adv_whiten": "token", "adv_estimator": "grpo"},
    "trust_region_widths": {"eps_high": -0.1},
    "ratio_clip_below_one": {"loss": "clip", "eps_low": 1.0},
    "dual_clip_above_one": {"dual_clip_c": 1.0},
    "pg_cap_positive": {"pg_cap": 0.0},
    "sapo_temperatures": {"tau_neg": 0.0},
    "cov_ratio_range": {"cov_ratio": 1.5},
    "cov_bounds_ordered": {"cov_lb": 2.0, "cov_ub": 1.0},
    "kl_cov_coef_nonnegative": {"kl_cov_coef": -1.0},
    "max_len_positive": {"max_len": 0},
    "entropy_bonus_nonnegative": {"entropy_coef": -0.01},
    "entropy_target_nonnegative": {"entropy_target": -1.0},
    "entropy_step_positive": {"entropy_coef_delta": 0.0},
    "entropy_coef_bounds": {"entropy_coef_min": 0.5, "entropy_coef_max": 0.1},
    "adaptive_entropy_starts_inside_bounds": {"entropy_adaptive": True, "entropy_coef": 5.0},
    "beta_nonnegative": {"beta": -0.1},
    "k3_is_in_loss": {"kl_estimator": "k3_is", "kl_placement": "in_reward"},
    "gdpo_kl_in_loss": {"reward_aggregation": "gdpo", "beta": 0.1, "kl_placement": "in_reward"},
    "reference_reset_period": {"ref_reset_every": -1},
    "reference_reset_needs_kl": {"ref_reset_every": 10, "beta": 0.0},
    "soft_update_alpha_range": {"ref_update_alpha": 0.0},
    "soft_update_needs_period": {"ref_update_alpha": 0.5, "ref_reset_every": 0},
    "optimizer_reset_with_hard_reset": {"ref_reset_optimizer": True, "ref_update_alpha": 0.5, "ref_reset_every": 10,
                                        "beta": 0.1},
    "lambda_opd_nonnegative": {"lambda_opd": -1.0},
    "distill_coef_nonnegative": {"distill_coef": -1.0},
    "gjsd_beta_range": {"gjsd_beta": 2.0},
    "opd_without_outcome_needs_teacher": {"opd_outcome": False},
    "correction_cap_positive": {"correction_cap": 0.0},
    "correction_cap_low_range": {"correction_cap_low": 5.0, "correction_cap": 2.0},
    "correction_low_nonnegative": {"correction_low": -1.0},
    "correction_bounds_ordered": {"correction_low": 2.0, "correction_high": 1.0},
    "rs_threshold_positive": {"rs_threshold": 0.0},
    "rs_sum_threshold_positive": {"rs_sum_threshold": 0.0},
    "sampling_rounds_positive": {"max_sampling_rounds": 0},
    "one_zero_variance_filter": {"dynamic_sampling": True, "zero_variance_filter": True},
    "overlong_cache_range": {"max_len": 100, "overlong_cache": 200},
    "gfpo_keep_nonnegative": {"gfpo_keep": -1},
    "entropy_mask_rho_range": {"entropy_mask_rho": 0.0},
    "iterations_positive": {"num_iterations": 0},
    "minibatches_positive": {"num_minibatches": 0},
}


def test_every_check_has_a_breaking_case():
    assert sorted(BREAKS) == sorted(c.name for c in CHECKS)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
def test_a_config_that_breaks_a_check_gets_its_sentence(check):
    with pytest.raises(ValueError) as err:
        AlgoConfig(**BREAKS[check.name])
    # the first check broken is this one: its sentence, with the config's values in it
    assert str(err.value).startswith("AlgoConfig.")
    broken = [c.name for c in CHECKS if not c.holds(_unchecked(**BREAKS[check.name]))]
    assert broken[0] == check.name
    assert str(err.value) == "AlgoConfig." + check.says.format(**_unchecked(**BREAKS[check.name]).__dict__)


def test_the_default_and_every_preset_pass_every_check():
    for cfg in [AlgoConfig(), *(AlgoConfig.preset(name) for name in AlgoConfig.preset_names())]:
        assert [c.name for c in CHECKS if not c.holds(cfg)] == []


def test_the_page_text_keeps_the_requirement_and_drops_the_values():
    by_name = {c.name: c for c in CHECKS}
    assert by_name["cov_ratio_range"].what == "cov_ratio must be in (0, 1]"
    assert by_name["ratio_clip_below_one"].what == "eps_low must be < 1 for loss=`loss` (ratio clip 1-eps_low)"


def _unchecked(**overrides) -> AlgoConfig:
    """An AlgoConfig with ``overrides`` set and no validation run (to ask each check about it alone)."""
    cfg = object.__new__(AlgoConfig)
    for name, value in {**AlgoConfig().__dict__, **overrides}.items():
        object.__setattr__(cfg, name, value)
    return cfg
