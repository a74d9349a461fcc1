"""Prompt lengths against the model's context: every single-turn prompt, measured once as the engine encodes it (its
text through the tokenizer, special tokens added), must leave ``rollout.max_new_tokens`` positions for the response.

- :func:`model_context`: the positions a model's config says it takes (None when it names none);
- :func:`prompt_limit`: the rule that fixes the longest prompt (``data.max_prompt_tokens``, else the context minus
  ``rollout.max_new_tokens``) and refuses a limit that leaves the response no room;
- :func:`fit_prompts`: what ``data.long_prompts`` does with the prompts past it: ``refuse`` (one line naming how
  many, the longest and the keys to change), ``drop`` or ``truncate_left`` (counted).

Multi-turn runs (``data.env`` / ``data.tools``) are not measured here: their episodes render the opening messages
themselves and cap each turn's response to the room the context has left (:mod:`grpoplus.envs.episodes`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

LONG_PROMPTS = ("refuse", "truncate_left", "drop")
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
"""A model config's names for the positions it takes, in the order they are looked for."""
RECUTS = 8
"""Times a left cut is retried one token shorter when its text re-encodes longer than the limit."""
KEYS_HINT = ("raise data.max_prompt_tokens (or lower rollout.max_new_tokens), or set "
             "data.long_prompts=truncate_left|drop")


@dataclass(frozen=True)
class Limit:
    """The longest prompt, in tokens, and where that number comes from (shown in a refusal)."""

    tokens: int
    source: str


@dataclass(frozen=True)
class PromptFit:
    """The prompts that fit the limit, and how many were dropped or cut to fit it."""

    train: list
    test: list
    dropped: int = 0
    truncated: int = 0

    def metrics(self) -> dict[str, float]:
        return {"data/prompts_dropped": float(self.dropped), "data/prompts_truncated": float(self.truncated)}

    def note(self, limit: Limit) -> str | None:
        """One line for stderr when a prompt was dropped or cut, else None."""
        if not (self.dropped or self.truncated):
            return None
        if self.dropped:
            return f"note: dropped {self.dropped} prompts longer than {limit.tokens} tokens ({limit.source})"
        return f"note: cut {self.truncated} prompts to their last {limit.tokens} tokens ({limit.source})"


def model_context(config) -> int | None:
    """The positions ``config`` (a model's ``config``) takes, or None when it names none."""
    for name in CONTEXT_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def prompt_limit(context: int | None, max_new_tokens: int, max_prompt_tokens: int | None) -> Limit | None:
    """The rule: ``max_prompt_tokens`` when given (refused when it and ``max_new_tokens`` overflow ``context``), else
    ``context - max_new_tokens`` (refused when that leaves no room); None with neither a limit nor a context."""
    if max_prompt_tokens is not None:
        if context is not None and max_prompt_tokens + max_new_tokens > context:
            raise ValueError(f"data.max_prompt_tokens={max_prompt_tokens} + rollout.max_new_tokens={max_new_tokens} "
                             f"= {max_prompt_tokens + max_new_tokens} is past the model's context of {context} "
                             "positions: lower one of them")
        return Limit(max_prompt_tokens, f"data.max_prompt_tokens={max_prompt_tokens}")
    if context is None:
        return None
    if context - max_new_tokens < 1:
        raise ValueError(f"rollout.max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's context "
                         f"of {context} positions: lower it")
    return Limit(context - max_new_tokens, f"the model's {context} positions - rollout.max_new_tokens={max_new_tokens}")


def fit_prompts(train: Sequence, test: Sequence, tokenizer, limit: Limit | None, policy: str,
                count_images: Callable[[tuple], int] | None = None) -> PromptFit:
    """The examples (objects with a ``prompt`` and an ``origin``, and ``images`` counted by ``count_images``) whose
    prompt fits ``limit``, per ``policy`` (one of :data:`LONG_PROMPTS`); a prompt neither text nor token ids is not
    measured."""
    if policy not in LONG_PROMPTS:
        raise ValueError(f"data.long_prompts must be one of {', '.join(LONG_PROMPTS)}, got {policy!r}")
    if limit is None:
        return PromptFit(list(train), list(test))
    parts = (("training", train), ("held-out", test))
    sizes = {name: prompt_tokens(tokenizer, [ex.prompt for ex in part], [getattr(ex, "images", ()) for ex in part],
                                 count_images) for name, part in parts}
    long = [(n, name, i) for name, _ in parts for i, n in enumerate(sizes[name]) if n > limit.tokens]
    if not long:
        return PromptFit(list(train), list(test))
    if policy == "refuse":
        raise ValueError(_refusal(long, limit, train, test, len(train) + len(test)))
    if policy == "drop":
        kept = [[ex for ex, n in zip(part, sizes[name]) if n <= limit.tokens] for name, part in parts]
        _check_left(kept, train, test, limit)
        return PromptFit(kept[0], kept[1], dropped=len(long))
    cut = [[ex if n <= limit.tokens else cut_left(tokenizer, ex, limit.tokens) for ex, n in zip(part, sizes[name])]
           for name, part in parts]
    return PromptFit(cut[0], cut[1], truncated=len(long))


def prompt_tokens(tokenizer, prompts: list, images: list | None = None,
                  count_images: Callable[[tuple], int] | None = None) -> list[int]:
    """Each prompt's length as the engine encodes it: text with the tokenizer's special tokens added, token ids as
    they are; 0 for anything else (not measured). ``images``: each prompt's image sources, and ``count_images`` the
    tokens they add (a vision-language model's: :func:`grpoplus.models.vision.image_counter`; None: none)."""
    texts = [i for i, p in enumerate(prompts) if isinstance(p, str)]
    sizes = [len(p) if _is_ids(p) else 0 for p in prompts]
    if texts:
        for i, ids in zip(texts, tokenizer([prompts[i] for i in texts])["input_ids"]):
            sizes[i] = len(ids)
    if count_images is not None and images is not None:
        sizes = [n + (count_images(shown) if shown else 0) for n, shown in zip(sizes, images)]
    return sizes


def cut_left(tokenizer, example, tokens: int):
    """``example`` with only the last ``tokens`` tokens of its prompt. Text is cut on its ids and decoded back; the
    re-encoding is checked (a cut text may merge into other tokens), and a cut that still re-encodes longer is made
    one token shorter, up to :data:`RECUTS` times."""
    prompt = example.prompt
    if getattr(example, "images", ()):
        raise ValueError(f"{_where(example, 'a prompt')}: a prompt with images is not cut (its image tokens would be "
                         "cut apart); set data.long_prompts=drop, or raise data.max_prompt_tokens")
    if _is_ids(prompt):
        return dataclasses.replace(example, prompt=list(prompt)[-tokens:])
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    added = len(tokenizer(prompt)["input_ids"]) - len(ids)  # the special tokens the engine's encoding adds
    for keep in range(tokens - added, max(tokens - added - RECUTS, 0), -1):
        text = tokenizer.decode(ids[-keep:])
        if len(tokenizer(text)["input_ids"]) <= tokens:
            return dataclasses.replace(example, prompt=text)
    raise ValueError(f"{_where(example, 'a prompt')}: its last {tokens} tokens re-encode longer than {tokens} "
                     "tokens; set data.long_prompts=drop, or raise data.max_prompt_tokens")


def _refusal(long: list, limit: Limit, train: Sequence, test: Sequence, total: int) -> str:
    n, name, i = max(long)
    example = (train if name == "training" else test)[i]
    return (f"{len(long)} of {total} prompts are longer than {limit.tokens} tokens ({limit.source}); the longest, "
            f"{_where(example, f'{name} prompt {i + 1}')}, has {n}: {KEYS_HINT}")


def _check_left(kept: list, train: Sequence, test: Sequence, limit: Limit) -> None:
    for part, whole, name in ((kept[0], train, "training"), (kept[1], test, "held-out")):
        if whole and not part:
            raise ValueError(f"data.long_prompts=drop dropped every {name} prompt: all are longer than "
                             f"{limit.tokens} tokens ({limit.source}); raise data.max_prompt_tokens (or lower "
                             "rollout.max_new_tokens), or set data.long_prompts=truncate_left")


def _where(example, fallback: str) -> str:
    return getattr(example, "origin", "") or fallback


def _is_ids(prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt) and bool(prompt)
