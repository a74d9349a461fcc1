"""Python objects handed to :class:`grpoplus.Trainer`, turned into what a config names.

A run's config is plain data (it is saved as ``config.yaml``, read back on resume, and the plan each learner rank
and Ray worker receives is derived from it), so each object becomes a value the config can hold:

- a data set (a list of dicts, a ``datasets.Dataset``, a pandas ``DataFrame``, any iterable of mappings) is
  written to ``RUN/inputs/<name>.jsonl`` and named by its path (the run keeps what it trained on); a row's images
  held in memory (PIL images, as a ``datasets`` Image column gives them, or bytes) are written beside it, in
  ``RUN/inputs/<name>-images/``, and image paths are made absolute;
- a ``transformers`` model with its tokenizer is saved to ``RUN/inputs/model`` and named by its path;
- a function (a reward, an environment factory, a tool) is named ``module:function`` when it can be imported
  again by that name, so every process finds it; a function defined in a notebook or a script's ``__main__`` is
  registered under its own name in this process only, which serves every placement whose scoring and
  collection run in this process (``run.cluster=local``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from grpoplus.core.registry import Registry, import_object
from grpoplus.data.images import IMAGE_FIELD, stored_images

INPUTS_DIR = "inputs"


def dataset_path(data, out: Path, name: str) -> str:
    """A file path for ``data``: a path as given; rows written to ``out/inputs/<name>.jsonl``."""
    if isinstance(data, (str, Path)):
        return str(data)
    rows = _rows(data, name)
    path = out / INPUTS_DIR / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for i, row in enumerate(rows):
            if row.get(IMAGE_FIELD) is not None:  # images held in memory become files beside the rows
                try:
                    row[IMAGE_FIELD] = stored_images(row[IMAGE_FIELD], path.parent / f"{name}-images", str(i))
                except (ValueError, OSError) as err:
                    raise ValueError(f"{name} row {i}: its images: {err}") from None
            try:
                handle.write(json.dumps(row, default=_plain) + "\n")
            except TypeError as err:
                raise ValueError(f"{name} row {i}: {err}; rows must hold text, numbers, lists and dicts") from None
    return str(path)


def _rows(data, name: str) -> Iterable[dict]:
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # a pandas DataFrame
        data = data.to_dict(orient="records")
    if isinstance(data, Mapping) or not isinstance(data, Iterable):
        raise TypeError(f"{name} must be a file path, a list of dicts, a datasets.Dataset or a DataFrame, "
                        f"got {type(data).__name__}")
    for i, row in enumerate(data):
        if not isinstance(row, Mapping):
            raise TypeError(f"{name} row {i} is a {type(row).__name__}, not a mapping of column -> value")
        yield dict(row)


def _plain(value):
    """JSON for numpy / torch scalars and arrays a data set may hold."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def model_path(model, tokenizer, out: Path) -> str | None:
    """``learner.model`` for ``model``: None (the built-in tiny model), a name or path as given, or a loaded
    ``transformers`` model saved with ``tokenizer`` to ``out/inputs/model``."""
    if model is None or isinstance(model, (str, Path)):
        return None if model is None else str(model)
    if isinstance(model, tuple) and len(model) == 2:
        model, tokenizer = model
    if not hasattr(model, "save_pretrained"):
        raise TypeError(f"model must be a name, a path or a transformers model, got {type(model).__name__}")
    if tokenizer is None or not hasattr(tokenizer, "save_pretrained"):
        raise ValueError("a transformers model needs its tokenizer: Trainer(model=model, tokenizer=tokenizer)")
    path = out / INPUTS_DIR / "model"
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return str(path)


def named(obj, registry: Registry, kind: str) -> tuple[str, bool]:
    """(the name a config gives ``obj``, whether only this process knows it). A string is a name already."""
    if isinstance(obj, str):
        return obj, False
    if not callable(obj):
        raise TypeError(f"a {kind} must be a name or a function, got {type(obj).__name__}")
    spec = importable_spec(obj)
    if spec is not None:
        return spec, False
    name = getattr(obj, "__name__", "")
    if not name.isidentifier():
        raise ValueError(f"a {kind} needs a name: define it with def (a lambda has none)")
    if name in registry and registry.get(name) is not obj and name not in _OURS.get(registry.kind, set()):
        raise ValueError(f"a built-in {kind} is already named {name!r}: rename your function")
    registry.add(name, obj, overwrite=True)
    _OURS.setdefault(registry.kind, set()).add(name)
    return name, True


_OURS: dict[str, set[str]] = {}
"""Names this module registered, per registry kind: a function redefined in a notebook replaces its old self."""


def importable_spec(fn: Callable) -> str | None:
    """``module:qualname`` when importing it gives ``fn`` back (a module-level function of an importable module)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        return None
    spec = f"{module}:{qualname}"
    try:
        return spec if import_object(spec) is fn else None
    except Exception:  # noqa: BLE001 - not importable by that name: not portable
        return None
