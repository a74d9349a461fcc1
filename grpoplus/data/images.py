"""Images of a row (``images``: a vision-language policy's prompts), from any source a data set holds them in.

A row's ``images`` is one image or a list of them, each a file path (relative to the data file's folder, or
absolute), raw bytes, a ``datasets`` Image value (``{"bytes": ..., "path": ...}``, as Parquet and Arrow files store
them) or a ``PIL.Image``. They are checked where the row is read, so that a missing file or bytes that do not decode
make that row a bad row (skipped and counted with its line, or the error of ``on_bad_row=error``), never a failure in
the middle of a run; they are decoded again (to RGB) when the row is sampled (:func:`load_image`), so a data set's
pixels are not all held in memory.

The prompt of a row with images shows them before its text, one image placeholder each, in the model's chat template
(:func:`image_messages`), as TRL and verl lay out an image column.
"""

from __future__ import annotations

import io
from pathlib import Path

IMAGE_FIELD = "images"


def image_sources(value, base: Path | None = None) -> tuple:
    """The row's images as sources :func:`load_image` reads, each checked to decode; ``ValueError`` (one line,
    naming the image) otherwise."""
    items = value if isinstance(value, (list, tuple)) else [value]
    if not items:
        return ()
    sources = []
    for k, item in enumerate(items):
        source = _source(item, base)
        if not isinstance(source, (bytes, Path)):  # a PIL image, decoded already
            sources.append(source)
            continue
        try:
            _open(source).verify()
        except FileNotFoundError:
            raise ValueError(f"image {k} ({source}) does not exist") from None
        except Exception as err:  # noqa: BLE001 (PIL raises many kinds for bytes that are not an image)
            raise ValueError(f"image {k} ({_named(source)}) does not decode as an image: "
                             f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")) from None
        sources.append(source)
    return tuple(sources)


def load_image(source):
    """The image of a source from :func:`image_sources`, decoded, in RGB."""
    return _open(source).convert("RGB")


def image_size(source) -> tuple[int, int]:
    """(width, height) of a source from :func:`image_sources`, read from its header (the pixels are not decoded)."""
    return tuple(_open(source).size)


def image_messages(prompt: str | list[dict], count: int) -> list[dict]:
    """The chat messages of a prompt with ``count`` images: a text prompt becomes one user message showing the
    images, then the text; a message list keeps its own image entries (their number must be ``count``)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": [{"type": "image"}] * count + [{"type": "text", "text": prompt}]}]
    shown = sum(1 for m in prompt if isinstance(m.get("content"), list)
                for part in m["content"] if isinstance(part, dict) and part.get("type") == "image")
    if shown != count:
        raise ValueError(f"the prompt's messages show {shown} image(s) and the row has {count}")
    return list(prompt)


def _source(item, base: Path | None):
    if isinstance(item, dict) and ("bytes" in item or "path" in item):  # a datasets Image value
        item = item.get("bytes") or item.get("path")
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    if isinstance(item, (str, Path)):
        path = Path(item).expanduser()
        return path if path.is_absolute() or base is None else base / path
    if hasattr(item, "convert") and hasattr(item, "size"):  # a PIL image
        return item
    raise ValueError(f"an image must be a path, bytes, a datasets Image value or a PIL image, got {type(item).__name__}")


def stored_images(value, folder: Path, stem: str) -> list[str]:
    """A row's ``images`` as a data file can hold them: each image held in memory (a ``PIL.Image``, bytes, a
    ``datasets`` Image value with bytes) written into ``folder`` as ``<stem>-<k>`` (PNG for a PIL image, the bytes as
    they are otherwise) and named relative to ``folder``'s parent (the data file's folder); a path made absolute."""
    items = value if isinstance(value, (list, tuple)) else [value]
    names = []
    for k, item in enumerate(items):
        source = _source(item, None)
        if isinstance(source, Path):
            names.append(str(source.resolve()))
            continue
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{stem}-{k}{'.img' if isinstance(source, bytes) else '.png'}"
        if isinstance(source, bytes):
            target.write_bytes(source)
        else:
            source.save(target, format="PNG")
        names.append(f"{folder.name}/{target.name}")
    return names


def _open(source):
    from PIL import Image

    if isinstance(source, bytes):
        return Image.open(io.BytesIO(source))
    if isinstance(source, Path):
        return Image.open(source)
    return source.copy() if hasattr(source, "copy") else source


def _named(source) -> str:
    return f"{len(source)} bytes" if isinstance(source, bytes) else str(source)
