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
    # section 8
    "routing_replay",
    # section 10
    "adv_whiten", "reward_aggregation", "tau_pos", "tau_neg", "cov_ratio", "cov_lb", "cov_ub", "kl_cov_coef",
    "entropy_coef", "entropy_adaptive", "entropy_target", "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max",
    "ref_update_alpha", "correction_cap_low", "rs_threshold", "rs_sum_threshold",
    # section 11
    "lambda_opd", "opd_outcome", "distill_loss", "distill_coef", "gjsd_beta",
    # section 12
    "turn_credit",
}


def test_field_names_are_the_public_contract():
    assert set(AlgoConfig.field_names()) == EXPECTED_FIELDS


def test_unknown_key_is_named_with_valid_keys():
    for build in (lambda: AlgoConfig.from_dict({"foo": 1}), lambda: AlgoConfig.preset("grpo", foo=1),
                  lambda: AlgoConfig().replace(foo=1)):
        with pytest.raises(ValueError, match=r"unknown AlgoConfig key 'foo'; valid keys: adv_estimator, "):
            build()


@pytest.mark.parametrize("key,value,allowed", [
    ("loss", "ppo", "cispo, clip, clip_cov, dppo_kl, dppo_tv, gmpo, gspo, gspo_token, kl_cov, reinforce, sapo, "
                    "tis_pg, tis_pg_seq"),
    ("adv_whiten", "sequence", "response, token"),
    ("reward_aggregation", "mean", "sum, gdpo"),
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
    (dict(correction_low=2.0, correction_high=1.0), "correction_low must be <= correction_high, got 2.0/1.0"),
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
    (dict(tau_neg=0.0), "tau_pos/tau_neg must be > 0"),
    (dict(cov_ratio=0.0), "cov_ratio must be in"),
    (dict(cov_lb=5.0, cov_ub=1.0), "cov_lb must be < cov_ub"),
    (dict(kl_cov_coef=-1.0), "kl_cov_coef"),
    (dict(entropy_coef=-0.1), "entropy_coef must be >= 0"),
    (dict(entropy_coef_delta=0.0), "entropy_coef_delta"),
    (dict(entropy_coef_min=0.5, entropy_coef_max=0.1), "entropy_coef_min/max"),
    (dict(entropy_adaptive=True, entropy_coef=2.0), r"must lie in \[entropy_coef_min, entropy_coef_max\]"),
    (dict(beta=0.1, ref_reset_every=10, ref_update_alpha=1.5), "ref_update_alpha must be in"),
    (dict(beta=0.1, ref_update_alpha=0.6), "needs ref_reset_every > 0"),
    (dict(beta=0.1, ref_reset_every=10, ref_update_alpha=0.6, ref_reset_optimizer=True), "goes with the hard reset"),
    (dict(correction_cap_low=3.0), "correction_cap_low must be in"),
    (dict(rs_threshold=0.0), "rs_threshold"),
    (dict(rs_sum_threshold=-1.0), "rs_sum_threshold"),
    (dict(adv_whiten="token"), "adv_whiten='token' acts on an estimator that whitens"),
    (dict(reward_aggregation="gdpo", beta=0.1, kl_placement="in_reward"), "use kl_placement='in_loss'"),
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
                 dynamic_sampling=True, overlong_shaping=True, beta=0.0, num_minibatches=4),
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
    # section 10: the values each recipe names (presets.py says where each comes from)
    "sapo": dict(loss="sapo", tau_pos=1.0, tau_neg=1.05, aggregation="seq_mean_token_mean", beta=0.0),
    "dppo_tv": dict(adv_estimator="dr_grpo", loss="dppo_tv", eps_low=0.15, eps_high=0.15, pg_cap=20.0,
                    aggregation="seq_mean_token_sum_norm", beta=0.0),
    "dppo_kl": dict(adv_estimator="dr_grpo", loss="dppo_kl", eps_low=0.05, eps_high=0.05, pg_cap=20.0,
                    aggregation="seq_mean_token_sum_norm", beta=0.0),
    "clip_cov": dict(loss="clip_cov", eps_low=1.0, eps_high=1.0, cov_ratio=2e-4, cov_lb=1.0, cov_ub=5.0,
                     aggregation="token_mean", dynamic_sampling=True, beta=0.0),
    "kl_cov": dict(loss="kl_cov", cov_ratio=2e-3, kl_cov_coef=1.0, aggregation="token_mean", dynamic_sampling=True,
                   beta=0.0),
    "skywork_or1": dict(loss="clip", aggregation="token_mean", beta=0.0, zero_variance_filter=True,
                        entropy_adaptive=True, entropy_target=0.2, entropy_coef_delta=0.005, num_minibatches=1),
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


UPDATES_PER_BATCH = {"dapo": 4, "grpo": 4, "gfpo": 4, "gspo": 4, "cispo": 4, "sapo": 4, "dppo_tv": 4, "dppo_kl": 4,
                     "clip_cov": 4, "kl_cov": 4, "skywork_or1": 1}


@pytest.mark.parametrize("name", sorted(UPDATES_PER_BATCH))
def test_preset_update_structure(name):
    cfg = AlgoConfig.preset(name)
    assert cfg.updates_per_batch == UPDATES_PER_BATCH[name] == cfg.num_iterations * cfg.num_minibatches
    assert cfg.clipping_can_act() == (UPDATES_PER_BATCH[name] > 1)


def test_inert_switches_with_one_update_per_batch():
    # DAPO with one update: r = 1, so its clip-higher range cannot bind; dual clip off is not listed.
    one = AlgoConfig.preset("dapo", num_minibatches=1)
    assert one.inert_switches() == ["eps_low=0.2", "eps_high=0.28"]
    assert AlgoConfig.preset("dapo").inert_switches() == []  # the preset's own 4 updates
    assert AlgoConfig.preset("dapo", num_minibatches=1, num_iterations=2).inert_switches() == []
    # against the sampler (learner.logp_old=rollout) the clip acts on the mismatch
    assert one.inert_switches(pi_old_is_sampler=True) == []
    assert AlgoConfig.preset("deepseek_v32").inert_switches() == ["eps_low=0.2", "eps_high=0.2", "kl_estimator='k3_is'"]
    assert AlgoConfig.preset("sapo", num_minibatches=1).inert_switches() == ["tau_pos=1.0", "tau_neg=1.05"]
    assert AlgoConfig.preset("dppo_tv", num_minibatches=1).inert_switches() == ["eps_low=0.15", "eps_high=0.15", "pg_cap=20.0"]
    assert AlgoConfig(loss="clip", dual_clip_c=3.0).inert_switches() == ["eps_low=0.2", "eps_high=0.2", "dual_clip_c=3.0"]
    assert AlgoConfig(loss="reinforce").inert_switches() == []
    assert AlgoConfig(loss="tis_pg", pg_cap=0.5).inert_switches() == []  # a cap below 1 scales even at r = 1
    # corrections act on the sampler mismatch, which one update does not remove
    assert AlgoConfig(loss="reinforce", corrections=("tis_token",)).inert_switches() == []


def test_every_field_has_a_docstring_for_help_config():
    from grpoplus.config import field_docs

    docs = field_docs(AlgoConfig)
    assert set(docs) == set(AlgoConfig.field_names())
    assert all(len(d) > 20 for d in docs.values())
    assert "arXiv:2511.20347" in docs["tau_pos"] and "arXiv:2505.22312" in docs["entropy_adaptive"]


def test_token_whitening_and_gdpo_are_valid_where_they_act():
    assert AlgoConfig(adv_estimator="reinforce_pp", adv_whiten="token").adv_whiten == "token"
    assert AlgoConfig(reward_aggregation="gdpo", adv_whiten="token").reward_aggregation == "gdpo"
    assert AlgoConfig.preset("reinforce_pp", adv_whiten="token").updates_per_batch == 1


def test_every_preset_says_what_it_sets_and_whose_recipe_it_is(capsys):
    from grpoplus.algo.presets import PAPERS, PRESETS, describe
    from grpoplus.entry.cli import main

    assert set(PAPERS) == set(PRESETS.names())  # a new preset must name its paper
    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(PAPERS) and all(line == describe(line.split(":")[0]) for line in lines)
    assert describe("dapo") == ("dapo: adv_estimator=grpo, loss=clip, eps_low=0.2, eps_high=0.28, aggregation=token_mean, "
                                "dynamic_sampling=True, overlong_shaping=True, beta=0.0, num_minibatches=4 "
                                "(DAPO: Yu et al. 2025, arXiv:2503.14476)")


def test_a_reader_that_leaves_early_gets_no_traceback():
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "grpoplus", "presets"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # as `grpoplus presets | head -1` does once it has its line
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and err == b"", err.decode()[-500:]
