"""Decode-time replacements for the three defaults that cost the HF engine's CPU decode most.

- Cache: transformers' ``DynamicCache`` concatenates every new key/value onto the cache,
  so each decode step copies the whole cache of every layer. :func:`expand_to_rows`
  allocates the sampled rows' cache once at its final length; a step writes one position.
- Attention: transformers' SDPA path expands grouped key/value heads to the query heads
  (``repeat_kv``, another copy of the cache per layer and step) whenever a mask is given,
  which left padding always needs. A run's process setup installs
  :func:`grpoplus.models.attention.use_cpu_gqa`, the learner's own fix, for the engine too: on a
  CPU the un-expanded heads go to ``scaled_dot_product_attention(enable_gqa=True)``, the same
  numbers with no copy (a GPU keeps transformers' choice).
- Linear layers: a decode step multiplies a few rows by every weight matrix, where MKL's
  plain GEMM is slow on a CPU. :func:`packed_linears` multiplies by a copy of every fp32
  weight that oneDNN reordered once per rollout (the kernels PyTorch's own CPU inference
  compiler uses): ~3x faster at a decode step's rows, ~2x for the prompts' prefill, the same
  numbers to float32 rounding. The hf engine uses it unless told not to
  (``rollout.engine_kwargs={pack_weights: false}``); the copy lives only during the rollout.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
from transformers import cache_utils
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

# Cache layers that hold a recurrent or convolution state per row (linear attention, Mamba, short convolutions):
# transformers releases without them have no such layers.
STATE_LAYERS = tuple(c for c in (getattr(cache_utils, "LinearAttentionCacheLayerMixin", None),) if c is not None)

class PreallocatedLayer(DynamicLayer):
    """One layer's KV cache in [rows, kv_heads, capacity, head_dim] buffers filled up to ``length``.

    ``keys`` / ``values`` are views of the filled part; ``update`` writes the new positions
    in place (no copy of the past), ``batch_select_indices`` compacts the kept rows to the
    front of the same buffers.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int):
        super().__init__()
        self.buffers = (keys, values)
        self.rows, self.length = keys.shape[0], length
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._set_views()

    def _set_views(self) -> None:
        self.keys, self.values = (buf[: self.rows, :, : self.length] for buf in self.buffers)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        if end > self.buffers[0].shape[2]:
            raise ValueError(f"KV cache full: {end} positions needed, {self.buffers[0].shape[2]} allocated")
        self.buffers[0][: self.rows, :, self.length:end] = key_states
        self.buffers[1][: self.rows, :, self.length:end] = value_states
        self.length = end
        self._set_views()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for buf in self.buffers:
            buf[: len(indices), :, : self.length] = buf[indices, :, : self.length]  # the right side is a copy
        self.rows = len(indices)
        self._set_views()


def select_rows(cache: Cache, indices: torch.Tensor) -> None:
    """Keep (and reorder) the rows ``indices`` of every layer of ``cache``, in place: key/value layers and the
    recurrent and convolution states of linear-attention and Mamba layers alike (a hybrid's layer that holds both
    selects both; transformers' own ``batch_select_indices`` would leave its states behind)."""
    for layer in cache.layers:
        _select_layer_rows(layer, indices)


def _select_layer_rows(layer, indices: torch.Tensor) -> None:
    if isinstance(layer, STATE_LAYERS):
        layer.reorder_cache(indices)  # the states, and the keys and values of a layer that has them too
    else:
        layer.batch_select_indices(indices)


def expand_to_rows(prefill: DynamicCache, rows: torch.Tensor, capacity: int, empty=None) -> Cache:
    """The prefilled cache of the distinct prompts copied to their sample rows, with room for ``capacity`` positions.

    Args:
        prefill: the cache after the prompts' forward ([b, kv_heads, P, head_dim] per layer).
        rows: [n] long, the prompt of each sample row.
        capacity: total positions per row (P + new tokens).
        empty: ``empty(name, shape, like)`` -> the buffer ``name`` (``k3``: layer 3's keys), uninitialised; default a
            new one (a compiled step's static batch takes its kept buffers:
            :class:`~grpoplus.rollout.compiled_step.StaticPool`).

    Returns a cache of preallocated layers when every layer is a plain full-attention ``DynamicLayer``; otherwise
    the prefill cache itself, its plain layers preallocated in place and the others (a sliding window, the
    recurrent state of a linear-attention or Mamba layer) expanded to the rows (:func:`select_rows`).
    """
    empty = empty or (lambda name, shape, like: like.new_empty(shape))
    if all(type(layer) is DynamicLayer for layer in prefill.layers):
        return Cache(layers=[_preallocated(layer, rows, capacity, empty, i) for i, layer in enumerate(prefill.layers)])
    for i, layer in enumerate(prefill.layers):
        if type(layer) is DynamicLayer:
            prefill.layers[i] = _preallocated(layer, rows, capacity, empty, i)
        else:
            _select_layer_rows(layer, rows)
    return prefill


def _preallocated(layer: DynamicLayer, rows: torch.Tensor, capacity: int, empty, index: int) -> PreallocatedLayer:
    buffers = []
    for kind, past in (("k", layer.keys), ("v", layer.values)):  # [b, kv_heads, P, head_dim]
        buffers.append(empty(f"{kind}{index}", (len(rows), past.shape[1], capacity, past.shape[3]), past))
        buffers[-1][:, :, : past.shape[2]] = past[rows]
    return PreallocatedLayer(*buffers, layer.get_seq_length())


@torch.library.custom_op("grpoplus::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """``x @ W.T + b`` with ``packed`` the weight oneDNN reordered (:func:`packed_linears`), as one op a compiler
    calls as it is (inductor lowers oneDNN's own op only for weights frozen into its graph)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@packed_linear.register_fake
def _packed_linear_shape(x, packed, bias, out_features):
    return x.new_empty((*x.shape[:-1], out_features))


def packed_linears(model: torch.nn.Module, rows: int, dtype: torch.dtype = torch.float32, opaque: bool = False):
    """Within the block, ``model``'s fp32 ``nn.Linear`` layers multiply by a copy of their weight that
    oneDNN reordered once for inputs of about ``rows`` rows (any row count works), in ``dtype`` (float32,
    or bfloat16 for a bf16 decode: inputs are cast to it, outputs are in it). At the few rows of a
    decode step this runs ~3x faster than the plain GEMM on an AVX2 CPU (SmolLM2's layers: 0.78 vs
    2.4 ms per layer at 16 rows) and agrees with it to float32 rounding. Holds the reordered copy
    meanwhile; a no-op context without oneDNN or for non-fp32 / non-CPU weights. ``opaque``: through
    :func:`packed_linear`, for a compiled decode step (eagerly, oneDNN's op is called directly: fewer dispatches)."""
    onednn = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dtype == torch.float32
               and m.weight.device.type == "cpu" and "forward" not in vars(m)]
    return _packed(linears, rows, dtype, opaque) if onednn and linears else nullcontext()


@contextmanager
def _packed(linears: list[torch.nn.Linear], rows: int, dtype: torch.dtype, opaque: bool):
    for m in linears:
        packed = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach().to(dtype), rows)
        bias = None if m.bias is None else m.bias.detach().to(dtype)
        m.forward = _opaque_forward(packed, bias, m.out_features, dtype) if opaque else \
            (lambda packed, bias: lambda x: torch.ops.mkldnn._linear_pointwise(
                x.to(dtype), packed, bias, "none", [], ""))(packed, bias)  # noqa: B023 (bound by the outer call)
    try:
        yield
    finally:
        for m in linears:
            del m.forward


def _opaque_forward(packed: torch.Tensor, bias: torch.Tensor | None, out_features: int, dtype: torch.dtype):
    return lambda x: packed_linear(x.to(dtype), packed, bias, out_features)
