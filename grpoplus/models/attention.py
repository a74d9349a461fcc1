"""Grouped key/value heads under SDPA on a CPU without copying the keys and values.

transformers' SDPA attention expands a grouped-query model's key/value heads to its query heads (``repeat_kv``: a
copy of every key and value, forward, and a sum over the copies in backward) whenever an attention mask is given,
which a batch of padded rows always needs, because CUDA's fused kernels refuse ``enable_gqa`` with a mask. PyTorch's
CPU kernels take it: ``scaled_dot_product_attention(enable_gqa=True)`` reads the un-expanded heads, with the same
output and gradients up to float summation order (tests/models/test_attention.py), and on SmolLM2's learner shapes
(16 rows, 3 key/value heads for 9 query heads) its forward and backward take about 0.7 of the time.

:func:`use_cpu_gqa` makes transformers' own SDPA path decide so for tensors on a CPU (its choice for every other
device is kept): the decision is transformers' ``use_gqa_in_sdpa``, wrapped once per process; everything else in
its attention (causal flag, dropout, position bias) stays as transformers wrote it.
"""

from __future__ import annotations

import torch
from transformers.integrations import sdpa_attention

_ORIGINAL = sdpa_attention.use_gqa_in_sdpa


def _use_gqa(attention_mask: torch.Tensor | None, key: torch.Tensor, value: torch.Tensor | None = None) -> bool:
    """transformers' decision, or on a CPU yes (where keys and values have one head size); ``value`` is passed by
    later transformers, not by 5.6 (the oldest this project allows)."""
    if key.device.type == "cpu":
        return value is None or key.shape[-1] == value.shape[-1]
    return _ORIGINAL(attention_mask, key) if value is None else _ORIGINAL(attention_mask, key, value)


def use_cpu_gqa() -> None:
    """From now on in this process, transformers' SDPA attention hands grouped key/value heads on a CPU to
    ``scaled_dot_product_attention(enable_gqa=True)`` instead of copying them per query head. Idempotent."""
    sdpa_attention.use_gqa_in_sdpa = _use_gqa
