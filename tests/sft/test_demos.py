"""Demonstrations read, checked and rendered: the ids a rollout of the same conversation holds, the loss on the
assistant's tokens alone, and one line naming each bad row."""

import json

import pytest

from grpoplus.envs.render import first_prompt_ids, observation_ids
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.sft.demos import DemoError, checked_messages, render
from grpoplus.sft.source import file_demos, split_held_out

CALC = {"type": "function", "function": {"name": "calculator", "description": "arithmetic",
                                         "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                        "required": ["expression"]}}}
TOOL_ROW = {"messages": [{"role": "user", "content": "12*7?"},
                         {"role": "assistant", "tool_calls": [{"type": "function", "function": {
                             "name": "calculator", "arguments": "{\"expression\": \"12*7\"}"}}]},
                         {"role": "tool", "content": "84"},
                         {"role": "assistant", "content": "#84"}],
            "tools": [CALC]}


@pytest.fixture(params=["plain", "chat"])
def tokenizer(request):
    """The character tokenizer as it is (no template: the plain markup) and with a chat template."""
    tok = char_tokenizer()
    if request.param == "chat":
        tok.chat_template = ("{% for m in messages %}<{{m.role}}>{{m.content}}" + tok.eos_token + "{% endfor %}"
                             "{% if add_generation_prompt %}<assistant>{% endif %}")
    return tok


def test_a_tool_conversation_renders_as_its_rollout_would(tokenizer):
    """Prompt = the episode's first prompt ids (tools stated); each assistant turn = its text with the call in the
    stated format + EOS, trained; the tool result = the observation ids an episode appends, not trained."""
    demo = render(tokenizer, TOOL_ROW["messages"], TOOL_ROW["tools"])
    assert list(demo.prompt) == first_prompt_ids(tokenizer, [{"role": "user", "content": "12*7?"}], [CALC])
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'
    turn1 = tokenizer(call, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    seen = observation_ids(tokenizer, [{"role": "tool", "content": "84"}])
    turn2 = tokenizer("#84", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert list(demo.response) == turn1 + seen + turn2
    assert list(demo.trained) == [1] * len(turn1) + [0] * len(seen) + [1] * len(turn2)


def test_prompt_completion_rows_and_max_length():
    tok = char_tokenizer()
    msgs = checked_messages({"prompt": "3+4=", "completion": "#7"}, "row 1")
    demo = render(tok, msgs)
    assert list(demo.prompt) == tok("3+4=")["input_ids"]
    assert tok.decode(list(demo.response)) == "#7" + tok.eos_token
    cut = render(tok, msgs, max_length=len(demo.prompt) + 1)
    assert cut.tokens == len(demo.prompt) + 1 and cut.trained == (1,)


@pytest.mark.parametrize("row, said", [
    ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant turn"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "opens with the assistant"),
    ({"messages": [{"role": "robot", "content": "hi"}, {"role": "assistant", "content": "x"}]}, "unknown role 'robot'"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": "{not json"}}]}]}, "not valid JSON"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"arguments": {}}]}]},
     "needs a function name"),
    ({"text": "hello"}, "no 'messages' list and no prompt/completion"),
])
def test_bad_rows_are_one_line_naming_the_row(row, said):
    with pytest.raises(DemoError, match=said) as err:
        checked_messages(row, "demos.jsonl: line 3")
    assert str(err.value).startswith("demos.jsonl: line 3") and "\n" not in str(err.value)


def test_a_file_skips_bad_rows_or_stops_on_the_first(tmp_path):
    path = tmp_path / "demos.jsonl"
    path.write_text("\n".join([json.dumps(TOOL_ROW), "not json", json.dumps({"messages": [{"role": "user"}]}),
                               json.dumps({"prompt": "1+1=", "completion": "#2"})]) + "\n")
    demos, skipped = file_demos(path, char_tokenizer(), "messages", 0, "skip")
    assert len(demos) == 2 and [line for line, _ in skipped] == [2, 3]
    with pytest.raises(DemoError, match="line 2: invalid JSON"):
        file_demos(path, char_tokenizer(), "messages", 0, "error")
    with pytest.raises(FileNotFoundError, match="sft.demos"):
        file_demos(tmp_path / "missing.jsonl", char_tokenizer(), "messages", 0, "skip")


def test_held_out_demonstrations_are_a_seeded_fifth_at_most():
    demos = list(range(10))
    train, held = split_held_out(demos, 64, seed=3)
    assert len(held) == 2 and sorted(train + held) == demos
    assert split_held_out(demos, 64, seed=3) == (train, held)
    assert split_held_out(demos, 0, seed=3) == (demos, [])


def test_the_calculator_demonstrations_solve_each_problem_with_one_call_per_step():
    """Every call is valid for the calculator and returns the worked line's value; the last turn is the answer."""
    from grpoplus.envs.tools import calculator, parse_calls
    from grpoplus.sft.builtin import builtin_rows
    from grpoplus.sft.demos import assistant_text
    from grpoplus.tasks import get_task

    examples = get_task("wordproblems", seed=0).split("train")[:50]
    for example, row in zip(examples, builtin_rows("wordproblems-calculator", "wordproblems", examples)):
        msgs = row["messages"]
        steps = example.fields["solution"].splitlines()
        assert [m["role"] for m in msgs] == ["user"] + ["assistant", "tool"] * len(steps) + ["assistant"]
        for line, call, result in zip(steps, msgs[1::2], msgs[2::2]):
            (name, arguments), = parse_calls(assistant_text(call))
            assert name == "calculator" and calculator(**arguments) == result["content"] == line.rsplit("= ", 1)[1]
        assert msgs[-1]["content"] == f"#### {example.answer}"
    with pytest.raises(ValueError, match="--task wordproblems"):
        builtin_rows("wordproblems-calculator", "arithmetic", examples)


def test_tools_are_checked_by_the_function_calling_reader():
    from grpoplus.sft.demos import row_tools

    assert row_tools({"tools": json.dumps([CALC])}, "row 1") == [CALC]
    with pytest.raises(DemoError, match="^row 2: tool 1 has no name"):
        row_tools({"tools": [{"description": "x"}]}, "row 2")
