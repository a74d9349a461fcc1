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


def _episode(tok, said_text: str, sampled_text: str):
    from grpoplus.envs.episodes import Episode
    from grpoplus.envs.trajectory import Turn

    opening = [{"role": "user", "content": "guess"}]
    sampled = tok(sampled_text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    e = Episode(None, first_prompt_ids(tok, opening), opening=opening)
    e.turns = [Turn(sampled, [0.0] * len(sampled), observation_ids(tok, said_text)), Turn(sampled, [0.0] * len(sampled))]
    e.said = [said_text]
    return e


def test_retokenize_drift_is_what_re_rendering_the_conversation_would_change(chat_tok):
    from grpoplus.envs.drift import drifted

    assert not drifted(chat_tok, _episode(chat_tok, "lower", " 8 "))  # an appending template: the same ids
    trimming = char_tokenizer()
    trimming.chat_template = CHATML.replace("{{ m['content'] }}", "{{ m['content'] | trim }}")
    assert not drifted(trimming, _episode(trimming, "lower", "8"))
    assert drifted(trimming, _episode(trimming, "lower", " 8 "))  # re-rendering would drop the sampled spaces
    plain = char_tokenizer()  # no template: the text tokenized again (exact for the character tokenizer)
    e = _episode(plain, "lower", "8")
    assert not drifted(plain, e)
