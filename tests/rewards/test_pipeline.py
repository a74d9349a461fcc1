"""Reward composition and the failure policy of RewardPipeline."""

import textwrap
import time

import pytest

from grpoplus.rewards import REWARDS, RewardComponent, RewardError, RewardPipeline, parse_reward_specs, pipeline
from grpoplus.rewards.pipeline import MAX_TIMEOUT_STREAK

USER_REWARDS = textwrap.dedent(
    """
    import time

    def flaky(prompts, completions, **fields):
        out = []
        for c in completions:
            if c == "hang":
                time.sleep(600)
            if c == "boom":
                raise RuntimeError("boom in sample")
            out.append(float(len(c)))
        return out

    def only_answer(prompts, completions, answer):
        return [float(c == a) for c, a in zip(completions, answer)]
    """
)


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "user_rewards.py"
    path.write_text(USER_REWARDS)
    return str(path)


def comp(name, fn, weight=1.0, **kwargs):
    return RewardComponent(name, fn, weight, kwargs)


def test_weighted_total_and_none_excluded_from_component_mean():
    a = comp("a", lambda p, c, **f: [1.0, 0.0, 1.0])
    b = comp("b", lambda p, c, **f: [None, 1.0, 0.5], weight=0.5)
    result = RewardPipeline([a, b])(["q"] * 3, ["x", "y", "z"], {})
    # total_i = 1.0 * a_i + 0.5 * (b_i or 0)
    assert result.total == [1.0, 0.5, 1.25]
    assert result.metrics["reward/b/mean"] == pytest.approx(0.75)  # (1.0 + 0.5) / 2, None left out
    assert result.metrics["reward/b/none_frac"] == pytest.approx(1 / 3)
    assert result.errors == 0 and result.metrics["reward/errors"] == 0.0


def test_wrong_number_of_rewards_fails_at_once_naming_the_reward():
    pipe = RewardPipeline([comp("short", lambda p, c, **f: [1.0])])
    with pytest.raises(ValueError, match=r"'short' returned 1 values for 3 completions"):
        pipe(["q"] * 3, ["a", "b", "c"], {})


def test_wrong_type_fails_at_once_naming_the_reward():
    pipe = RewardPipeline([comp("texty", lambda p, c, **f: ["1.0"] * len(c))])
    with pytest.raises(TypeError, match=r"'texty' returned a str at index 0"):
        pipe(["q"], ["a"], {})


def test_per_sample_exception_is_left_out_and_counted(user_file):
    [flaky] = parse_reward_specs([f"{user_file}:flaky"])
    result = RewardPipeline([flaky])(["q"] * 3, ["ab", "boom", "abc"], {})
    assert result.components["flaky"] == [2.0, None, 3.0]
    assert result.scored == [True, False, True]
    assert result.errors == 1 and result.metrics["reward/flaky/errors"] == 1.0
    assert result.metrics["reward/failed_frac"] == pytest.approx(1 / 3)
    assert result.metrics["reward/mean"] == pytest.approx(2.5)  # (2 + 3) / 2: the failure is no score of 0


def test_reward_raising_on_every_sample_stops_the_run():
    def broken(prompts, completions, **fields):
        raise KeyError("answer")

    with pytest.raises(RuntimeError, match=r"'broken' raised on every sample.*KeyError"):
        RewardPipeline([comp("broken", broken)])(["q"] * 2, ["a", "b"], {})


def test_nan_inf_and_absurd_values_are_left_out_and_counted():
    values = [float("nan"), float("inf"), 1e30, -2.0, 1.0]
    result = RewardPipeline([comp("odd", lambda p, c, **f: values)])(["q"] * 5, list("abcde"), {})
    assert result.scored == [False, False, False, True, True]
    assert result.components["odd"] == [None, None, None, -2.0, 1.0]
    assert result.errors == 3 and result.metrics["reward/odd/nonfinite"] == 2.0
    assert result.metrics["reward/odd/out_of_range"] == 1.0
    assert result.metrics["reward/mean"] == pytest.approx(-0.5)


def test_a_sample_failed_by_one_component_is_not_scored_by_the_others():
    a = comp("a", lambda p, c, **f: [1.0, float("nan")])
    b = comp("b", lambda p, c, **f: [0.5, 0.5])
    result = RewardPipeline([a, b])(["q"] * 2, ["x", "y"], {})
    assert result.scored == [True, False] and result.total == [1.5, 0.0]  # 0.0: a placeholder, not a score
    assert result.components["b"] == [0.5, 0.5] and "reward/mean" in result.metrics


def test_all_none_is_allowed():
    result = RewardPipeline([comp("na", lambda p, c, **f: [None, None])])(["q"] * 2, ["a", "b"], {})
    assert result.total == [0.0, 0.0] and "reward/na/mean" not in result.metrics


def test_pool_kills_a_hanging_call_and_keeps_going(user_file):
    components = parse_reward_specs([f"{user_file}:flaky"])
    with RewardPipeline(components, workers=1, timeout_s=1.0) as pipe:
        result = pipe(["q"] * 3, ["ab", "hang", "abcd"], {})
        assert result.components["flaky"] == [2.0, None, 4.0] and result.scored == [True, False, True]
        assert result.metrics["reward/timeouts"] == 1.0 and result.errors == 1
        assert pipe(["q"], ["xyz"], {}).total == [3.0]  # the replacement worker serves


def test_unpicklable_reward_falls_back_to_in_process_with_a_warning():
    with pytest.warns(UserWarning, match="cannot be sent to a worker"):
        pipe = RewardPipeline([comp("lam", lambda p, c, **f: [1.0] * len(c))], workers=1)
    assert pipe(["q"], ["a"], {}).total == [1.0]
    pipe.close()


def test_fields_are_filtered_to_the_function_signature(user_file):
    [only_answer] = parse_reward_specs([f"{user_file}:only_answer"])
    result = RewardPipeline([only_answer])(["q"] * 2, ["4", "5"], {"answer": ["4", "4"], "tests": [None, None]})
    assert result.total == [1.0, 0.0]


def test_field_length_mismatch_is_rejected():
    with pytest.raises(ValueError, match="field 'answer' has 1 values for 2"):
        RewardPipeline([comp("a", lambda p, c, **f: [0.0] * len(c))])(["q"] * 2, ["a", "b"], {"answer": ["1"]})


def test_verifier_timeouts_reach_the_metrics(hanging_verifier):
    [math] = parse_reward_specs(["math:1.0:timeout_s=1.0"])
    result = RewardPipeline([math])(["q"] * 2, [r"\boxed{HANG}", r"\boxed{2}"], {"answer": ["1", "2"]})
    assert result.total == [0.0, 1.0]
    assert result.metrics["reward/timeouts"] == 1.0 and result.errors == 1


def test_parse_specs_forms(user_file):
    specs = ["math", "format:0.2", "soft_overlong:0.5:max_len=512,cache=128", f"{user_file}:flaky:2",
             {"name": "length_penalty", "weight": 0.1, "kwargs": {"max_len": 64}}, "task"]
    task_reward = lambda prompts, completions, **fields: [1.0] * len(completions)  # noqa: E731
    components = parse_reward_specs(specs, extra={"task": task_reward})
    assert [(c.name, c.weight) for c in components] == [
        ("math", 1.0), ("format", 0.2), ("soft_overlong", 0.5), ("flaky", 2.0), ("length_penalty", 0.1), ("task", 1.0)
    ]
    assert components[2].kwargs == {"max_len": 512, "cache": 128}
    assert components[0].fn is REWARDS.get("math") and components[5].fn is task_reward


def test_parse_specs_errors(user_file):
    with pytest.raises(ValueError, match="unknown reward 'maths'.*format.*math"):
        parse_reward_specs(["maths"])
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        parse_reward_specs([f"{user_file}:nope"])
    with pytest.raises(ValueError, match="appear more than once"):
        parse_reward_specs(["math", "math:0.5"])
    with pytest.raises(ValueError, match="takes no parameter"):
        parse_reward_specs([f"{user_file}:only_answer:max_len=3"])


def test_an_unquoted_command_line_list_keeps_each_specs_parameters_together():
    from grpoplus.config import build_config

    cfg = build_config(overrides=["rewards=[task,soft_overlong:0.5:max_len=48,cache=8,length_penalty:coef=2]",
                                  "overlong_shaping=false"])
    components = parse_reward_specs(cfg.data.rewards, extra={"task": lambda p, c: [0.0] * len(c)})
    assert [(c.name, c.weight, c.kwargs) for c in components] == [
        ("task", 1.0, {}), ("soft_overlong", 0.5, {"max_len": 48, "cache": 8}), ("length_penalty", 1.0, {"coef": 2})]


def sleeper(seconds: float, on: str | None = None, calls: list | None = None):
    """A reward scoring len(c), sleeping ``seconds`` when any completion is ``on`` (every call when None)."""

    def fn(prompts, completions, **fields):
        if calls is not None:
            calls.append(len(completions))
        if on is None or on in completions:
            time.sleep(seconds)
        return [float(len(c)) for c in completions]

    return fn


def test_in_process_reward_that_hangs_is_timed_out_not_waited_for():
    pipe = RewardPipeline([comp("slow", sleeper(60))], timeout_s=0.25)
    result = pipe(["q"] * 2, ["a", "bb"], {})  # returns after 2 x 0.25 s for the batch and as much for the retry
    assert result.scored == [False, False] and result.metrics["reward/timeouts"] == 2.0
    assert "reward/mean" not in result.metrics


def test_in_process_timeout_retries_each_sample_and_keeps_the_ones_that_return():
    calls = []
    pipe = RewardPipeline([comp("flaky", sleeper(60, on="hang", calls=calls))], timeout_s=0.2)
    result = pipe(["q"] * 3, ["ab", "hang", "abcd"], {})
    assert result.components["flaky"] == [2.0, None, 4.0] and result.scored == [True, False, True]
    assert result.metrics["reward/timeouts"] == 1.0
    assert calls == [3, 1, 1, 1]  # the batch once, then each sample once (in parallel, under one more limit)


def test_a_reward_timing_out_on_every_batch_stops_the_run_naming_the_fix():
    pipe = RewardPipeline([comp("stuck", sleeper(60))], timeout_s=0.2)
    for _ in range(MAX_TIMEOUT_STREAK - 1):
        pipe(["q"], ["a"], {})
    with pytest.raises(RewardError, match=r"'stuck' timed out on every sample of 3 batches.*data.reward_workers"):
        pipe(["q"], ["a"], {})


def test_timeout_streak_resets_when_a_batch_scores():
    pipe = RewardPipeline([comp("sometimes", sleeper(60, on="hang"))], timeout_s=0.2)
    for _ in range(MAX_TIMEOUT_STREAK):
        pipe(["q"], ["hang"], {})
        assert pipe(["q"], ["ok"], {}).scored == [True]


@pytest.mark.parametrize("in_process", [False, True])
def test_in_process_batch_gets_the_limit_per_sample(in_process):
    calls = []
    fn = sleeper(0.3, calls=calls)
    fn.in_process = in_process
    result = RewardPipeline([comp("batchy", fn)], timeout_s=0.2)(["q"] * 2, ["a", "bb"], {})  # 0.3 s < 2 x 0.2 s
    assert result.scored == [True, True] and calls == [2]


def test_a_timed_out_model_batch_is_not_retried_per_sample():
    calls = []
    fn = sleeper(60, calls=calls)
    fn.in_process = True
    result = RewardPipeline([comp("model", fn)], timeout_s=0.1)(["q"] * 2, ["a", "bb"], {})
    assert result.scored == [False, False] and result.metrics["reward/timeouts"] == 2.0 and calls == [2]


def test_too_many_hung_calls_stop_the_run_naming_the_pool(monkeypatch):
    monkeypatch.setattr(pipeline, "MAX_HUNG", 2)
    pipe = RewardPipeline([comp("hangs", sleeper(60, on="hang"))], timeout_s=0.1)
    pipe(["q"], ["hang"], {})  # the batch call and its retry: two threads that never return
    with pytest.raises(RewardError, match=r"2 in-process calls of reward 'hangs'.*data.reward_workers=auto"):
        pipe(["q"], ["ok"], {})
