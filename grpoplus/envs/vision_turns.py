"""A vision-language policy's trajectories: the prompt and every observation through the model's processor.

A vision-language policy reads images where its text holds their placeholders, so its trajectories are encoded by
its processor (:mod:`grpoplus.models.vision`): the opening (the environment's first messages, or a data row's prompt
with its images) and each observation, rendered by the processor's chat template as the text model's are by its
tokenizer's (:mod:`grpoplus.envs.render`), each image placeholder expanded into the image's tokens. An observation
shows images as parts of a message's content: ``{"type": "image", "image": source}`` (a path, bytes, a ``datasets``
Image value or a ``PIL.Image``, as a data row's images: :mod:`grpoplus.data.images`).

Every piece keeps the processor's outputs beside its ids (per-token values such as Qwen's ``mm_token_type_ids``, the
pixels of its images): each turn's engine call takes those of the context so far, and the trajectory carries those
of its prompt and its response (``VisionInputs.response_tokens``, and every image in order), so that the learner
forwards the whole trajectory with the images the engine saw. Sampled tokens carry zeros; they are never an
image's (a sampled placeholder ends its row in the engine).
"""

from __future__ import annotations

from grpoplus.data.chat import with_tools
from grpoplus.data.images import image_sources, load_image
from grpoplus.envs.render import image_parts, messages, roles_known, suffix_after
from grpoplus.models.vision import VisionInputs, encode_text, joined_inputs

_PROBE = [{"role": "user", "content": [{"type": "text", "text": "x"}]},
          {"role": "assistant", "content": [{"type": "text", "text": "y"}]}]
"""The two-message conversation after which an observation's text is rendered (contents as parts: some
processors' templates read only those)."""


def template_messages(msgs: list[dict]) -> list[dict]:
    """The messages as a processor's template reads them: contents as lists of parts, an image part without its
    source (the template writes its placeholder; the processor takes the pixels)."""
    out = []
    for m in msgs:
        content = m["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else \
            [{"type": "image"} if p.get("type") == "image" else p for p in content]
        out.append(dict(m, content=parts))
    return out


def loaded_images(obs) -> list:
    """The images an observation (or messages) shows, decoded; ``ValueError`` (one line) for one that does not."""
    sources = image_parts(obs)
    return [load_image(source) for source in image_sources(sources)] if sources else []


def vision_opening(processor, opening: list[dict], tools: list[dict] | None) -> tuple[list[int], VisionInputs]:
    """A trajectory's prompt from its opening messages (with their images): the processor's template with the
    generation prompt, ``tools`` as the text model's prompt takes them."""
    msgs, tools = with_tools(processor, opening, tools)
    text = processor.apply_chat_template(template_messages(roles_known(processor, msgs)), tools=tools, tokenize=False,
                                         add_generation_prompt=True)
    ids, shown = encode_text(processor, text, loaded_images(opening), "the environment's opening")
    return ids.tolist(), shown


def row_opening(prompt: str | list[dict], sources: tuple) -> list[dict]:
    """A data row's prompt with its images as the opening messages: a text becomes one user message showing the
    images, then the text (as a single-turn prompt shows them, :func:`grpoplus.data.images.image_messages`); chat
    messages keep their own ``{"type": "image"}`` entries, which take the row's images in order."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": [{"type": "image", "image": s} for s in sources]
                 + [{"type": "text", "text": prompt}]}]
    left = iter(sources)
    return [dict(m, content=[dict(p, image=next(left, None)) if p.get("type") == "image" and "image" not in p else p
                             for p in m["content"]]) if isinstance(m.get("content"), list) else dict(m)
            for m in prompt]


def vision_row_prompt(processor, prompt: str, sources: tuple) -> tuple[list[int], VisionInputs]:
    """A trajectory's prompt from a data row whose prompt is chat-template text showing its images already."""
    ids, shown = encode_text(processor, prompt, [load_image(s) for s in sources], "the row's prompt")
    return ids.tolist(), shown


def vision_observation(processor, obs) -> tuple[list[int], VisionInputs]:
    """An observation's ids and processor outputs, appended after a finished turn: what the processor's template
    writes for its messages after an assistant turn, through the next generation prompt."""
    msgs = template_messages(roles_known(processor, messages(obs)))
    if not msgs:
        return [], None
    text = suffix_after(processor, msgs, _PROBE)
    ids, shown = encode_text(processor, text, loaded_images(obs), "an observation", continuation=True)
    return ids.tolist(), shown


def context_inputs(episode) -> VisionInputs:
    """The processor outputs of an episode's ids so far (:meth:`grpoplus.envs.episodes.Episode.context`): its
    prompt's, zeros over the sampled tokens, each observation's."""
    tokens, images = joined_inputs(_pieces(episode))
    return VisionInputs(tokens=tokens, images=images)


def trajectory_inputs(episode) -> VisionInputs:
    """What a finished trajectory's row carries (``Rollouts.vision``): per-token values over the prompt and over the
    response, every image in order."""
    pieces = _pieces(episode)
    tokens, images = joined_inputs(pieces)
    prompt = len(episode.prompt)
    return VisionInputs(tokens={k: v[:prompt] for k, v in tokens.items()}, images=images,
                        response_tokens={k: v[prompt:] for k, v in tokens.items() if v[prompt:].any()})


def _pieces(episode) -> list[tuple[int, VisionInputs | None]]:
    pieces = [(len(episode.prompt), episode.vision)]
    for turn in episode.turns:
        pieces += [(len(turn.sampled), None), (len(turn.observation), turn.shown)]
    return pieces


def shows_images(obs) -> bool:
    """Whether an observation shows an image."""
    return bool(image_parts(obs))
