"""Observations as token ids, appended after the ids the policy sampled (never re-tokenizing those).

- A tokenizer with a chat template: the observation is rendered as the template's next turn(s), a *suffix* —
  what the template writes after an assistant message's end token, up to and including the generation prompt
  of the next assistant turn. The suffix is found by rendering a two-message conversation with and without the
  observation, so it is exactly what the template would have written there. A string is a ``user`` message; a
  message dict keeps its role (``tool`` for tool results; a template that refuses the tool role gets it as ``user``).
- The built-in character tokenizer (no template): the simple markup ``=> {text}\\n`` after the turn's ``<eos>``.

The first observation (``reset``'s), when there is one, is the prompt itself: a chat model gets it as the
conversation's first user message with the generation prompt; the character model gets its text.
"""

from __future__ import annotations

from functools import lru_cache

from grpoplus.data.chat import with_tools
from grpoplus.envs.base import Observation

CHAR_MARKUP = "=> {text}\n"
"""How the character model's transcripts show an observation."""

_PROBE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]


def messages(obs: Observation) -> list[dict]:
    """The observation as chat messages (a string is a user message; None is no message)."""
    items = obs if isinstance(obs, list) else [obs]
    return [{"role": "user", "content": item} if isinstance(item, str) else dict(item) for item in items
            if item is not None]


def text_of(obs: Observation) -> str:
    """The observation's text (several messages joined by newlines; a message's text parts joined)."""
    return "\n".join(content_text(m["content"]) for m in messages(obs))


def content_text(content: str | list) -> str:
    """A message content's text: itself, or its text parts joined (its image parts have none)."""
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content if part.get("type") == "text")


def image_parts(obs: Observation) -> list:
    """The image sources an observation shows (``{"type": "image", "image": source}`` parts), in order."""
    return [part.get("image") for m in messages(obs) if isinstance(m.get("content"), list)
            for part in m["content"] if part.get("type") == "image"]


def is_tool_result(obs: Observation) -> bool:
    """True when every message of the observation is a tool's result (role ``tool``): a trace marks its tokens
    apart from an environment's."""
    msgs = messages(obs)
    return bool(msgs) and all(m.get("role") == "tool" for m in msgs)


def has_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def observation_ids(tokenizer, obs: Observation) -> list[int]:
    """Ids to append after a finished model turn (see the module docstring); empty for no observation."""
    msgs = messages(obs)
    if not msgs:
        return []
    if not has_template(tokenizer):
        return tokenizer(CHAR_MARKUP.format(text=text_of(obs)), add_special_tokens=False)["input_ids"]
    return tokenizer(chat_suffix(tokenizer, tuple((m["role"], content_text(m["content"])) for m in msgs)),
                     add_special_tokens=False)["input_ids"]


def first_prompt_ids(tokenizer, obs: Observation, tools: list[dict] | None = None) -> list[int] | None:
    """The prompt's ids from a first observation (None: there is none). A chat model gets it as the conversation's
    opening messages with the generation prompt; ``tools`` (JSON schemas) go through the template when it takes
    them, else into a system message that states the call format."""
    msgs = messages(obs)
    if not msgs:
        return None
    msgs, tools = with_tools(tokenizer, msgs, tools)
    if not has_template(tokenizer):
        return tokenizer(text_of(msgs))["input_ids"]
    text = tokenizer.apply_chat_template(roles_known(tokenizer, msgs), tools=tools, tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


_HOLE = "\x00grpoplus-observation-{}\x00"


@lru_cache(maxsize=64)
def _suffix_form(tokenizer, roles: tuple[str, ...]) -> str:
    """The suffix for messages of these roles, with a hole ``_HOLE.format(k)`` where message k's content goes."""
    return _render_suffix(tokenizer, [(r, _HOLE.format(k)) for k, r in enumerate(roles)])


def _render_suffix(tokenizer, msgs) -> str:
    return suffix_after(tokenizer, roles_known(tokenizer, [{"role": r, "content": c} for r, c in msgs]), _PROBE)


def suffix_after(owner, full: list[dict], probe: list[dict]) -> str:
    """What ``owner``'s chat template (a tokenizer's or a processor's) writes for the messages ``full`` after the
    end of the ``probe`` conversation's assistant turn (whose text ends in ``y``)."""
    base = owner.apply_chat_template(probe, tokenize=False)
    extended = owner.apply_chat_template(probe + full, tokenize=False, add_generation_prompt=True)
    end = base.rindex("y") + 1
    if not extended.startswith(base[:end]):
        raise ValueError("the tokenizer's chat template rewrites earlier turns when one is added, so an observation "
                         "cannot be appended as ids: use a template that only appends")
    eos = getattr(owner, "eos_token", None) or getattr(getattr(owner, "tokenizer", None), "eos_token", None) or ""
    if eos and base.startswith(eos, end):  # the model samples its end token itself: the suffix starts after it
        end += len(eos)
    return extended[end:]


def chat_suffix(tokenizer, msgs: tuple) -> str:
    """The text the chat template writes after an assistant turn's end token for these ``(role, content)``
    messages, through the next assistant turn's generation prompt."""
    form = _suffix_form(tokenizer, tuple(r for r, _ in msgs))
    if all(form.count(_HOLE.format(k)) == 1 for k in range(len(msgs))):
        for k, (_, content) in enumerate(msgs):
            form = form.replace(_HOLE.format(k), content)
        return form
    return _render_suffix(tokenizer, msgs)  # a template that edits the content it writes


def roles_known(tokenizer, msgs: list[dict]) -> list[dict]:
    """``tool`` messages as ``user`` ones for a template that refuses the tool role."""
    if not any(m["role"] == "tool" for m in msgs) or _renders_tool_role(tokenizer):
        return msgs
    return [dict(m, role="user") if m["role"] == "tool" else m for m in msgs]


@lru_cache(maxsize=16)
def _renders_tool_role(tokenizer) -> bool:
    try:
        tokenizer.apply_chat_template(_PROBE + [{"role": "tool", "content": "z"}], tokenize=False)
    except Exception:  # noqa: BLE001 - templates refuse an unknown role by raising (jinja's raise_exception)
        return False
    return True
