"""The keyword a transformers model's forward takes its KV cache by.

transformers 5.24 renamed the forward's ``past_key_values`` to ``cache`` (the old name still works,
with a FutureWarning on every call); the releases before take only ``past_key_values``.
"""

from __future__ import annotations

import inspect

import torch

_KEYWORDS: dict = {}  # forward function -> its keyword (a plain dict: torch.compile traces through it quietly)


def _cache_keyword(forward) -> str:
    if forward not in _KEYWORDS:
        try:
            params = inspect.signature(forward).parameters
        except (TypeError, ValueError):
            params = {}
        _KEYWORDS[forward] = "cache" if "cache" in params else "past_key_values"
    return _KEYWORDS[forward]


def cache_kwargs(module: torch.nn.Module, cache) -> dict:
    """``{"cache": cache}`` where ``module``'s forward names its KV cache ``cache``, else
    ``{"past_key_values": cache}`` (older transformers, or a wrapper whose forward takes ``**kwargs``)."""
    return {_cache_keyword(type(module).forward): cache}
