"""What a vision-language policy needs beyond a text one: its processor's outputs carried with each row, and the
positions and inputs of a forward over rows with images.

A prompt with images is encoded by the model's processor, which expands each image placeholder of the chat template
into the image's tokens and returns the pixels (and, per family, what else the model reads). Those outputs travel
with every row sampled from the prompt (:class:`VisionInputs`), so that the learner, the reference and the teacher
see exactly what the engine saw. Two kinds:

- per token, over the prompt's real tokens: Qwen's ``mm_token_type_ids`` (which tokens are an image's: its
  multimodal rotary positions), Gemma 3's ``token_type_ids`` (its image tokens attend to each other both ways).
  A forward places them under the prompt's columns and zeros under the response's;
- per image: ``pixel_values`` and the family's own (Qwen's ``image_grid_thw``, Idefics3's
  ``pixel_attention_mask``), concatenated over a forward's rows.

Positions: Qwen's families rotate by three positions per token (time, height, width of an image's tokens; equal for
text), computed by the model's own ``get_rope_index`` (:func:`vision_positions`); the others count real tokens, as
for text. A decode step after the prompt needs the text position only (the three are equal there).
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass, field

import torch

PER_TOKEN = ("mm_token_type_ids", "token_type_ids")
"""Processor outputs with a value per prompt token."""
TEXT_KEYS = ("input_ids", "attention_mask")


@dataclass(frozen=True)
class VisionInputs:
    """One prompt's processor outputs beyond its token ids (shared by the rows sampled from it).

    ``tokens``: name -> [p] over the prompt's p real tokens; ``images``: name -> the processor's tensor for the
    row's images (dim 0 runs over images or patches, or, Idefics3's, is the prompt's one row): the prompt's, then
    those a multi-turn environment showed in its observations; ``response_tokens``: name -> [r] over the first r
    columns of the response (a multi-turn row's: zeros on sampled tokens, the processor's values on an observation's
    image tokens; empty: zeros)."""

    tokens: dict[str, torch.Tensor] = field(default_factory=dict)
    images: dict[str, torch.Tensor] = field(default_factory=dict)
    response_tokens: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def has_images(self) -> bool:
        return bool(self.images)


VISION_PARTS = ("visual", "vision_tower", "multi_modal_projector", "vision_model", "connector")
"""Module names (dotted parts of a parameter's name) of the families' vision towers and projectors: Qwen's
``visual`` (its merger inside), Gemma 3's ``vision_tower`` and ``multi_modal_projector``, Idefics3's and SmolVLM's
``vision_model`` and ``connector``."""


def is_vision_part(name: str) -> bool:
    """Whether a parameter or module name lies in a vision tower or projector (:data:`VISION_PARTS`)."""
    return any(f".{part}." in f".{name}." for part in VISION_PARTS)


def vision_parameters(model: torch.nn.Module) -> int:
    """Parameters of a vision-language ``model``'s vision tower and projector (0 for a text model)."""
    return sum(p.numel() for name, p in model.named_parameters() if is_vision_part(name)) if is_vision_model(model) \
        else 0


def freeze_vision(model: torch.nn.Module) -> int:
    """Freeze the vision tower and projector of a vision-language ``model`` (learner.train_vision=false); the
    elements frozen (0 for a text model)."""
    if not is_vision_model(model):
        return 0
    frozen = 0
    for name, p in model.named_parameters():
        if is_vision_part(name) and p.requires_grad:
            p.requires_grad_(False)
            frozen += p.numel()
    return frozen


PROCESSOR = "grpoplus_processor"
"""The attribute of a vision-language policy's tokenizer that holds its processor (what the engine encodes with)."""


def with_processor(tokenizer, processor):
    """``tokenizer``, carrying ``processor``: wherever the run hands the tokenizer on, the engine finds it."""
    setattr(tokenizer, PROCESSOR, processor)
    return tokenizer


def processor_of(tokenizer):
    """The processor a tokenizer carries (:func:`with_processor`), or None."""
    return getattr(tokenizer, PROCESSOR, None)


def image_only(cls: type) -> type:
    """``cls`` (a processor) without its video processor: without torchvision transformers cannot check one, and
    ``video_processor=None`` is refused. The subclass has the parent's named parameters but that one (a processor
    reads its parts and saved settings from its ``__init__``'s signature)."""
    named = [p for n, p in inspect.signature(cls.__init__).parameters.items()
             if n not in ("self", "video_processor") and p.kind is p.POSITIONAL_OR_KEYWORD]
    defaults = {p.name: None if p.default is p.empty else p.default for p in named}
    source = (f"def __init__(self, {', '.join(f'{p.name}=_d[{p.name!r}]' for p in named)}, **kwargs):\n"
              f"    _cls.__init__(self, video_processor=None, {', '.join(f'{p.name}={p.name}' for p in named)}, **kwargs)\n"
              "    self.video_processor = _ns(num_frames=None, fps=None)\n")
    scope = {"_d": defaults, "_cls": cls, "_ns": types.SimpleNamespace}
    exec(source, scope)  # noqa: S102 (a signature built from the parent's: no input from outside)
    return type(cls.__name__, (cls,), {"__init__": scope["__init__"]})  # its name: what a saved dir names


def load_processor(path):
    """The processor saved in the model dir ``path``. Without torchvision transformers cannot load a video
    processor, and ``AutoProcessor`` then gives back the bare tokenizer, which would drop every image silently:
    the family's processor is loaded without it instead, and a dir with none is refused in one line."""
    import json
    from pathlib import Path

    import transformers


    path = Path(path)
    try:
        processor = transformers.AutoProcessor.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, AttributeError, TypeError):
        processor = None
    if processor is not None and hasattr(processor, "image_processor"):
        return processor
    saved = path / "processor_config.json"
    name = json.loads(saved.read_text()).get("processor_class") if saved.is_file() else None
    cls = getattr(transformers, name or "", None)
    if cls is None:
        raise ValueError(f"model dir {str(path)!r} is a vision-language model without a processor "
                         "(processor_config.json): save it next to the model with processor.save_pretrained(dir)")
    return image_only(cls).from_pretrained(path, local_files_only=True)


def check_vision_policy(task: str, model: str | None) -> None:
    """A task whose prompts show images needs a vision-language policy: the built-in ``tiny-vlm`` or a model dir
    whose config has a vision tower's (read without loading); one line otherwise."""
    import json
    from pathlib import Path

    from grpoplus.models.load import TINY_VISION, is_builtin

    if model == TINY_VISION:
        return
    config = Path(model).expanduser() / "config.json" if model is not None and not is_builtin(model) else None
    if config is not None and config.is_file():
        try:
            if "vision_config" in json.loads(config.read_text()):
                return
        except (OSError, ValueError):
            return  # the loader says what is wrong with the file
    elif config is not None:
        return  # not on disk here: the loader's check
    raise ValueError(f"task {task!r} shows images, and {model or 'the built-in tiny model'} is a text model: use a "
                     f"vision-language policy (--model {TINY_VISION}, warm-started with grpoplus sft, or an "
                     "image-text-to-text model dir)")


def vision_of(rows: list | None) -> dict:
    """A learner forward's keyword for a vision-language policy's rows (none for text rows)."""
    return {} if rows is None else {"vision": rows}


def is_vision_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or its config) is an image-text-to-text model: its config has a vision tower's."""
    config = getattr(model, "config", model)
    return getattr(config, "vision_config", None) is not None


def placeholder_ids(config) -> list[int]:
    """The ids that stand for an image's (or a video's) features: a response that sampled one could not be
    forwarded again (the model would look for its features), so the engine ends the row before it."""
    names = ("image_token_id", "image_token_index", "video_token_id")
    return sorted({v for name in names if isinstance(v := getattr(config, name, None), int)})


def encode_prompts(processor, prompts: list[str], images: list[list] | None, pad_id: int
                   ) -> tuple[torch.Tensor, torch.Tensor, list[VisionInputs]]:
    """Each prompt (chat-template text with the model's image placeholders) through ``processor`` with its images,
    alone, then left-padded: ``(input_ids [B, P], attention_mask [B, P], one VisionInputs per prompt)``."""
    ids, inputs = [], []
    for j, text in enumerate(prompts):
        piece, shown = encode_text(processor, text, list(images[j]) if images is not None and images[j] else [],
                                   f"prompt {j}")
        ids.append(piece)
        inputs.append(shown)
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for j, x in enumerate(ids):
        input_ids[j, width - len(x):], mask[j, width - len(x):] = x, 1
    return input_ids, mask, inputs


def encode_text(processor, text: str, images: list, what: str, continuation: bool = False
                ) -> tuple[torch.Tensor, VisionInputs]:
    """``text`` (with one placeholder per image) through ``processor`` with its ``images``: its ids [p] and the rest
    of the processor's outputs; ``continuation``: text that follows ids already in a row (a multi-turn observation),
    without the special tokens the tokenizer puts at the start of a text. ``what`` names it in the one-line errors."""
    marker = placeholder_text(processor)
    shown = text.count(marker) if marker else len(images)
    if shown != len(images):
        raise ValueError(f"{what}: it has {len(images)} image(s) and {shown} image placeholder(s) "
                         f"({marker}) in its text: give each image one placeholder (a chat message entry "
                         '{"type": "image"})')
    try:
        out = processor(text=[text], images=[images] if images else None, return_tensors="pt")
    except (ValueError, IndexError, TypeError, RuntimeError) as err:  # the processor's own words, on one line
        raise ValueError(f"{what}: its processor refused it with its {len(images)} image(s): "
                         f"{(str(err).strip().splitlines() or [''])[0][:200]}") from None
    start = 0
    if continuation:  # the specials a tokenizer opens every text with (a BOS): not inside a row
        opening = processor.tokenizer("")["input_ids"]
        if opening and out["input_ids"][0, :len(opening)].tolist() == opening:
            start = len(opening)
    return out["input_ids"][0, start:], VisionInputs(tokens={k: out[k][0, start:] for k in PER_TOKEN if k in out},
                                                     images={k: v for k, v in out.items() if k not in (*TEXT_KEYS, *PER_TOKEN)})


def placeholder_text(processor) -> str | None:
    """The string a chat template writes once per image, which the processor expands: Gemma 3's start-of-image
    token, else the image token (Qwen's, Idefics3's)."""
    for name in ("boi_token", "image_token"):
        for owner in (processor, getattr(processor, "tokenizer", None)):
            if isinstance(found := getattr(owner, name, None), str):
                return found
    return None


def image_tokens(processor, sources) -> int:
    """Tokens the images of a prompt add to its text's count: each image's placeholder becomes the image's tokens
    (their number set by the image's size in Qwen's and Idefics3's processors, fixed in Gemma 3's). Measured once per
    image size, by the processor on a blank image of that size; what prompt lengths are checked and estimated with
    (:func:`image_counter`), without decoding a data set's images."""
    from PIL import Image

    from grpoplus.data.images import image_size

    marker = placeholder_text(processor)
    counts = processor.__dict__.setdefault("_grpoplus_image_tokens", {})
    total = 0
    for source in sources:
        size = image_size(source)
        if size not in counts:
            alone = len(processor.tokenizer(marker)["input_ids"])
            shown = processor(text=[marker], images=[[Image.new("RGB", size)]], return_tensors="pt")
            counts[size] = shown["input_ids"].shape[1] - alone
        total += counts[size]
    return total


def image_counter(tokenizer):
    """The tokens a prompt's images add (:func:`image_tokens`) under the processor ``tokenizer`` carries; None for a
    text model's tokenizer (:func:`grpoplus.data.lengths.prompt_tokens` takes it)."""
    import functools

    processor = processor_of(tokenizer)
    return None if processor is None else functools.partial(image_tokens, processor)


def forward_inputs(rows: list[VisionInputs], prompt_mask: torch.Tensor, response_columns: int) -> dict:
    """The model's inputs beyond ids and mask for a forward over ``rows`` (one VisionInputs per row; rows of a
    prompt share it): per-token values under each row's real prompt columns (``prompt_mask`` [n, P']), zeros under
    padding and the ``response_columns`` after; per-image tensors concatenated over the rows."""
    n, width = prompt_mask.shape
    device = prompt_mask.device
    kwargs: dict[str, torch.Tensor] = {}
    for key in sorted({k for r in rows for k in (*r.tokens, *r.response_tokens)}):
        values = torch.zeros(n, width + response_columns, dtype=torch.long, device=device)
        for i, row in enumerate(rows):
            if key in row.tokens:
                values[i, :width][prompt_mask[i].bool()] = row.tokens[key].to(device)
            if key in row.response_tokens and response_columns:
                shown = row.response_tokens[key][:response_columns]
                values[i, width:width + len(shown)] = shown.to(device)
        kwargs[key] = values
    for key in sorted({k for r in rows for k in r.images}):
        kwargs[key] = _joined([r.images[key] for r in rows if key in r.images]).to(device)
    return kwargs


def _joined(parts: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """``parts`` concatenated along ``dim``; where they differ past it (Idefics3's [1, images, ...] of rows with other
    image counts), each padded with zeros (an all-zero image is its padding) to the largest."""
    if len({p.shape[dim + 1:] for p in parts}) > 1:
        size = [max(p.shape[d] for p in parts) for d in range(parts[0].dim())]
        parts = [torch.nn.functional.pad(p, [x for d in reversed(range(dim + 1, p.dim())) for x in (0, size[d] - p.shape[d])])
                 for p in parts]
    return torch.cat(parts, dim)


ROW_SHAPED_DIMS = 5
"""Idefics3's and SmolVLM's ``pixel_values`` are [rows, images, channels, height, width]: a row's images from several
processor calls join along dim 1 (with their ``pixel_attention_mask``), where the other families' join along dim 0."""


def joined_inputs(pieces: list[tuple[int, VisionInputs | None]]) -> tuple[dict, dict]:
    """One row's per-token values and images from consecutive pieces of its tokens: ``(length, inputs)``, the
    inputs' ``tokens`` over that piece's ``length`` tokens (None or a missing name: zeros). Returns ``(tokens,
    images)``: each name's values over all the pieces' tokens, and each image name's tensors joined in order."""
    shown = [v for _, v in pieces if v is not None]
    tokens = {key: torch.cat([v.tokens[key] if v is not None and key in v.tokens else torch.zeros(n, dtype=torch.long)
                              for n, v in pieces]) for key in sorted({k for v in shown for k in v.tokens})}
    row_shaped = any(v.images.get("pixel_values", torch.zeros(0)).dim() == ROW_SHAPED_DIMS for v in shown)
    images = {key: _joined([v.images[key] for v in shown if key in v.images], dim=1 if row_shaped else 0)
              for key in sorted({k for v in shown for k in v.images})}
    return tokens, images


def vision_positions(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     kwargs: dict) -> torch.Tensor:
    """Position ids of a forward over left-padded prompts (and right-padded responses): Qwen's three rows
    ([3, n, L], from the model's ``get_rope_index``) where a vision-language model has them, else real tokens
    counted ([n, L]: a text model's, the engine's and the learner's convention)."""
    base = getattr(model, "model", model)
    if is_vision_model(model) and hasattr(base, "get_rope_index"):
        types = kwargs.get("mm_token_type_ids", torch.zeros_like(input_ids))
        positions, _ = base.get_rope_index(input_ids, mm_token_type_ids=types, image_grid_thw=kwargs.get("image_grid_thw"),
                                           attention_mask=attention_mask)
        return positions
    return (attention_mask.cumsum(1) - 1).clamp(min=0)


def text_positions(positions: torch.Tensor) -> torch.Tensor:
    """[n, L] the text position of each token (Qwen's three rows are equal on text)."""
    return positions[0] if positions.dim() == 3 else positions
