"""The function_call reward: a table of completions against expected calls, each verdict worked out by hand from
BFCL's rules (the module docstring), the layouts it reads (OpenAI, bare/xLAM, BFCL ground truth), and the counted
failures."""

import json

import pytest

from grpoplus.rewards import REWARDS, RewardPipeline, parse_reward_specs
from grpoplus.rewards.function_call import function_call_score, standardise
from grpoplus.rewards.tool_calls import calls_in
from grpoplus.rewards.tool_schemas import ground_truth, read_expected, read_tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "days": {"type": "integer"}}}}}
AREA = {"name": "area", "description": "Area of a triangle", "parameters": {  # the bare form (BFCL, xLAM)
    "type": "dict", "required": ["base", "height"], "properties": {
        "base": {"type": "float"}, "height": {"type": "float"}, "sides": {"type": "array", "items": {"type": "float"}},
        "meta": {"type": "dict", "properties": {"tag": {"type": "string"}}}}}}
TOOLS = [WEATHER, AREA]


def call(name, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


PARIS = [{"name": "get_weather", "arguments": {"city": "Paris"}}]
CASES = [
    # (completion, expected, parallel, score, why)
    (call("get_weather", city="Paris"), PARIS, False, 1.0, "exact"),
    (call("get_weather", city="paris "), PARIS, False, 1.0, "strings: trimmed and lowercased"),
    (call("get_weather", city="New-York, NY"), [{"name": "get_weather", "arguments": {"city": "new york ny"}}],
     False, 1.0, "BFCL's standardisation drops spaces , . / - _ * ^"),
    (call("get_weather", city="Lyon"), PARIS, False, 0.0, "another value"),
    (call("get_forecast", city="Paris"), PARIS, False, 0.0, "name mismatch"),
    (call("get_weather", city="Paris", unit="celsius"), PARIS, False, 1.0,
     "an optional argument left out of the expected call may be given its schema default"),
    (call("get_weather", city="Paris", unit="fahrenheit"), PARIS, False, 0.0, "...but no other value"),
    (call("get_weather", city="Paris"), [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}],
     False, 1.0, "expected with the default value: leaving it out is allowed"),
    (call("get_weather", city="Paris"), [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}],
     False, 0.0, "an expected optional argument without a default must be given"),
    (call("get_weather", city="Paris", colour="red"), PARIS, False, 0.0, "an extra argument not in the schema"),
    (call("get_weather", city="Paris", days=2), PARIS, False, 0.0, "an extra schema argument the data does not list"),
    (call("get_weather"), PARIS, False, 0.0, "a required argument missing"),
    (call("area", base=10, height=5), [{"name": "area", "arguments": {"base": 10.0, "height": 5.0}}], False, 1.0,
     "an integer where a float is expected: by value"),
    (call("area", base=10.0, height=5.5), [{"name": "area", "arguments": {"base": 10, "height": 5.5}}], False, 1.0,
     "a float equal to the expected integer"),
    (call("get_weather", city="Paris", days=3.0), [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}],
     False, 0.0, "a float where the schema says integer: a type error (BFCL)"),
    (call("area", base=True, height=5), [{"name": "area", "arguments": {"base": 1, "height": 5}}], False, 0.0,
     "a boolean is not a number"),
    (call("get_weather", city="Paris", days="3"), [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}],
     False, 0.0, "a string for an integer"),
    (call("area", base=1, height=2, sides=[1, 2.5]), [{"area": {"base": [1], "height": [2], "sides": [[1.0, 2.5]]}}],
     False, 1.0, "BFCL ground truth; integer items of a float array accepted"),
    (call("area", base=1, height=2, sides=[2.5, 1]), [{"area": {"base": [1], "height": [2], "sides": [[1.0, 2.5]]}}],
     False, 0.0, "a list is compared in order"),
    (call("area", base=1, height=2, sides=["A", "b"]), [{"area": {"base": [1], "height": [2], "sides": [["a", "b"]]}}],
     False, 1.0, "BFCL's variable case one level down: items of the acceptable list's item type (BFCL's "
                 "simple_python_149, parallel_multiple_94)"),
    (call("area", base=1, height=2, sides=[True]), [{"area": {"base": [1], "height": [2], "sides": [["a"]]}}],
     False, 0.0, "...an item of neither type is refused"),
    (call("area", base=1, height=2, meta={"tag": "Big"}), [{"area": {"base": [1], "height": [2],
                                                                   "meta": [{"tag": ["big"]}]}}],
     False, 1.0, "an object key by key, strings standardised"),
    (call("area", base=3, height=2), [{"area": {"base": [2, 3], "height": [2], "meta": ["", {"tag": ["x"]}]}}],
     False, 1.0, "BFCL: one of several acceptable values; an argument whose values hold \"\" may be left out"),
    (call("get_weather", city="Paris") + call("get_weather", city="Rome"),
     [{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "get_weather", "arguments": {"city": "Paris"}}],
     True, 1.0, "parallel calls in any order"),
    (call("get_weather", city="Paris") + call("get_weather", city="Rome"),
     [{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "get_weather", "arguments": {"city": "Paris"}}],
     False, 0.0, "not parallel: in order"),
    (call("get_weather", city="Paris"),
     [{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "get_weather", "arguments": {"city": "Paris"}}],
     True, 0.0, "one call of two"),
    (call("get_weather", city="Paris") * 2, PARIS, False, 0.0, "one call too many"),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', PARIS, False, 1.0, "bare JSON, no tags"),
    ('Sure.\n```json\n[{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}]\n```', PARIS, False, 1.0,
     "a fenced JSON list; arguments as a JSON string (OpenAI)"),
    ('[get_weather(city="Paris")]', PARIS, False, 1.0, "BFCL's Python form, parsed, not run"),
    ("It is sunny in Paris.", PARIS, False, 0.0, "no call"),
]


@pytest.mark.parametrize("completion, expected, parallel, score, why", CASES, ids=[c[-1] for c in CASES])
def test_the_reward_follows_bfcls_rules(completion, expected, parallel, score, why):
    assert function_call_score(completion, expected, TOOLS, parallel=parallel) == score, why


def test_a_bfcl_argument_the_tool_does_not_take_is_dropped_when_it_may_be_left_out():
    # BFCL's parallel_multiple_12 expects "permeability": ["", 0.1] of a tool without it: the call can only leave
    # it out (given, it is an unexpected argument, for BFCL too); one that must be given is still refused
    expected = [{"get_weather": {"city": ["Paris"], "permeability": ["", 0.1]}}]
    assert read_expected(expected, read_tools(TOOLS)) == [{"name": "get_weather", "arguments": {"city": ["Paris"]}}]
    assert function_call_score(call("get_weather", city="Paris"), expected, TOOLS) == 1.0
    assert function_call_score(call("get_weather", city="Paris", permeability=0.1), expected, TOOLS) == 0.0
    with pytest.raises(ValueError, match=r"passes \['permeability'\], which the tool does not take"):
        read_expected([{"get_weather": {"city": ["Paris"], "permeability": [0.1]}}], read_tools(TOOLS))


def test_a_call_in_a_maximum_matching_beats_bfcls_greedy_pass():
    # expected 1 takes Paris or Rome, expected 2 only Paris; calls (Paris, Rome): greedy gives Paris to expected 1
    # and finds nothing for expected 2; the matching gives Rome to 1 and Paris to 2
    expected = [{"get_weather": {"city": ["Paris", "Rome"]}}, {"get_weather": {"city": ["Paris"]}}]
    completion = call("get_weather", city="Paris") + call("get_weather", city="Rome")
    assert function_call_score(completion, expected, TOOLS, parallel=True) == 1.0


def test_partial_credit_is_the_share_matched_over_the_larger_count():
    expected = [{"name": "get_weather", "arguments": {"city": c}} for c in ("Paris", "Rome", "Oslo")]
    two_right = call("get_weather", city="Oslo") + call("get_weather", city="Paris")
    assert function_call_score(two_right, expected, TOOLS, parallel=True, partial=True) == 2 / 3
    four = two_right + call("get_weather", city="Rome") + call("get_weather", city="Lima")
    assert function_call_score(four, expected, TOOLS, parallel=True, partial=True) == 3 / 4  # an extra call costs
    assert function_call_score(four, expected, TOOLS, parallel=True) == 0.0


def test_invalid_json_scores_zero_and_is_counted_not_raised():
    spec = parse_reward_specs(["function_call"])
    completions = ['<tool_call>{"name": "get_weather", "arguments": {city: Paris}}</tool_call>',
                   call("get_weather", city="Paris"), "no call at all", "{not json"]
    answer = [json.dumps(PARIS)] * 4
    with RewardPipeline(spec) as pipeline:
        result = pipeline([""] * 4, completions, {"answer": answer, "tools": [TOOLS] * 4, "parallel": [False] * 4})
    assert result.components["function_call"] == [0.0, 1.0, 0.0, 0.0]
    assert result.errors == 0  # the model's mistakes, not the reward's
    assert result.metrics["reward/function_call/calls_invalid"] == 2.0
    assert result.metrics["reward/function_call/calls_none"] == 1.0


def test_rows_without_tools_do_not_apply_and_a_parameter_may_make_every_row_parallel():
    fn = REWARDS.get("function_call")
    two = call("get_weather", city="Rome") + call("get_weather", city="Paris")
    expected = json.dumps([{"name": "get_weather", "arguments": {"city": c}} for c in ("Paris", "Rome")])
    assert fn(["", ""], [two, two], answer=[expected, "7"], tools=[TOOLS, None], parallel=True) == [1.0, None]


def test_the_layouts_read_into_one_form():
    openai, bare = read_tools([WEATHER]), read_tools(json.dumps([WEATHER["function"]]))
    assert openai == bare and openai[0]["type"] == "function"
    bfcl = read_tools([AREA])[0]["function"]["parameters"]
    assert bfcl["type"] == "object" and bfcl["properties"]["base"]["type"] == "number"
    assert bfcl["properties"]["sides"]["items"]["type"] == "number" and bfcl["properties"]["meta"]["type"] == "object"
    xlam = read_tools('[{"name": "search", "description": "d", "parameters": {"q": {"type": "str", "description": '
                      '"query"}, "limit": {"type": "int, optional", "default": 10}, "tags": {"type": "List[str]"}}}]')
    params = xlam[0]["function"]["parameters"]
    assert params["required"] == ["q", "tags"]
    assert [params["properties"][k]["type"] for k in ("q", "limit", "tags")] == ["string", "integer", "array"]
    assert params["properties"]["tags"]["items"] == {"type": "string"}
    # xLAM's answers, OpenAI's tool_calls and BFCL's ground truth: one form, and BFCL's form reads back the same
    ours = read_expected('[{"name": "get_weather", "arguments": {"city": "Paris"}}]', openai)
    tool_call = read_expected([{"type": "function", "function": {"name": "get_weather",
                                                                 "arguments": '{"city": "Paris"}'}}], openai)
    bfcl_gt = read_expected([{"get_weather": {"city": ["Paris"], "unit": ["", "celsius"], "days": [""]}}], openai)
    # the optional arguments the exact form leaves out may be left out (unit: or given its default)
    assert ours == tool_call == bfcl_gt == [{"name": "get_weather", "arguments": {"city": ["Paris"],
                                                                                  "unit": ["", "celsius"], "days": [""]}}]
    assert read_expected(json.dumps(ground_truth(ours)), openai) == ours


@pytest.mark.parametrize("tools, expected, message", [
    ("[{", PARIS, "'tools' is text that is not JSON"),
    ([{"description": "no name"}], PARIS, "tool 1 has no name"),
    ([{"name": "f", "parameters": "x: int"}], [{"name": "f", "arguments": {}}],
     "tool 'f': 'parameters' is text that is not JSON"),
    ([{"name": "f", "parameters": {"type": "object", "properties": {}, "required": ["x"]}}],
     [{"name": "f", "arguments": {}}], "'required' lists ['x'], not among its properties"),
    ([WEATHER, WEATHER], PARIS, "appear more than once"),
    ([WEATHER], [{"name": "get_time", "arguments": {}}], "names 'get_time', which is not one of the row's tools"),
    ([WEATHER], [{"name": "get_weather", "arguments": {"town": "Paris"}}], "passes ['town'], which the tool does not"),
    ([WEATHER], [{"name": "get_weather", "arguments": {"unit": "celsius"}}], "leaves out the required argument(s) ['city']"),
    ([WEATHER], [{"get_weather": {"city": "Paris"}}], "each argument maps to a list of acceptable values"),
    ([WEATHER], '[{"name": "get_weather"', "the expected calls is text that is not JSON"),
])
def test_an_unreadable_row_is_one_line_naming_the_problem(tools, expected, message):
    with pytest.raises(ValueError, match=None) as info:
        function_call_score(call("get_weather", city="Paris"), expected, tools)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_calls_are_read_never_run():
    found = calls_in('[get_weather(city=__import__("os").system("echo hacked"))]')
    assert found.calls == [] and "literal" in found.invalid[0]
    assert calls_in("[f(1)]").invalid and calls_in("Paris (France) is sunny").calls == []
    assert standardise("3.5 km/h") == standardise("35 KM h") == "35kmh"
