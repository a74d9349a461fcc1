"""Chat template application."""

from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from grpoplus.data import apply_chat_template

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _tokenizer(chat_template):
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    tok.chat_template = chat_template
    return tok


def test_template_applied_with_generation_prompt_and_system():
    text = apply_chat_template(_tokenizer(TEMPLATE), "2+2?", system="Be brief.")
    assert text == "<|system|>Be brief.\n<|user|>2+2?\n<|assistant|>"


def test_no_template_returns_the_prompt_unchanged():
    assert apply_chat_template(_tokenizer(None), "2+2?") == "2+2?"


def test_a_system_text_goes_before_a_system_message_of_parts():
    # a vision-language policy's messages hold their content as parts: the tools' description is a text part first
    from grpoplus.data.chat import with_system

    parts = [{"type": "text", "text": "Look closely."}]
    (system, user) = with_system([{"role": "system", "content": parts}, {"role": "user", "content": "hi"}], "Tools: x.")
    assert system == {"role": "system", "content": [{"type": "text", "text": "Tools: x.\n\n"}, *parts]}
    assert with_system([{"role": "system", "content": "Be brief."}], "Tools: x.")[0]["content"] == "Tools: x.\n\nBe brief."
