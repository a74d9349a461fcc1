import dataclasses

import pytest

from grpoplus.algo.losses import LOSSES, ratio_dependent
from grpoplus.metrics import (
    CHECKS,
    DoctorThresholds,
    LiveDoctor,
    diagnose,
    parse_thresholds,
    threshold_docs,
)

CODES = {
    "entropy_collapse", "length_explosion", "incorrect_longer", "zero_variance",
    "mismatch_rising", "reward_hacking", "noisy_reward", "nonfinite_updates", "grad_explosion",
    "inert_clipping", "zero_advantage", "mismatch_with_staleness", "routing_mismatch",
    "turn_limit", "env_failures", "tool_errors", "observation_crowding", "opd_stalled",
    "all_truncated", "sync_gap",
}


def test_every_finding_code_is_a_registered_check():
    assert set(CHECKS.names()) == CODES


HEALTHY = {"healthy", "healthy_multi_turn", "multi_turn_incorrect_longer", "healthy_distillation"}


@pytest.mark.parametrize("name", sorted(CODES | HEALTHY))
def test_each_trace_produces_exactly_its_findings(traces, name):
    make, expected = traces.TRACES[name]
    # the default setup: a clip loss with one update per rollout batch
    findings = diagnose(make(), batch_info=traces.CLIP_SETUP)
    assert {f.code for f in findings} == expected
    for f in findings:
        assert f.severity in ("warning", "severe")
        assert f.evidence and f.fix and f.title


@pytest.mark.parametrize("seed", range(5))
def test_healthy_trace_is_healthy_for_any_noise_seed(traces, seed):
    assert diagnose(traces.healthy(seed=seed)) == []


def test_small_batch_alone_is_not_noisy(traces):
    # 16 responses per step, but the reward trend (+0.4) dwarfs its noise (0.02).
    assert diagnose(traces.healthy(batch=16)) == []


def test_noisy_reward_uses_batch_info_when_records_lack_batch_size(traces):
    make, _ = traces.TRACES["noisy_reward"]
    records = [{k: v for k, v in r.items() if not k.startswith("batch/")} for r in make()]
    assert diagnose(records) == []  # batch size unknown: the check cannot judge
    found = diagnose(records, batch_info={"responses": 16, "group_size": 4})
    assert [f.code for f in found] == ["noisy_reward"]
    assert "group size 4" in found[0].evidence


def test_evidence_names_the_metric_and_the_steps(traces):
    (finding,) = diagnose(traces.nonfinite())
    assert "steps 30, 41, 52" in finding.evidence
    (finding,) = diagnose(traces.entropy_collapse())
    assert "policy/entropy_mean" in finding.evidence and "steps 50-59" in finding.evidence
    assert "eps_high" in finding.fix and "cispo" in finding.fix


def test_severity_levels(traces):
    (one,) = diagnose(traces.nonfinite(bad_steps=(40,)))
    assert one.severity == "warning"  # a single skipped update
    (three,) = diagnose(traces.nonfinite())
    assert three.severity == "severe"
    (most,) = diagnose(traces.zero_variance(0.7))
    assert most.severity == "warning" and "easier" in most.fix  # mostly all-wrong groups
    (nearly_all,) = diagnose(traces.zero_variance(0.95))
    assert nearly_all.severity == "severe"


def test_threshold_changes_what_fires(traces):
    records = traces.zero_variance(0.7)
    assert diagnose(records, DoctorThresholds(zero_variance_frac=0.8)) == []
    assert [f.code for f in diagnose(records, DoctorThresholds(zero_variance_frac=0.6))] == [
        "zero_variance"
    ]


def test_short_runs_are_not_judged_on_trends(traces):
    make, _ = traces.TRACES["mismatch_rising"]
    assert diagnose(make()[:15]) == []  # 15 < min_steps
    assert diagnose([]) == []


def test_parse_thresholds_types_and_errors():
    th = parse_thresholds(["window=5", "zero_variance_frac=0.75"])
    assert th.window == 5 and isinstance(th.window, int) and th.zero_variance_frac == 0.75
    with pytest.raises(ValueError, match="unknown doctor threshold 'nope=1'.*zero_variance_frac"):
        parse_thresholds(["nope=1"])
    with pytest.raises(ValueError, match="unknown doctor threshold 'window'"):
        parse_thresholds(["window"])
    with pytest.raises(ValueError, match="'window' needs a int"):
        parse_thresholds(["window=1.5"])


def test_every_threshold_has_a_docstring():
    docs = threshold_docs()
    assert set(docs) == {f.name for f in dataclasses.fields(DoctorThresholds)}
    assert all(len(text) > 10 for text in docs.values())


def test_live_doctor_reports_each_finding_once_and_escalations_again(traces):
    records = traces.nonfinite(bad_steps=(25, 41, 52))
    live = LiveDoctor()
    reported = []
    for end in range(10, 61, 10):  # every K=10 steps
        reported += [(end, f.code, f.severity) for f in live.check(records[:end])]
    # first skip at step 25 -> warning seen at the check after it (end=30); third skip at
    # step 52 makes it severe (end=60); nothing is repeated in between.
    assert reported == [(30, "nonfinite_updates", "warning"), (60, "nonfinite_updates", "severe")]
    line = live.check(records)  # already reported
    assert line == []


def test_one_line_warning(traces):
    (finding,) = diagnose(traces.nonfinite())
    line = finding.one_line()
    assert "\n" not in line and line.startswith("[doctor] severe: nonfinite_updates")


def _codes(records, info=None, th=None):
    return {f.code for f in diagnose(records, th, info)}


def test_inert_clipping_needs_a_ratio_bounded_loss_and_a_ratio_stuck_at_one(traces):
    records = traces.inert_clipping()
    (finding,) = diagnose(records, batch_info=traces.CLIP_SETUP)
    assert "1 update(s) per rollout batch" in finding.evidence
    assert "num_minibatches=16" in finding.fix
    assert _codes(records) == set()  # the loss is unknown: cannot say the clip is inert
    assert _codes(records, {"loss": "reinforce"}) == set()  # no clip to be inert
    # the loss registry's own marks decide (grpoplus.algo.losses.ratio_dependent), for every built-in and a user's loss
    for loss in ("sapo", "dppo_tv", "tis_pg_seq", "clip_cov"):
        assert _codes(records, {**traces.CLIP_SETUP, "loss": loss}) == {"inert_clipping"}, loss
    assert _codes(records, {**traces.CLIP_SETUP, "loss": "my_module:my_loss"}) == set()  # not registered here
    LOSSES.add("test_user_trust_region", ratio_dependent("eps_high")(lambda *a, **k: None))
    try:
        assert _codes(records, {**traces.CLIP_SETUP, "loss": "test_user_trust_region"}) == {"inert_clipping"}
    finally:
        LOSSES._items.pop("test_user_trust_region")
    # several updates per batch move the ratio: 1.3 on the healthy trace, silent
    assert _codes(traces.healthy(), {"loss": "cispo", "updates_per_batch": 16}) == set()
    # one step off-policy (ratio 1.001 > tol) is enough to keep it silent
    records[30]["loss/ratio_max"] = 1.001
    assert _codes(records, traces.CLIP_SETUP) == set()


def test_inert_clipping_fires_within_the_first_steps(traces):
    assert _codes(traces.inert_clipping()[:5], traces.CLIP_SETUP) == {"inert_clipping"}
    assert _codes(traces.inert_clipping()[:4], traces.CLIP_SETUP) == set()


def test_zero_advantage_fires_within_the_first_steps(traces):
    records = traces.zero_advantage()
    (finding,) = diagnose(records[:5])  # 5 = structural_min_steps < min_steps = 20
    assert finding.severity == "severe" and "steps 0-4" in finding.evidence
    assert diagnose(records[:4]) == []
    # one step with spread among the last five: the run can learn
    records[3]["groups/zero_std_frac"] = 0.9
    assert diagnose(records[:5]) == []


def test_zero_advantage_from_a_group_of_one(traces):
    (finding,) = diagnose(traces.healthy()[:1], batch_info={"group_size": 1})
    assert finding.code == "zero_advantage" and "group_size = 1" in finding.evidence


def test_nearly_all_zero_spread_is_zero_variance_not_zero_advantage(traces):
    assert _codes(traces.zero_variance(0.95)) == {"zero_variance"}


def test_live_doctor_names_zero_advantage_before_the_first_period(traces):
    records = traces.zero_advantage(n=30)
    live = LiveDoctor(every=10)
    first = next(step for step in range(1, 30)
                 if live.due(step) and live.check(records[: step + 1]))
    assert first == 5
    assert not LiveDoctor(every=0).due(10)


def test_mismatch_with_staleness_fires_only_when_they_move_together(traces):
    (finding,) = diagnose(traces.staleness(coupled=True))
    assert finding.code == "mismatch_with_staleness"
    assert "rank correlation" in finding.evidence and "max_staleness" in finding.fix
    assert "now 4" in diagnose(traces.staleness(), batch_info={"max_staleness": 4})[0].fix
    assert diagnose(traces.staleness(coupled=False)) == []  # staleness varies, mismatch flat


def test_mismatch_with_staleness_thresholds(traces):
    records = traces.staleness()
    assert diagnose(records, DoctorThresholds(staleness_corr_min=0.99)) == []
    assert diagnose(records, DoctorThresholds(staleness_mismatch_ratio=10.0)) == []


def test_routing_mismatch_names_the_worst_layer(traces):
    (finding,) = diagnose(traces.routing_mismatch(0.2))
    assert "worst layer layer7" in finding.evidence and "routing_replay=r3" in finding.fix
    (on,) = diagnose(traces.routing_mismatch(0.2), batch_info={"routing_replay": "r3"})
    assert "routing replay r3 is on" in on.fix
    assert diagnose(traces.routing_mismatch(0.05)) == []
    assert diagnose(traces.routing_mismatch(0.05), DoctorThresholds(routing_mismatch_max=0.04))


def test_zero_variance_with_dynamic_sampling_says_what_it_costs(traces):
    records = traces.zero_variance(0.7)
    for r in records:
        r["sampling/oversample"] = 2.5
    (finding,) = diagnose(records)
    assert "draws 2.50x" in finding.evidence and "already drops them" in finding.fix
    for r in records:  # a run written before sampling/oversample: kept / drawn = 0.4
        del r["sampling/oversample"]
        r["sampling/kept_frac"] = 0.4
    assert "draws 2.50x" in diagnose(records)[0].evidence


def test_batch_info_from_config():
    from grpoplus.metrics.doctor import batch_info_from_config

    config = {"rollout": {"group_size": 8, "prompts_per_step": 32, "max_staleness": 2},
              "algo": {"loss": "clip", "num_iterations": 2, "num_minibatches": 4,
                       "adv_estimator": "grpo"}}
    assert batch_info_from_config(config) == {
        "group_size": 8, "max_staleness": 2, "loss": "clip", "adv_estimator": "grpo",
        "responses": 256, "updates_per_batch": 8}
    assert batch_info_from_config({}) == {}
