"""The keyword a transformers model's forward takes its KV cache by.

transformers 5.24 renamed the forward's ``past_key_values`` to ``cache`` (the old name still works,
with a FutureWarning on every call); the releases before take only ``past_key_values``.
"""

from __future__ import annotations

import functools
import inspect

import torch


@functools.cache
def _cache_keyword(forward) -> str:
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(module: torch.nn.Module, cache) -> dict:
    """``{"cache": cache}`` where ``module``'s forward names its KV cache ``cache``, else
    ``{"past_key_values": cache}`` (older transformers, or a wrapper whose forward takes ``**kwargs``)."""
    return {_cache_keyword(type(module).forward): cache}
