"""The multi-turn function-calling environment: calls answered from the row's mock results (by value, nothing run),
errors answered and counted, a turn without a call ends the episode; the function_call reward scores the calls of
the whole transcript; and training plays the built-in task's rows in it."""

import json

import pytest

from grpoplus.containers import SamplingParams
from grpoplus.entry.cli import main
from grpoplus.envs.base import ENVS
from grpoplus.envs.episodes import EpisodeLimits, run_episodes
from grpoplus.envs.functions import FunctionCallEnv
from grpoplus.metrics import read_metrics
from grpoplus.rewards.function_call import function_call_score
from grpoplus.rollout.hf import HFEngine

WEATHER = {"name": "weather", "description": "Weather in a city", "parameters": {"type": "object", "required": [
    "city"], "properties": {"city": {"type": "string"}, "unit": {"type": "string", "default": "c"}}}}
CONVERT = {"name": "convert", "description": "Convert units", "parameters": {"type": "object", "required": [
    "value", "src", "dst"], "properties": {"value": {"type": "number"}, "src": {"type": "string"},
                                           "dst": {"type": "string"}}}}
ROW = {"tools": [WEATHER, CONVERT], "messages": [{"role": "user", "content": "Weather in Oslo, in fahrenheit?"}],
       "tool_results": [{"name": "weather", "arguments": {"city": "Oslo"}, "result": "20 C"},
                        {"name": "convert", "result": {"value": 68, "unit": "f"}}],
       # a chain: the second call's value comes from the first call's result
       "answer": [{"name": "weather", "arguments": {"city": "Oslo"}},
                  {"name": "convert", "arguments": {"value": 20, "src": "c", "dst": "f"}}]}


def call(name, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_calls_are_answered_from_the_rows_results_and_a_turn_without_one_ends_the_episode():
    env = ENVS.get("function_calling")(tools=ROW["tools"], tool_results=ROW["tool_results"], messages=ROW["messages"])
    assert env.reset(prompt="p") == ROW["messages"] and [t["function"]["name"] for t in env.tool_schemas] == [
        "weather", "convert"]
    first = env.step(call("weather", city=" oslo"))  # by value: BFCL's string standardisation
    assert first.observation == [{"role": "tool", "content": "20 C"}] and first.info == {"tool_calls": 1,
                                                                                         "tool_errors": 0}
    second = env.step(call("convert", value=20.0, src="c", dst="f"))  # an entry without arguments answers any call
    assert json.loads(second.observation[0]["content"]) == {"value": 68, "unit": "f"} and not second.done
    final = env.step("It is 68 F in Oslo.")
    assert final.done and final.reward is None  # the reward scores the transcript


def test_errors_are_answered_and_counted_and_the_episode_goes_on():
    env = FunctionCallEnv(ROW["tools"], ROW["tool_results"])
    result = env.step(call("weather", city="Rome") + call("clock") + '<tool_call>{"name": "weather"</tool_call>')
    texts = [m["content"] for m in result.observation]
    assert texts[0] == 'error: weather has no result for the arguments {"city": "Rome"}'
    assert texts[1] == "error: no tool named 'clock'; the tools are convert, weather"
    assert texts[2].startswith("error: the tool call") and result.info == {"tool_calls": 3, "tool_errors": 3}
    assert not result.done and env.tool_schemas is None  # no messages: the row's prompt lists its tools itself


def test_the_reward_scores_every_call_of_the_transcript_in_order():
    transcript = (call("weather", city="Oslo") + "=> 20 C\n" + call("convert", value=20, src="c", dst="f")
                  + "=> 68 F\nIt is 68 F.")
    assert function_call_score(transcript, ROW["answer"], ROW["tools"]) == 1.0
    swapped = call("convert", value=20, src="c", dst="f") + "=> 68 F\n" + call("weather", city="Oslo")
    assert function_call_score(swapped, ROW["answer"], ROW["tools"]) == 0.0
    assert function_call_score(swapped, ROW["answer"], ROW["tools"], parallel=True) == 1.0


def test_episodes_render_the_rows_tools_and_play_them(tok, short_turns):
    engine = HFEngine(short_turns(), tok)
    rows = [{"prompt": "unused", "answer": "", **ROW}]
    params = SamplingParams(n=2, temperature=1.0, top_p=1.0, max_new_tokens=8)
    rollouts, metrics = run_episodes(engine, tok, ENVS.get("function_calling"), rows, params,
                                     EpisodeLimits(max_turns=3, max_context=4096))
    assert rollouts.prompt_ids.shape[0] == 2
    prompt = tok.decode(rollouts.prompt_ids[0], skip_special_tokens=True)
    assert prompt.startswith("You can call these tools:") and prompt.endswith("Weather in Oslo, in fahrenheit?")
    assert metrics["env/ended/error"] == 0.0


@pytest.mark.slow
def test_training_plays_the_built_in_tasks_rows_in_the_environment(nano_dir, tmp_path):
    out = tmp_path / "fc"
    assert main(["train", "--task", "function_calling", "--model", nano_dir, "--out", str(out), "env=function_calling",
                 "max_steps=1", "max_turns=2", "max_new_tokens=8", "prompts_per_step=2", "group_size=2",
                 "eval_size=2", "eval_samples=0", "progress=false", "loggers=[]", "doctor_every=0",
                 "save_every=0"]) == 0
    last = read_metrics(out)[-1]
    assert "env/turns_mean" in last and last["env/ended/error"] == 0.0 and "reward/task/mean" in last
