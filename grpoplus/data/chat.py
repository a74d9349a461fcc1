"""Prompt formatting with the model's chat template, tool schemas included."""

from __future__ import annotations

from grpoplus.rewards.tool_calls import tools_system_text


def apply_chat_template(tokenizer, prompt: str | list[dict], system: str | None = None,
                        tools: list[dict] | None = None) -> str:
    """The prompt as the model expects it: its chat template with the generation prompt appended, or the prompt
    unchanged when the tokenizer has no template (a base model). ``prompt``: the user's text or a list of chat
    messages (without a template: their texts, a blank line apart). ``tools`` (JSON schemas): rendered by the
    template when it takes them, else described in the system message with the call format stated
    (:func:`with_tools`); a model without a template reads that description above the prompt.

    >>> class Plain:  # a tokenizer without a chat template
    ...     chat_template = None
    >>> apply_chat_template(Plain(), "2+2?")
    '2+2?'
    """
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if getattr(tokenizer, "chat_template", None) is None:
        if any(isinstance(m["content"], list) for m in messages):
            raise ValueError("a prompt with images needs the model's chat template (its processor's or its "
                             "tokenizer's) to place their placeholders; this model has none")
        text = "\n\n".join(m["content"] for m in messages)
        return f"{tools_system_text(tools)}\n\n{text}" if tools else text
    messages, tools = with_tools(tokenizer, with_system(messages, system) if system else messages, tools)
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)


def with_tools(tokenizer, messages: list[dict], tools: list[dict] | None) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools to pass the template): the tools stay with a template that takes them, else they are
    described in a system message that states the call format and the template gets none."""
    if not tools or takes_tools(tokenizer):
        return messages, tools
    return with_system(messages, tools_system_text(tools)), None


def with_system(messages: list[dict], text: str) -> list[dict]:
    """``text`` as the system message (before an existing one's content)."""
    if messages and messages[0]["role"] == "system":
        content = messages[0]["content"]  # text, or a list of parts (a vision-language policy's messages)
        content = [{"type": "text", "text": text + "\n\n"}, *content] if isinstance(content, list) else \
            text + "\n\n" + content
        return [dict(messages[0], content=content)] + messages[1:]
    return [{"role": "system", "content": text}] + messages


def takes_tools(tokenizer) -> bool:
    """The chat template renders a ``tools`` argument (transformers' tool-use templates)."""
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")
