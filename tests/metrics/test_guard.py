"""The certain-failure signals, the health guard that acts on them each step, and the doctor's checks that read the
same definitions after a run."""

import math

import pytest

from grpoplus.metrics import diagnose
from grpoplus.metrics.guard import GuardPlan, HealthGuard
from grpoplus.metrics.signals import SIGNALS_BY_CODE, fired, learns, sync_gap_bound

HEALTHY = {"length/truncated_frac": 0.25, "groups/zero_std_frac": 0.5, "optim/skipped_updates": 0.0,
           "mismatch/k3": 1e-12, "reward/mean": 0.4}


def _step(step: int, **changes) -> dict:
    return {"step": step, **HEALTHY, **{k.replace("__", "/"): v for k, v in changes.items()}}


def test_a_healthy_step_fires_nothing_and_learns():
    assert fired(_step(1), {}) == [] and learns(_step(1), {})


@pytest.mark.parametrize(("changes", "code", "teaches"), [
    ({"length__truncated_frac": 1.0}, "all_truncated", True),
    ({"groups__zero_std_frac": 1.0}, "no_spread", False),
    ({"optim__skipped_updates": 2.0}, "nonfinite", False),
    ({"mismatch__k3": 3e-8}, "sync_gap", True),
    ({"env__ended__error": 0.75, "env__ended__timeout": 0.25}, "env_failed", False),
])
def test_each_signal_fires_on_its_own_cause_and_says_what_to_change(changes, code, teaches):
    info = {"updates_per_batch": 2, "precision": "fp32"}
    record = _step(4, **changes)
    assert [s.code for s in fired(record, info)] == [code]
    assert learns(record, info) is teaches
    line = SIGNALS_BY_CODE[code].line(4, record, info)
    assert line.startswith(f"health: step 4: {code}: ") and "-> fix: " in line and "\n" not in line


def test_signals_stay_silent_just_below_their_cause():
    info = {"updates_per_batch": 2, "precision": "fp32"}
    record = _step(1, length__truncated_frac=0.99, groups__zero_std_frac=0.99, optim__skipped_updates=1.0,
                   mismatch__k3=9e-9)  # one of two updates skipped still updates once
    assert fired(record, info) == []
    assert fired(_step(1, optim__skipped_updates=2.0, optim__empty_batch=1.0), info) == []  # counted apart
    assert fired({"step": 1, "mismatch/k3": math.nan}, info) == []
    assert fired(_step(1, env__ended__error=0.5, env__ended__done=0.5), info) == []
    assert fired(_step(1, groups__zero_std_frac=1.0), {**info, "teacher": True}) == []  # the teacher's advantage


def test_the_sync_gap_bound_follows_the_precision_and_engine_and_is_silent_on_a_stale_batch_by_design():
    fp32 = {"precision": "fp32"}
    assert sync_gap_bound(fp32) == sync_gap_bound({**fp32, "quantization": "none", "engine": "hf"}) == 1e-8
    assert sync_gap_bound({"precision": "bf16_mixed"}) == sync_gap_bound({**fp32, "quantization": "bf16_rounded"}) \
        == sync_gap_bound({**fp32, "tf32": True}) == sync_gap_bound({**fp32, "engine": "vllm"}) == 0.05
    # vLLM on a CPU samples in float32 with kernels that differ in summation order only; on a GPU its own kernels
    assert sync_gap_bound({**fp32, "engine": "vllm", "device": "cpu"}) == 1e-8
    assert sync_gap_bound({**fp32, "engine": "vllm", "device": "cuda:0"}) == 0.05
    assert sync_gap_bound({**fp32, "quantization": "int8"}) is None and sync_gap_bound({}) is None  # unknown
    assert sync_gap_bound({**fp32, "quantization": "int8", "sync_gap_max": 2.0}) == 2.0
    assert fired(_step(3, mismatch__k3=0.01), {"precision": "bf16_mixed"}) == []
    assert [s.code for s in fired(_step(3, mismatch__k3=0.01), fp32)] == ["sync_gap"]
    assert fired(_step(3, mismatch__k3=0.01, async__staleness_max=1.0), fp32) == []  # rollout.max_staleness
    assert fired(_step(3, mismatch__k3=10.0), {**fp32, "quantization": "int8"}) == []


def test_the_guard_warns_every_step_and_stops_after_consecutive_barren_steps_only():
    guard = HealthGuard(GuardPlan(stop_after=3), {})
    assert guard.observe(1, _step(1, groups__zero_std_frac=1.0))[0].startswith("health: step 1: no_spread")
    guard.observe(2, _step(2, groups__zero_std_frac=1.0))
    assert guard.observe(3, _step(3)) == [] and guard.stop_reason is None  # a step that learned resets the count
    for step in (4, 5):
        guard.observe(step, _step(step, groups__zero_std_frac=1.0))
    assert guard.stop_reason is None
    guard.observe(6, _step(6, groups__zero_std_frac=1.0, length__truncated_frac=1.0))
    assert guard.stop_reason.startswith("no learning signal for 3 consecutive steps (4-6: no_spread on 3)")
    assert "health.stop_after=3" in guard.stop_reason


def test_the_guard_counts_a_resumed_runs_steps_and_can_be_quiet_or_never_stop():
    history = [{"step": 0, "eval/accuracy": 0.0}, _step(1, groups__zero_std_frac=1.0), _step(2, groups__zero_std_frac=1.0)]
    guard = HealthGuard(GuardPlan(stop_after=3), {}, history)
    guard.observe(3, _step(3, groups__zero_std_frac=1.0))
    assert guard.stop_reason is not None
    quiet = HealthGuard(GuardPlan(warn=False, stop_after=0), {})
    for step in range(1, 50):
        assert quiet.observe(step, _step(step, groups__zero_std_frac=1.0)) == []
    assert quiet.stop_reason is None


def test_the_doctor_names_a_short_run_whose_every_completion_was_truncated():
    records = [{"step": 0, "eval/accuracy": 0.1}] + [_step(s, length__truncated_frac=1.0) for s in range(1, 7)]
    findings = {f.code: f for f in diagnose(records)}
    assert findings["all_truncated"].severity == "severe"
    assert "on 6 of 6 steps (1, 2, 3, 4, 5, 6)" in findings["all_truncated"].evidence
    assert "rollout.max_new_tokens" in findings["all_truncated"].fix
    healthy = [{"step": 0}] + [_step(s) for s in range(1, 7)]
    assert diagnose(healthy) == []


def test_the_doctor_names_a_stale_sync_with_the_runs_precision():
    records = [_step(s, mismatch__k3=1e-3 if s >= 3 else 1e-12) for s in range(1, 6)]
    fp32 = {f.code: f for f in diagnose(records, batch_info={"precision": "fp32"})}
    assert "on 3 of 5 steps (3, 4, 5)" in fp32["sync_gap"].evidence
    assert "sync_gap" not in {f.code for f in diagnose(records, batch_info={"precision": "bf16_mixed"})}
