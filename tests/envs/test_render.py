"""Observations as ids: with a chat template, the suffix the template itself writes after the assistant's end
token, so appending ids gives exactly the ids of the re-rendered conversation (no drift); for the character model,
the stated markup."""

import pytest

from grpoplus.envs.render import CHAR_MARKUP, first_prompt_ids, observation_ids
from grpoplus.models.tokenizer import char_tokenizer

CHATML = ("{% for m in messages %}<bos>{{ m['role'] }}\n{{ m['content'] }}<eos>\n{% endfor %}"
          "{% if add_generation_prompt %}<bos>assistant\n{% endif %}")


@pytest.fixture
def chat_tok():
    tok = char_tokenizer()
    tok.chat_template = CHATML
    return tok


def _ids(tok, messages, generation=True):
    return tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation),
               add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("observation", ["lower", {"role": "tool", "content": "=42"},
                                         [{"role": "tool", "content": "7"}, {"role": "user", "content": "go on"}]])
def test_appended_ids_equal_the_re_rendered_conversation(chat_tok, observation):
    tok = chat_tok
    prompt = first_prompt_ids(tok, "guess a number")
    assert prompt == _ids(tok, [{"role": "user", "content": "guess a number"}])
    sampled = tok("8", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]  # the engine stops at <eos>
    appended = prompt + sampled + observation_ids(tok, observation)
    items = observation if isinstance(observation, list) else [observation]
    followed = [{"role": "user", "content": o} if isinstance(o, str) else o for o in items]
    rendered = _ids(tok, [{"role": "user", "content": "guess a number"}, {"role": "assistant", "content": "8"}]
                    + followed)
    assert appended == rendered


def test_a_template_that_refuses_the_tool_role_gets_tool_results_as_user_turns():
    tok = char_tokenizer()
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool role') }}"
                         "{% endif %}{% endfor %}" + CHATML)
    ids = observation_ids(tok, {"role": "tool", "content": "3"})
    assert "user\n3" in tok.decode(ids, skip_special_tokens=True)


def test_the_character_model_reads_the_markup():
    tok = char_tokenizer()
    assert tok.decode(observation_ids(tok, ["a", "b"])) == CHAR_MARKUP.format(text="a\nb")
    assert first_prompt_ids(tok, None) is None and first_prompt_ids(tok, "go") == tok("go")["input_ids"]
