"""Function-calling rows: BFCL's, xLAM's, ToolACE's and the project's layouts load into one record; a bad row is one line naming
its line, the problem and the fix (skipped and counted, or an error); the prompt is rendered with the row's tools
through a template that takes them, else in a system message that states the call format."""

import json

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from grpoplus.data import apply_chat_template, load_records
from grpoplus.data.chat import takes_tools
from grpoplus.rewards.function_call import function_call_score

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
OURS = {"tools": [WEATHER], "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "answer": [{"name": "get_weather", "arguments": {"city": "Paris"}}], "source": "ours"}
BFCL = {"id": "parallel_7", "question": [[{"role": "user", "content": "Weather in Paris and Rome?"}]],
        "function": [{"name": "get_weather", "description": "Weather", "parameters": {
            "type": "dict", "properties": {"city": {"type": "string"}}, "required": ["city"]}}],
        "ground_truth": [{"get_weather": {"city": ["Paris"]}}, {"get_weather": {"city": ["Rome", "Roma"]}}]}
TOOLACE = {"tools": [{"name": "get_weather", "description": "Weather", "parameters": {  # ToolACE's assistant turn
    "type": "dict", "properties": {"city": {"type": "str"}, "days": {"type": "int"}}, "required": ["city"]}}],
    "messages": [{"role": "user", "content": "Weather in Lima for 3 days?"}], "answer": '[get_weather(city="Lima", days=3)]'}
XLAM = {"query": "Weather in Oslo?", "answers": json.dumps([{"name": "get_weather", "arguments": {"city": "Oslo"}}]),
        "tools": json.dumps([{"name": "get_weather", "description": "Weather",
                              "parameters": {"city": {"type": "str", "description": "the city"}}}])}


def _write(tmp_path, rows) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_the_three_layouts_load_into_one_record(tmp_path):
    data = load_records(_write(tmp_path, [OURS, BFCL, XLAM, TOOLACE]), on_bad_row="error")
    assert data.function_calls and not data.skipped
    ours, bfcl, xlam, toolace = data.records
    assert json.loads(toolace["answer"]) == [{"get_weather": {"city": ["Lima"], "days": [3]}}]
    assert ours["prompt"] == "Weather in Paris?" and ours["fields"]["source"] == "ours"
    assert [t["function"]["parameters"]["properties"]["city"]["type"] for t in
            (ours["fields"]["tools"][0], bfcl["fields"]["tools"][0], xlam["fields"]["tools"][0])] == ["string"] * 3
    assert json.loads(ours["answer"]) == [{"get_weather": {"city": ["Paris"]}}]  # BFCL's ground-truth form
    assert bfcl["fields"]["parallel"] and not ours["fields"]["parallel"]  # BFCL's id names its category
    assert bfcl["fields"]["messages"] == [{"role": "user", "content": "Weather in Paris and Rome?"}]
    both = '<tool_call>{"name": "get_weather", "arguments": {"city": "roma"}}</tool_call>' \
           '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert function_call_score(both, bfcl["answer"], bfcl["fields"]["tools"], parallel=True) == 1.0
    assert function_call_score('{"name": "get_weather", "arguments": {"city": "Oslo"}}', xlam["answer"],
                               xlam["fields"]["tools"]) == 1.0


BAD = [
    ({**OURS, "tools": [{"description": "x"}]}, "tool 1 has no name: write each tool as"),
    ({**OURS, "answer": [{"name": "get_time", "arguments": {}}]},
     "expected call 1 names 'get_time', which is not one of the row's tools (get_weather): fix the call's name"),
    ({**OURS, "answer": [{"name": "get_weather", "arguments": {}}]},
     "leaves out the required argument(s) ['city']: give them"),
    ({k: v for k, v in OURS.items() if k != "answer"}, "no expected calls (looked for 'answer', 'ground_truth', "
                                                       "'answers'): give the row the expected calls in 'answer'"),
    ({k: v for k, v in OURS.items() if k != "messages"}, "no prompt (looked for 'messages', 'prompt'"),
    ({k: v for k, v in OURS.items() if k != "tools"}, "no tools (looked for 'tools', 'function')"),
    ({**OURS, "parallel": "yes"}, "'parallel' must be true or false, got 'yes'"),
    ({**OURS, "tool_results": [{"name": "get_time", "result": 1}]}, "'tool_results' answers ['get_time'], not among"),
]


@pytest.mark.parametrize("row, message", BAD, ids=[m[:30] for _, m in BAD])
def test_a_bad_row_is_one_line_with_its_line_number_and_the_fix(tmp_path, row, message):
    path = _write(tmp_path, [OURS, row])
    with pytest.raises(ValueError) as info:
        load_records(path, on_bad_row="error")
    assert str(info.value).startswith(f"{path}: line 2: ") and message in str(info.value)
    assert "\n" not in str(info.value)
    skipped = load_records(path)  # the default: skipped, counted, the run goes on
    assert len(skipped.records) == 1 and skipped.skipped[0][0] == 2 and message in skipped.skipped[0][1]


def test_a_row_that_is_not_json_is_skipped_too(tmp_path):
    data = load_records(_write(tmp_path, [OURS, '{"tools": [', OURS]))
    assert len(data.records) == 2 and data.skipped[0][0] == 2 and "invalid JSON" in data.skipped[0][1]


# a template that renders tools (the way transformers' tool-use templates do), and one that does not
TOOLS_TEMPLATE = ("{% if tools %}<|tools|>{% for t in tools %}{{ t['function']['name'] }};{% endfor %}{% endif %}"
                  "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}<|assistant|>{% endif %}")
PLAIN_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _tokenizer(chat_template):
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    tok.chat_template = chat_template
    return tok


def test_a_template_that_takes_tools_renders_them_itself():
    tok = _tokenizer(TOOLS_TEMPLATE)
    assert takes_tools(tok)
    text = apply_chat_template(tok, [{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER])
    assert text == "<|tools|>get_weather;<|user|>Weather in Paris?\n<|assistant|>"  # jinja trims after a block


def test_a_template_without_tools_gets_them_in_a_system_message_with_the_call_format():
    tok = _tokenizer(PLAIN_TEMPLATE)
    assert not takes_tools(tok)
    text = apply_chat_template(tok, "Weather in Paris?", system="Be brief.", tools=[WEATHER])
    system, user = text.split("\n<|user|>")
    assert system.startswith("<|system|>You can call these tools:\n" + json.dumps(WEATHER["function"]))
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "..."}}</tool_call>' in system
    assert system.endswith("Be brief.") and user == "Weather in Paris?\n<|assistant|>"


def test_no_template_reads_the_tools_above_the_prompt():
    text = apply_chat_template(_tokenizer(None), [{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER])
    assert text.startswith("You can call these tools:") and text.endswith("\n\nWeather in Paris?")
    assert apply_chat_template(_tokenizer(None), "2+2?", system="ignored without a template") == "2+2?"
