"""Prompt formatting with the model's chat template."""

from __future__ import annotations


def apply_chat_template(tokenizer, prompt: str, system: str | None = None) -> str:
    """The prompt as the model expects it: its chat template with the generation prompt
    appended, or the prompt unchanged when the tokenizer has no template (a base model).

    >>> class Plain:  # a tokenizer without a chat template
    ...     chat_template = None
    >>> apply_chat_template(Plain(), "2+2?")
    '2+2?'
    """
    if getattr(tokenizer, "chat_template", None) is None:
        return prompt
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
