"""Tool use: schemas from type hints and docstrings, calls parsed from the turn, results (and errors) returned to
the model as tool messages, TRL-style tool classes unchanged, the call format stated where the template cannot."""

import json

import pytest

from grpoplus.envs.adapters import adapt
from grpoplus.envs.render import first_prompt_ids
from grpoplus.envs.tools import ToolEnv, calculator, parse_calls, python, resolve_tools
from grpoplus.models.tokenizer import char_tokenizer


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def broken(x: str) -> str:
    """Always fails.

    Args:
        x: anything
    """
    raise RuntimeError("disk on fire")


def _call(name, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_calls_run_and_their_results_come_back_as_tool_messages():
    env = ToolEnv([add, broken])
    assert env.reset(prompt="2+3?") == [{"role": "user", "content": "2+3?"}]
    assert [s["function"]["name"] for s in env.tool_schemas] == ["add", "broken"]
    result = env.step("let me add " + _call("add", a=2, b=3) + _call("broken", x="y"))
    assert not result.done and result.info == {"tool_calls": 2, "tool_errors": 1}
    assert result.observation == [{"role": "tool", "content": "5"},
                                  {"role": "tool", "content": "error: RuntimeError: disk on fire"}]
    final = env.step("the answer is 5")  # no call: the answer, the episode ends
    assert final.done and final.reward is None


def test_bad_calls_are_answered_with_the_error_not_raised():
    calls = parse_calls('<tool_call>{"name": "add", "arguments": [1]}</tool_call><tool_call>not json</tool_call>')
    assert all(isinstance(c, str) and c.startswith("error: the tool call") for c in calls)
    result = ToolEnv([add]).step(_call("nope") + _call("add", a=1))
    texts = [m["content"] for m in result.observation]
    assert texts[0] == "error: no tool named 'nope'; the tools are add"
    assert texts[1].startswith("error: TypeError") and result.info["tool_errors"] == 2


class Counter:
    """A TRL-style environment: reset(**row), public methods are tools, get_reward() at the end."""

    def reset(self, **row):
        self.total = 0
        return "start at 0"

    def increment(self, by: int) -> str:
        """Add to the counter.

        Args:
            by: how much
        """
        self.total += by
        return f"now {self.total}"

    def get_reward(self) -> float:
        return float(self.total == 3)


def test_a_trl_style_class_runs_unchanged():
    env = adapt(Counter())
    assert [s["function"]["name"] for s in env.tool_schemas] == ["increment"]
    assert env.reset(prompt="reach 3") == [{"role": "user", "content": "reach 3\n\nstart at 0"}]
    assert env.step(_call("increment", by=2)).observation == [{"role": "tool", "content": "now 2"}]
    env.step(_call("increment", by=1))
    assert env.step("done").reward == 1.0


def test_what_a_factory_returns_is_recognised():
    assert isinstance(adapt([add]), ToolEnv)
    native = ToolEnv([add])
    assert adapt(native) is native  # has step: played as it is
    with pytest.raises(ValueError, match="neither step\\(\\) nor public methods"):
        adapt(object())
    with pytest.raises(ValueError, match="returned None"):
        adapt(None)


def test_a_template_without_tools_gets_them_in_a_stated_system_message():
    tok = char_tokenizer()
    ids = first_prompt_ids(tok, [{"role": "user", "content": "2+3?"}], ToolEnv([add]).tool_schemas)
    text = tok.decode(ids, skip_special_tokens=True)
    assert "You can call these tools" in text and '"name": "add"' in text and "<tool_call>" in text
    assert text.endswith("2+3?")


def test_built_in_tools_and_their_refusals():
    assert calculator("(12+3)*4") == "60" and calculator("7/2") == "3.5"
    for bad in ("__import__('os')", "2**999"):
        with pytest.raises(ValueError):
            calculator(bad)
    assert resolve_tools(["calculator", "tests.envs.test_tools:add"])[1] is not None
    with pytest.raises(ValueError, match="unknown tool 'nope'"):
        resolve_tools(["nope"])

    def undocumented(x):
        return x

    with pytest.raises(ValueError, match="cannot be described to the model"):
        ToolEnv([undocumented])


def test_the_python_tool_runs_in_the_sandbox():
    out = python("print(6*7)")
    assert out == "42" or "GRPOPLUS_SANDBOX_HOST_FILES" in out  # a host that cannot isolate says so, runs nothing


def test_the_share_of_trajectories_that_called_a_tool_is_measured():
    from grpoplus.envs.episodes import Episode, episode_metrics
    from grpoplus.envs.trajectory import Turn

    episodes = [Episode(None, [1], [Turn([2], [0.0])], reason="done", tool_calls=calls) for calls in (0, 2, 1, 0)]
    metrics = episode_metrics(episodes)
    assert metrics["env/tool_call_frac"] == 0.5 and metrics["env/tool_calls"] == 3.0
