"""Demonstrations: chat rows (or prompt/completion rows) read, checked and rendered as the policy's token ids.

A demonstration is rendered exactly as a rollout of the same conversation would be, so that what supervised
training teaches is what sampling later reproduces (:mod:`grpoplus.envs.render`):

- the messages before the first assistant turn are the prompt (``first_prompt_ids``: the chat template with its
  generation prompt, the row's ``tools`` through the template when it takes them, else stated in a system message);
- each assistant turn is its text (its ``tool_calls`` written in the stated call format,
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) followed by the end-of-sequence token: the tokens
  the policy would sample. These carry the loss;
- the messages between two assistant turns (tool results, user turns) are an observation (``observation_ids``):
  attended to, never trained on, like a multi-turn rollout's environment tokens.

Accepted rows: ``{"messages": [...], "tools": [...]?}`` (roles system, user, assistant, tool; an assistant turn
may carry ``tool_calls`` in the OpenAI layout) and ``{"prompt": str, "completion": str}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

ROLES = ("system", "user", "assistant", "tool")


class DemoError(ValueError):
    """A demonstration that cannot be used; the message names the row and the fix."""


@dataclass(frozen=True)
class Demo:
    """One rendered demonstration: ``prompt`` ids, then ``response`` ids of which ``trained`` (0/1) carry loss."""

    prompt: tuple[int, ...]
    response: tuple[int, ...]
    trained: tuple[int, ...]
    vision: object = None  # a vision-language policy's prompt images (grpoplus.models.vision.VisionInputs)

    @property
    def tokens(self) -> int:
        return len(self.prompt) + len(self.response)


def checked_messages(row: dict, where: str, messages_field: str = "messages") -> list[dict]:
    """The row's messages, checked: a list of role/content dicts with a known role and at least one assistant turn
    after the prompt; a ``prompt``/``completion`` row becomes a user and an assistant message."""
    if not isinstance(row, dict):
        raise DemoError(f"{where}: a demonstration must be a JSON object, got {type(row).__name__}")
    if messages_field not in row:
        if isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str):
            return [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["completion"]}]
        raise DemoError(f"{where}: no {messages_field!r} list and no prompt/completion strings (keys: "
                        f"{', '.join(sorted(row)) or 'none'}); set sft.messages_field to the column that holds the chat")
    msgs = row[messages_field]
    if not isinstance(msgs, list) or not msgs:
        raise DemoError(f"{where}: {messages_field!r} must be a non-empty list of messages")
    for i, m in enumerate(msgs):
        _check_message(m, f"{where}, message {i}")
    first = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), None)
    if first is None:
        raise DemoError(f"{where}: no assistant turn: a demonstration needs at least one message with role "
                        "'assistant' (the text the model learns to write)")
    if first == 0:
        raise DemoError(f"{where}: the conversation opens with the assistant: put the prompt (a system or user "
                        "message) before the first assistant turn")
    return msgs


def _check_message(m, where: str) -> None:
    if not isinstance(m, dict) or "role" not in m:
        raise DemoError(f"{where}: a message must be an object with a 'role' and a 'content'")
    if m["role"] not in ROLES:
        raise DemoError(f"{where}: unknown role {m['role']!r}; roles: {', '.join(ROLES)}")
    content = m.get("content")
    if content is not None and not isinstance(content, str):
        raise DemoError(f"{where}: content must be a string (got {type(content).__name__})")
    if m["role"] == "assistant":
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list):
            raise DemoError(f"{where}: tool_calls must be a list")
        for k, call in enumerate(calls):
            call_text(call, f"{where}, tool call {k}")
        if not content and not calls:
            raise DemoError(f"{where}: an assistant turn with neither content nor tool_calls")


def call_text(call, where: str = "tool call") -> str:
    """A tool call (OpenAI ``{"type": "function", "function": {"name", "arguments"}}`` or ``{"name", "arguments"}``;
    arguments an object or a JSON string of one) in the stated call format."""
    body = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        raise DemoError(f"{where}: a tool call needs a function name ({{'name': ..., 'arguments': {{...}}}})")
    arguments = body.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as err:
            raise DemoError(f"{where}: the arguments of {body['name']!r} are not valid JSON ({err.msg}); write them "
                            "as a JSON object") from None
    if not isinstance(arguments, dict):
        raise DemoError(f"{where}: the arguments of {body['name']!r} must be a JSON object")
    return "<tool_call>" + json.dumps({"name": body["name"], "arguments": arguments}) + "</tool_call>"


def assistant_text(m: dict) -> str:
    """What the policy writes for an assistant message: its content, then its tool calls in the stated format."""
    parts = [m.get("content") or ""] + [call_text(c) for c in m.get("tool_calls") or []]
    return "".join(p for p in parts if p)


def render(tokenizer, msgs: list[dict], tools: list[dict] | None = None, max_length: int = 0) -> Demo:
    """The demonstration's ids as a rollout of it would hold them (module docstring); ``max_length`` > 0 cuts the
    response so that prompt and response hold at most that many tokens."""
    from grpoplus.envs.render import first_prompt_ids

    first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    turns: list[tuple[str, list[dict] | None]] = []
    for m in msgs[first:]:
        if m["role"] == "assistant":
            turns.append((assistant_text(m), None))
        else:  # tool results and user turns after an assistant turn: that turn's observation
            text, seen = turns[-1]
            turns[-1] = (text, (seen or []) + [{"role": m["role"], "content": m.get("content") or ""}])
    if turns[-1][1] is not None:  # what follows the last assistant turn is never seen by the policy
        turns[-1] = (turns[-1][0], None)
    return turns_demo(tokenizer, first_prompt_ids(tokenizer, [dict(m) for m in msgs[:first]], tools), turns,
                      max_length)


def turns_demo(tokenizer, prompt: list[int], turns: list[tuple[str, object]], max_length: int = 0) -> Demo:
    """A demonstration from prompt ids and its turns: ``(text the policy writes, the observation that follows it or
    None)``; each text is followed by the end-of-sequence token (trained on), each observation by its ids as an
    episode appends them (not trained on)."""
    from grpoplus.envs.render import observation_ids

    response, trained = [], []
    for text, seen in turns:
        turn = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        obs = observation_ids(tokenizer, seen) if seen is not None else []
        response += turn + obs
        trained += [1] * len(turn) + [0] * len(obs)
    if max_length:
        keep = max(0, max_length - len(prompt))
        response, trained = response[:keep], trained[:keep]
    return Demo(tuple(prompt), tuple(response), tuple(trained))


def row_tools(row: dict, where: str) -> list[dict] | None:
    """The row's ``tools`` (JSON schemas, or JSON text of them) as given, checked by the function-calling rows' own
    reader (:func:`grpoplus.rewards.tool_schemas.read_tools`); None when it has none."""
    from grpoplus.rewards.tool_schemas import read_tools

    tools = row.get("tools") if isinstance(row, dict) else None
    if tools is None:
        return None
    try:
        read_tools(tools)
    except ValueError as err:
        raise DemoError(f"{where}: {err}") from None
    return json.loads(tools) if isinstance(tools, str) else tools
