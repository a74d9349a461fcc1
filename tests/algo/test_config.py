"""AlgoConfig validation and the presets of ALGORITHMS.md section 9."""

import dataclasses

import pytest

from grpoplus.algo import AlgoConfig

EXPECTED_FIELDS = {
    "adv_estimator", "adv_eps", "loss", "eps_low", "eps_high", "dual_clip_c", "pg_cap", "aggregation", "max_len",
    "beta", "kl_estimator", "kl_placement", "corrections", "correction_cap", "correction_low", "correction_high",
    "v32_mask_delta", "dynamic_sampling", "max_sampling_rounds", "zero_variance_filter", "overlong_filter",
    "overlong_shaping", "overlong_cache", "gfpo_keep", "gfpo_metric", "entropy_mask_rho", "ref_reset_every",
    "ref_reset_optimizer", "num_iterations", "num_minibatches",
}


def test_field_names_are_the_public_contract():
    assert set(AlgoConfig.field_names()) == EXPECTED_FIELDS


def test_unknown_key_is_named_with_valid_keys():
    for build in (lambda: AlgoConfig.from_dict({"foo": 1}), lambda: AlgoConfig.preset("grpo", foo=1),
                  lambda: AlgoConfig().replace(foo=1)):
        with pytest.raises(ValueError, match=r"unknown AlgoConfig key 'foo'; valid keys: adv_estimator, "):
            build()


@pytest.mark.parametrize("key,value,allowed", [
    ("loss", "ppo", "cispo, clip, gmpo, gspo, gspo_token, reinforce, tis_pg"),
    ("aggregation", "mean", "seq_mean_token_mean"),
    ("kl_estimator", "k4", "k1, k2, k3, k3_is"),
    ("kl_placement", "both", "in_loss, in_reward"),
    ("adv_estimator", "ppo", "batch_std, dr_grpo, grpo"),
    ("gfpo_metric", "speed", "length, reward_per_token"),
])
def test_bad_enum_names_key_and_allowed_values(key, value, allowed):
    with pytest.raises(ValueError, match=f"AlgoConfig.{key}={value!r} is not valid; choose one of: .*{allowed}"):
        AlgoConfig.from_dict({key: value})


@pytest.mark.parametrize("kw,msg", [
    (dict(kl_estimator="k3_is", kl_placement="in_reward"), "k3_is"),
    (dict(eps_low=1.0), "eps_low must be < 1 for loss='clip'"),
    (dict(beta=-0.1), "beta must be >= 0"),
    (dict(correction_low=2.0, correction_high=1.0), "correction_low .* must be <= correction_high"),
    (dict(corrections=("tis_token", "magic")), "unknown correction 'magic'; choose from: .*geo_mask"),
    (dict(corrections=("tis_token", "tis_token")), "twice"),
    (dict(dual_clip_c=0.5), "dual_clip_c must be > 1"),
    (dict(entropy_mask_rho=0.0), "entropy_mask_rho"),
    (dict(num_minibatches=0), "num_minibatches"),
    (dict(dynamic_sampling=True, zero_variance_filter=True), "exclusive"),
    (dict(ref_reset_every=10), "needs beta > 0"),
    (dict(overlong_cache=1000, max_len=512), "overlong_cache"),
    (dict(eps_high="0.2"), "eps_high must be a float"),
    (dict(dynamic_sampling=1), "dynamic_sampling must be a bool"),
])
def test_invalid_values_and_combinations(kw, msg):
    with pytest.raises(ValueError, match=msg):
        AlgoConfig(**kw)


def test_cispo_allows_eps_low_one_and_replace_revalidates():
    cfg = AlgoConfig.preset("cispo")
    assert cfg.eps_low == 1.0
    with pytest.raises(ValueError, match="eps_low must be < 1"):
        dataclasses.replace(cfg, loss="clip")


def test_corrections_accept_list_or_comma_string():
    assert AlgoConfig(corrections="tis_token, geo_mask").corrections == ("tis_token", "geo_mask")
    assert AlgoConfig.from_dict({"corrections": ["mis_seq"]}).corrections == ("mis_seq",)


PRESET_PROPERTIES = {
    "grpo": dict(adv_estimator="grpo", loss="clip", eps_low=0.2, eps_high=0.2, aggregation="seq_mean_token_mean",
                 kl_estimator="k3", kl_placement="in_loss", beta=0.04),
    "dapo": dict(adv_estimator="grpo", loss="clip", eps_low=0.2, eps_high=0.28, aggregation="token_mean",
                 dynamic_sampling=True, overlong_shaping=True, beta=0.0),
    "dr_grpo": dict(adv_estimator="dr_grpo", loss="clip", eps_low=0.2, eps_high=0.2,
                    aggregation="seq_mean_token_sum_norm", beta=0.0),
    "gspo": dict(adv_estimator="grpo", loss="gspo", eps_low=3e-4, eps_high=4e-4, aggregation="seq_mean_token_mean",
                 beta=0.0),
    "gmpo": dict(adv_estimator="grpo", loss="gmpo", eps_low=0.4, eps_high=0.4, beta=0.0),
    "cispo": dict(adv_estimator="grpo", loss="cispo", eps_low=1.0, eps_high=4.0, aggregation="token_mean", beta=0.0),
    "rloo": dict(adv_estimator="rloo"),
    "reinforce_pp": dict(adv_estimator="reinforce_pp"),
    "lite_ppo": dict(adv_estimator="batch_std", aggregation="token_mean"),
    "olmo3": dict(adv_estimator="dr_grpo", dynamic_sampling=True, aggregation="token_mean", beta=0.0,
                  corrections=("tis_token",)),
    "deepseek_v32": dict(adv_estimator="dr_grpo", loss="clip", kl_estimator="k3_is", corrections=("deepseek_v32_mask",)),
    "prorl": dict(adv_estimator="grpo", loss="clip", kl_estimator="k3", kl_placement="in_loss"),
    "gfpo": dict(adv_estimator="grpo", loss="clip"),
}


@pytest.mark.parametrize("name", sorted(PRESET_PROPERTIES))
def test_preset_matches_section_9(name):
    cfg = AlgoConfig.preset(name)
    for key, value in PRESET_PROPERTIES[name].items():
        assert getattr(cfg, key) == value, (name, key)


def test_preset_extras_and_overrides():
    assert set(AlgoConfig.preset_names()) == set(PRESET_PROPERTIES)
    assert AlgoConfig.preset("olmo3").eps_high > AlgoConfig.preset("olmo3").eps_low  # clip-higher
    assert AlgoConfig.preset("prorl").eps_high > AlgoConfig.preset("prorl").eps_low
    assert AlgoConfig.preset("prorl").ref_reset_every > 0 and AlgoConfig.preset("prorl").beta > 0
    assert 0 < AlgoConfig.preset("deepseek_v32").beta <= 0.01
    assert AlgoConfig.preset("gfpo").gfpo_keep > 0
    assert AlgoConfig.preset("dapo", eps_high=0.3).eps_high == 0.3
    with pytest.raises(ValueError, match="unknown algorithm preset 'ppo'; choose one of: cispo"):
        AlgoConfig.preset("ppo")
    assert AlgoConfig.from_dict(AlgoConfig.preset("olmo3").to_dict()) == AlgoConfig.preset("olmo3")
    assert AlgoConfig(max_len=100).cache_len == 25
