"""Verdict rules: every status, in the order the module states, from fake runs' measures."""

import math

import pytest

from grpoplus.lab import Check, Comparison, Measure, Rule, judge
from grpoplus.lab.verdict import INCONCLUSIVE, NO_FAILURE, NOT_REPRODUCED, REGIME_NOT_MET, REPRODUCED, SWITCH_INACTIVE, apply_rule

ENTROPY = Measure("tail_mean", "entropy", {"key": "entropy", "frac": 1.0})
CLIP = Measure("tail_mean", "clip", {"key": "clip", "frac": 1.0})


@pytest.mark.parametrize("effects, status", [
    ([0.03, 0.05, 0.04], REPRODUCED),           # all > 0, mean 0.04 >= 0.02
    ([0.01, 0.015, 0.01], NOT_REPRODUCED),      # all > 0 but none reaches 0.02
    ([-0.05, -0.01, 0.0], NOT_REPRODUCED),      # the opposite sign
    ([0.06, -0.01, 0.03], INCONCLUSIVE),        # one seed against, two reach it
    ([0.005, 0.005, 0.06], REPRODUCED),         # every sign right and the mean 0.0233 reaches 0.02
    ([0.005, 0.01, 0.03], INCONCLUSIVE),        # one seed reaches 0.02 but the mean (0.015) does not
    ([0.03, float("nan"), 0.04], INCONCLUSIVE),  # a seed could not be measured
])
def test_rule(effects, status):
    assert apply_rule(Rule(direction=+1, min_effect=0.02), effects)[0] == status


def test_rule_for_a_claimed_decrease():
    rule = Rule(direction=-1, min_effect=0.1)
    assert apply_rule(rule, [-0.2, -0.15, -0.3])[0] == REPRODUCED
    assert apply_rule(rule, [-0.05, 0.02, -0.01])[0] == NOT_REPRODUCED  # none falls by 0.1
    assert "-0.1" in rule.statement()


def test_rule_rejects_a_bad_direction():
    with pytest.raises(ValueError, match="direction"):
        Rule(direction=2, min_effect=0.1)


def _runs(make_run, control, treatment, control_clip=(0.05,) * 3, treatment_clip=(0.02,) * 3):
    """Two arms x 3 seeds, each run a constant entropy and clip fraction."""
    runs = {"c": {}, "t": {}}
    for arm, entropies, clips in (("c", control, control_clip), ("t", treatment, treatment_clip)):
        for seed, (e, c) in enumerate(zip(entropies, clips)):
            runs[arm][seed] = make_run([{"step": 1, "entropy": e, "clip": c}], arm=arm, seed=seed)
    return runs


def _comparison(*checks, relative=False):
    return Comparison("t keeps entropy up", "c", "t", ENTROPY, Rule(+1, 0.02), checks, relative=relative)


def test_judge_pairs_seeds_and_reports_spread(make_run):
    runs = _runs(make_run, [0.30, 0.40, 0.35], [0.35, 0.43, 0.42])  # effects 0.05, 0.03, 0.07
    v = judge(_comparison(), runs)
    assert v.status == REPRODUCED
    assert v.effects == pytest.approx([0.05, 0.03, 0.07])
    assert v.mean_effect == pytest.approx(0.05) and v.effect_range == pytest.approx((0.03, 0.07))
    assert v.effect_std == pytest.approx(0.02)  # sample std of 0.05, 0.03, 0.07


def test_a_switch_that_did_not_act_is_no_result(make_run):
    # the arms clip exactly as much: the switch did nothing, whatever the entropy did
    runs = _runs(make_run, [0.30, 0.40, 0.35], [0.35, 0.43, 0.42], treatment_clip=(0.05,) * 3)
    switch = Check("switch", CLIP, arm="c", minus="t", at_least=1e-3)
    v = judge(_comparison(switch), runs)
    assert v.status == SWITCH_INACTIVE
    assert v.checks[0].values == pytest.approx([0.0, 0.0, 0.0]) and "clip of c minus t >= 0.001" in v.reason


def test_a_control_without_the_failure_is_no_result(make_run):
    runs = _runs(make_run, [0.30, 0.40, 0.35], [0.35, 0.43, 0.42])
    switch = Check("switch", CLIP, arm="c", minus="t", at_least=1e-3)  # holds: 0.05 - 0.02
    failure = Check("failure", ENTROPY, arm="c", at_most=0.32)  # the control's entropy stayed above 0.32 in 2 seeds
    v = judge(_comparison(switch, failure), runs)
    assert v.status == NO_FAILURE and [c.passed for c in v.checks] == [True, False]


def test_a_control_off_its_regime_is_no_result_before_the_failure_check(make_run):
    # the control's entropy fell (the failure check holds) but the regime check does not: no result, said as such
    runs = _runs(make_run, [0.30, 0.40, 0.35], [0.35, 0.43, 0.42])
    switch = Check("switch", CLIP, arm="c", minus="t", at_least=1e-3)
    regime = Check("regime", ENTROPY, arm="c", at_least=0.36)  # seed 0 and seed 2 below
    failure = Check("failure", ENTROPY, arm="c", at_most=0.5)
    v = judge(_comparison(switch, failure, regime), runs)
    assert v.status == REGIME_NOT_MET and [c.passed for c in v.checks] == [True, True, False]
    assert "of c >= 0.36" in v.reason
    with pytest.raises(ValueError, match="Check.kind must be one of switch, regime, failure"):
        Check("sanity", ENTROPY, arm="c", at_least=0.0)


def test_relative_effects(make_run):
    runs = _runs(make_run, [0.2, 0.4, 0.5], [0.3, 0.5, 0.6])  # ratios 1.5, 1.25, 1.2
    v = judge(_comparison(relative=True), runs)
    assert v.effects == pytest.approx([0.5, 0.25, 0.2]) and v.rule.startswith("relative effect")


def test_nan_check_value_fails_the_check(make_run):
    runs = _runs(make_run, [0.30, 0.40, 0.35], [0.35, 0.43, 0.42])
    missing = Check("switch", Measure("tail_mean", "never logged", {"key": "nope"}), arm="t", at_least=0.0)
    v = judge(_comparison(missing), runs)
    assert v.status == SWITCH_INACTIVE and all(math.isnan(x) for x in v.checks[0].values)
