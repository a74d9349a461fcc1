"""Measures computed from a run's own records, with the arithmetic worked out by hand."""

import math

import pytest

from grpoplus.lab import MEASURES, Measure


def series(key, values, start=0):
    return [{"step": start + i, key: v} for i, v in enumerate(values)]


def test_tail_and_head_means_use_fractions_of_the_last_step(make_run):
    # steps 0..6, last = 6: head = steps <= 2 (values 1, 2, 3), tail = steps >= 4 (values 5, 6, 7)
    run = make_run(series("x", [1.0, 2, 3, 4, 5, 6, 7]))
    assert MEASURES.get("head_mean")(run, key="x") == pytest.approx(2.0)
    assert MEASURES.get("tail_mean")(run, key="x") == pytest.approx(6.0)
    assert MEASURES.get("tail_over_head")(run, key="x") == pytest.approx(3.0)  # 6 / 2


def test_eval_metrics_average_the_evaluations_in_the_window(make_run):
    # held-out accuracy logged at steps 0, 3, 6 only; the other steps have other metrics
    records = [{"step": s, "reward/mean": 0.1} for s in range(7)]
    for step, acc in ((0, 0.2), (3, 0.4), (6, 0.5)):
        records[step]["eval/accuracy"] = acc
    run = make_run(records)
    assert Measure("tail_mean", "acc", {"key": "eval/accuracy", "frac": 0.5}).of(run) == pytest.approx(0.45)  # steps 3, 6
    assert MEASURES.get("initial")(run, key="eval/accuracy") == pytest.approx(0.2)


def test_non_finite_values_are_left_out_and_a_missing_key_is_nan(make_run):
    run = make_run(series("x", [1.0, float("nan"), 3.0]))
    assert MEASURES.get("tail_mean")(run, key="x", frac=1.0) == pytest.approx(2.0)
    assert math.isnan(MEASURES.get("tail_mean")(run, key="never_logged"))
    assert math.isnan(MEASURES.get("tail_over_head")(run, key="never_logged"))


def test_length_ratio_and_its_growth(make_run):
    # incorrect/correct: head (steps <= 1) 10/10 = 1.0, tail (steps >= 2) 18/12 = 1.5 -> growth 0.5
    records = [{"step": s, "length/incorrect_mean": i, "length/correct_mean": c}
               for s, (i, c) in enumerate([(10, 10), (10, 10), (18, 12), (18, 12)])]
    run = make_run(records)
    m = dict(num="length/incorrect_mean", den="length/correct_mean", frac=0.5)
    assert MEASURES.get("tail_ratio")(run, **m) == pytest.approx(1.5)
    assert MEASURES.get("ratio_change")(run, **m) == pytest.approx(0.5)


def test_gain_per_time(make_run):
    # accuracy 0.3 at step 0 -> 0.5 at step 10, 400 s elapsed at step 10: 0.2 * 1000 / 400 = 0.5 per 1000 s
    records = [{"step": 0, "eval/accuracy": 0.3}, {"step": 5, "time/elapsed_s": 200.0},
               {"step": 10, "time/elapsed_s": 400.0, "eval/accuracy": 0.5}]
    assert MEASURES.get("gain_per_time")(make_run(records), key="eval/accuracy") == pytest.approx(0.5)


def test_tail_minus_initial(make_run):
    # a teacher's correct share 0.8 (logged every step) against the student's accuracy 0.3 at step 0: 0.5
    records = [{"step": 0, "eval/accuracy": 0.3}] + [{"step": s, "sft/demo_model_correct_frac": 0.8} for s in (1, 2, 3)]
    records.append({"step": 3, "eval/accuracy": 0.6})
    measure = MEASURES.get("tail_minus_initial")
    assert measure(make_run(records), key="sft/demo_model_correct_frac") == pytest.approx(0.5)


def _group(step, prompt, rewards, correct):
    return [{"step": step, "prompt_index": prompt, "completion": "", "reward": r, "correct": c, "finished": True}
            for r, c in zip(rewards, correct)]


def _samples():
    # group size 4; step 1: an easy group (3 of 4 right), a medium group (2 of 4), an all-right group
    return (_group(1, 7, [1, 1, 1, 0], [True, True, True, False]) + _group(1, 9, [1, 1, 0, 0], [True, True, False, False])
            + _group(1, 3, [1, 1, 1, 1], [True] * 4))


def _config(estimator):
    return {"algo": {"adv_estimator": estimator, "adv_eps": 1e-6}, "rollout": {"group_size": 4}}


def test_advantage_scale_by_solve_rate_without_std_normalisation(make_run):
    # dr_grpo: A = r - mean. Easy group (mean 3/4): A = [1/4, 1/4, 1/4, -3/4], mean square (3/16 + 9/16)/4 = 3/16.
    # Medium group (mean 1/2): A = +-1/2, mean square 1/4. The all-right group has no spread: left out.
    run = make_run([{"step": 1}], config=_config("dr_grpo"), samples=_samples())
    assert MEASURES.get("adv_rms")(run, low=0.75, high=1.0) == pytest.approx(math.sqrt(3 / 16))
    assert MEASURES.get("adv_rms")(run, low=0.26, high=0.74) == pytest.approx(0.5)
    assert MEASURES.get("adv_scale_ratio")(run, edge=0.25) == pytest.approx(math.sqrt(3 / 16) / 0.5)  # 0.866


def test_advantage_scale_with_std_normalisation_is_the_same_for_every_solve_rate(make_run):
    # grpo divides by the group's sample std (n - 1): for any group with spread the mean square of
    # A = (r - mean) / std is (n - 1) / n = 3/4, so the ratio is 1 up to eps.
    run = make_run([{"step": 1}], config=_config("grpo"), samples=_samples())
    assert MEASURES.get("adv_rms")(run, low=0.75, high=1.0) == pytest.approx(math.sqrt(3 / 4), rel=1e-5)
    assert MEASURES.get("adv_scale_ratio")(run) == pytest.approx(1.0, rel=1e-5)


def test_advantages_need_every_trained_response(make_run):
    run = make_run([{"step": 1}], config=_config("grpo"), samples=_samples()[:3])
    with pytest.raises(ValueError, match="log_samples"):
        MEASURES.get("adv_rms")(run)
