import dataclasses

import pytest

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
}


def test_every_finding_code_is_a_registered_check():
    assert set(CHECKS.names()) == CODES


@pytest.mark.parametrize(
    "name",
    ["healthy", "entropy_collapse", "length_explosion", "incorrect_longer", "zero_variance",
     "mismatch_rising", "reward_hacking", "noisy_reward", "nonfinite_updates", "grad_explosion"],
)
def test_each_trace_produces_exactly_its_findings(traces, name):
    make, expected = traces.TRACES[name]
    findings = diagnose(make())
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
