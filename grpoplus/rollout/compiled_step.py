"""One decode step of the hf engine under ``torch.compile`` (``rollout.compile``).

The eager loop (:func:`grpoplus.rollout.hf.sample_loop`) changes shapes every step: the keys and values it
attends to grow by one column, and ended rows are compacted out of the batch. A compiled graph wants the same
shapes on every call, so here a batch keeps them for its whole rollout:

- the cache is the batch's preallocated buffers (:class:`~grpoplus.rollout.decode_ops.PreallocatedLayer`) seen
  at full capacity, written at a position held in a tensor (:class:`StaticRowsLayer`);
- the attention mask is one [n, 1, 1, capacity] boolean tensor the loop opens one column of per step (transformers
  passes a 4-d mask through as it is, so no mask is built inside the step);
- ended rows keep their slots and are computed and ignored; sampling reads only the rows the eager loop would still
  hold (:class:`StaticRows`), so a seed draws the same random numbers in the same order as the eager loop and the
  rollouts agree with it to float32 rounding.

On a CPU the step compiles with inductor (oneDNN's reordered weights enter the graph through the opaque
:func:`~grpoplus.rollout.decode_ops.packed_linear` op); on a GPU with ``mode="reduce-overhead"`` (CUDA graphs),
untested so far. The compiled step is kept by the engine across rollouts, with the tensors its static batches run on
(:class:`StaticPool`: a bucket's next rollout writes into the same cache, mask and positions, so a captured graph
replays as it is; ``run.release_memory`` frees them and the graphs before each update). A batch's rows and positions
are rounded up to buckets (:func:`bucket_rows`, :func:`bucket_capacity`; the rows added copy a real one and are never sampled), so
rollouts of other prompt widths or a few rows more or less replay a graph already made rather than compiling (or,
under CUDA graphs, capturing) a new one. A compile or run failure prints one line and decodes eagerly from then on.
"""

from __future__ import annotations

import sys

import torch
from transformers.cache_utils import Cache, DynamicLayer

from grpoplus.models.kv_cache import cache_kwargs
from grpoplus.rollout.decode_ops import PreallocatedLayer

CAPACITY_STEP = 256
"""A static batch's positions are rounded up to a multiple of this, so prompts of other widths reuse its graph."""
ROW_STEP = 16
"""A static batch's rows are rounded up to a power of two below this and to a multiple of it above: a refill round
or an evaluation of a few rows more or less reuses a graph (the rows added copy a real row and are never sampled)."""


def bucket_rows(n: int) -> int:
    """The rows a static batch of ``n`` rows computes: 1, 2, 4, 8, 16, then multiples of :data:`ROW_STEP`."""
    return 1 << (n - 1).bit_length() if n <= ROW_STEP else -(-n // ROW_STEP) * ROW_STEP


def bucket_capacity(positions: int) -> int:
    """The positions a static batch's cache holds for ``positions`` needed: a multiple of :data:`CAPACITY_STEP`."""
    return -(-positions // CAPACITY_STEP) * CAPACITY_STEP


STATIC_ATTENTION = ("sdpa",)
"""Attention implementations that take a boolean 4-d mask (True: attend), the form :class:`StaticRows` builds."""


def static_refusal(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot decode with a compiled step (None when it can): its attention must take a boolean 4-d
    mask (sdpa) and every layer attend to the whole past (no sliding window, linear attention or Mamba state)."""
    config = getattr(model, "config", None)
    if getattr(config, "vision_config", None) is not None:
        return "a vision-language model's decode is not compiled yet"
    attn = getattr(config, "_attn_implementation", None)
    if attn not in STATIC_ATTENTION:
        return f"its attention implementation is {attn!r}, not sdpa"
    kinds = sorted(set(getattr(config, "layer_types", None) or ["full_attention"]) - {"full_attention"})
    if kinds:
        return f"it has {', '.join(kinds)} layers, whose cache is not a plain key/value buffer"
    return None


class StaticRowsLayer(DynamicLayer):
    """One layer's cache at full capacity ([n, kv_heads, capacity, head_dim]), written at ``position`` ([1] long, one
    tensor shared by every layer) in place."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, position: torch.Tensor):
        super().__init__()
        self.keys, self.values, self.position = keys, values, position
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.keys.index_copy_(2, self.position, key_states)
        self.values.index_copy_(2, self.position, value_states)
        return self.keys, self.values


def forward_step(model, cache: Cache, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[n] tokens at [n, 1] positions, attending where ``mask`` ([n, 1, 1, capacity]) is True -> [n, V] logits."""
    return model(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions,
                 **cache_kwargs(model, cache), use_cache=True).logits[:, -1]


class StaticPool:
    """The tensors a static batch reads and writes (every layer's cache, the mask, tokens, positions), one set per
    shape, kept from one rollout to the next and marked as static addresses: a CUDA graph captured on them replays
    without copying them in (and is captured at all: a graph that writes into an input it copies in is skipped),
    and a bucket's next rollout replays it. :meth:`clear` frees them with the captured graphs."""

    def __init__(self):
        self.tensors: dict[tuple, torch.Tensor] = {}

    def empty(self, name: str, shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype | None = None
              ) -> torch.Tensor:
        """The kept tensor ``name`` of ``shape`` (``like``'s device, ``dtype`` or ``like``'s), uninitialised."""
        dtype = dtype or like.dtype
        key = (name, tuple(shape), dtype, like.device)
        if key not in self.tensors:
            self.tensors[key] = torch.empty(shape, dtype=dtype, device=like.device)
            torch._dynamo.mark_static_address(self.tensors[key])
        return self.tensors[key]

    def clear(self) -> None:
        cuda = any(t.is_cuda for t in self.tensors.values())
        self.tensors.clear()
        if cuda:  # the graphs captured on them hold their own memory pool
            from torch._inductor.cudagraph_trees import reset_cudagraph_trees

            reset_cudagraph_trees()


class CompiledStep:
    """:func:`forward_step` compiled once per engine (``mode``: None for inductor's default, ``"reduce-overhead"``
    for CUDA graphs), with the static batches' tensors it runs on (:class:`StaticPool`); after a failure,
    :func:`forward_step` itself."""

    def __init__(self, mode: str | None = None):
        self.fn = torch.compile(forward_step, mode=mode)
        self.failed = False
        self.pool = StaticPool()
        self.graphs = mode == "reduce-overhead"  # CUDA graphs asked for, and not yet seen skipped

    def release(self) -> None:
        """Free the static batches and the graphs captured on them (``run.release_memory``: before each update)."""
        self.pool.clear()

    def __call__(self, model, cache, tokens, positions, mask) -> torch.Tensor:
        if not self.failed:
            try:
                skips = cudagraph_skips()
                logits = self.fn(model, cache, tokens, positions, mask)
                if self.graphs and cudagraph_skips() > skips:
                    self.graphs = False
                    print("grpoplus: rollout.compile: torch skipped CUDA graphs for the decode step (TORCH_LOGS="
                          "cudagraphs says why); it runs compiled, a kernel launch per op", file=sys.stderr)
                return logits
            except Exception as err:  # noqa: BLE001 (any compiler error: the run goes on eagerly)
                self.failed = True
                first = (str(err).strip().splitlines() or [""])[0][:200]
                print(f"grpoplus: rollout.compile: the compiled decode step failed ({type(err).__name__}: {first}); "
                      "decoding eagerly from here", file=sys.stderr)
        return forward_step(model, cache, tokens, positions, mask)


def cudagraph_skips() -> int:
    """The graphs torch has compiled without CUDA graphs where they were asked for, in this process."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["cudagraph_skips"]


class StaticRows:
    """The decode state of :mod:`grpoplus.rollout.hf`'s loop at fixed shapes: all n rows every step, the live
    slots a view of them (:meth:`forward` returns the logits of the slots only, :meth:`keep` narrows them)."""

    def __init__(self, model, layers: list[PreallocatedLayer], masks: torch.Tensor, next_pos: torch.Tensor,
                 length: int, step: CompiledStep, rows: int | None = None):
        self.model, self.step, self.length = model, step, length
        n, capacity = masks.shape
        self.position = step.pool.empty("position", (1,), next_pos).fill_(0)  # the column a step writes
        for buf in (b for layer in layers for b in layer.buffers):  # [n, kv_heads, capacity, head_dim]
            buf[:, :, length:].zero_()  # attended under a False mask: weight 0, and 0 * (uninitialised NaN) is NaN
        self.cache = Cache(layers=[StaticRowsLayer(*layer.buffers, self.position) for layer in layers])
        self.mask = step.pool.empty("mask", (n, 1, 1, capacity), masks, torch.bool)  # [n, 1, 1, capacity]
        self.mask.copy_(masks[:, None, None, :])
        self.mask[..., length:] = False  # opened one column per step
        self.positions = step.pool.empty("positions", next_pos.shape, next_pos).copy_(next_pos)  # [n, 1]
        self.tokens = step.pool.empty("tokens", (n,), next_pos).zero_()  # [n] last token of every row
        self.live = torch.arange(rows or len(masks), device=masks.device)  # [m] row of each slot (padding rows: none)

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        """[m] tokens of the slots -> [m, V] next-token logits of the slots."""
        self.tokens[self.live] = tok
        self.mask[..., self.length] = True
        self.position.fill_(self.length)
        self.length += 1
        logits = self.step(self.model, self.cache, self.tokens, self.positions, self.mask)  # [n, V]
        self.positions += 1
        return logits[self.live]

    def keep(self, keep: torch.Tensor) -> None:
        """Keep the slots ``keep`` ([k] long, in order)."""
        self.live = self.live[keep]
