"""Packed micro-batches (``learner.packing``): the rows of a forward as one sequence, no padding token in any layer.

A padded micro-batch computes every row at the width of its longest one; where response lengths vary widely most
of that work is padding. Packed, the real tokens of the rows are laid one row after another in a single sequence
``[1, S]`` (``S`` = the real tokens), each row's position ids counting from 0 again. transformers reads a restart of
the position ids with no attention mask as a packed batch and attends block-diagonally: causal within each row,
nothing across rows (varlen kernels under flash attention, a block mask under SDPA and eager). The outputs that
predict the response tokens are gathered by index, so the log-probs, the entropy and the gradient are the padded
forward's (tests/learner/test_packing.py, and per architecture tests/models/test_architectures.py).

It holds for the architectures whose every layer sees a token through attention alone: a recurrent state (linear
attention, Mamba, short convolutions) would carry one row's state into the next. :data:`PACKED_MODEL_TYPES` lists
those the architecture matrix proves; :func:`check_packing` decides per model, once, before the run.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from grpoplus.learner.activation_checkpointing import checkpointable_layers
from grpoplus.models.shape import attention_width, layer_configs

PACKED_MODEL_TYPES = frozenset({
    "llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2", "olmo3", "smollm3", "glm4", "granite", "gemma3_text",
    "gemma4_text", "qwen3_moe", "glm4_moe", "deepseek_v3"})
"""``config.model_type`` of the causal LMs whose packed forward equals the padded one (the architecture matrix
checks every family: these pack, the others differ). Not here: the linear-attention, Mamba and short-convolution
hybrids (qwen3_5_text, qwen3_5_moe_text, qwen3_next, olmo_hybrid, granitemoehybrid, lfm2), whose recurrent state runs
on from one row into the next, and llama4_text, whose chunked attention counts its chunks over the packed sequence."""

PACKED_ATTENTION = frozenset({"sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention"})
"""Attention implementations that read restarting position ids as a packed batch."""

PACKING_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class PackedRows:
    """The real tokens of ``n`` padded rows as one sequence.

    ``input_ids``, ``position_ids``: [1, S] row after row, each row's positions from 0; ``keep``: [n, L] bool, the
    padded columns that are real (their row-major order is the packed order); ``predict``: [M] long, the packed
    index of the output that predicts each scored token (the token before it in its row); ``attention``: the
    attention implementation the packed forward runs under (None: the model's own, :func:`packed_attention`).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    keep: torch.Tensor
    predict: torch.Tensor
    attention: str | None = None


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
              scored: tuple[torch.Tensor, torch.Tensor], first_scored_col: int, attention: str | None = None
              ) -> PackedRows:
    """Pack the rows of one padded forward.

    Args:
        input_ids, attention_mask, position_ids: [n, L] the padded forward's inputs (left-padded prompts, then
            right-padded responses; positions counted over the real tokens from 0).
        scored: (rows, cols) of the M scored tokens, cols counted from ``first_scored_col`` (the response's first
            column); each has a real token before it in its row (its prompt's last token at least).
        attention: the attention implementation of the packed forward (None: the model's own).
    """
    keep = attention_mask.bool()  # [n, L]
    slot = keep.reshape(-1).cumsum(0).reshape(keep.shape) - 1  # [n, L] packed index of each real token
    rows, cols = scored
    predict = slot[rows, cols + first_scored_col] - 1  # [M]: the output one token earlier in the same row
    return PackedRows(input_ids[keep][None], position_ids[keep][None], keep, predict, attention)


def packing_refusal(model: torch.nn.Module) -> str | None:
    """Why ``model``'s packed forward would differ from its padded one, or None where it packs."""
    from grpoplus.models.vision import is_vision_model

    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if is_vision_model(model):
        return "a vision-language model's rows forward padded, each with its images (packing them is not written yet)"
    if model_type not in PACKED_MODEL_TYPES:
        return (f"a {model_type} model is not among the architectures proven to pack ({', '.join(sorted(PACKED_MODEL_TYPES))}"
                "; a recurrent or convolutional layer would carry one row's state into the next)")
    attention = getattr(config, "_attn_implementation", None)
    if attention not in PACKED_ATTENTION:
        return f"its attention implementation {attention!r} does not read restarting position ids as separate rows"
    return None


def check_packing(mode: str, model: torch.nn.Module) -> bool | str:
    """How the learner packs ``model``'s micro-batches: ``off`` never (False); ``on`` always where it can (True), else
    a one-line ``ValueError``; ``auto`` where it can ("auto": an optimizer step's micro-batches packed where that
    computes less, :func:`packing_pays`, decided once for all of them, so a sharded learner's ranks run the same
    passes), else one line on stderr and padded micro-batches (False)."""
    if mode not in PACKING_MODES:
        raise ValueError(f"learner.packing={mode!r} is not one of {', '.join(PACKING_MODES)}")
    if mode == "off":
        return False
    why = packing_refusal(model)
    if why is None:
        return True if mode == "on" else "auto"
    if mode == "on":
        raise ValueError(f"learner.packing=on cannot pack this model: {why}; set learner.packing=auto or off")
    print(f"grpoplus: note: learner.packing=auto pads this model's micro-batches: {why}", file=sys.stderr)
    return False


PACKED_ATTENTION_MODES = ("auto", "model", "flex_attention")

FLEX_ON_CPU = "PyTorch's flex attention has no backward on a CPU (measured on torch 2.13)"


def packed_attention(mode: str, model: torch.nn.Module, packing: bool | str) -> str | None:
    """The attention implementation a packed forward switches to (``learner.packed_attention``), None for the
    model's own: ``model`` keeps it; ``flex_attention`` uses PyTorch's flex attention, whose block mask holds each
    row's span rather than an [S, S] mask and whose kernel skips the blocks across rows; ``auto`` uses it for a
    policy on a GPU and keeps the model's own on a CPU (:data:`FLEX_ON_CPU`). Nothing to decide where the learner
    never packs."""
    if mode not in PACKED_ATTENTION_MODES:
        raise ValueError(f"learner.packed_attention={mode!r} is not one of {', '.join(PACKED_ATTENTION_MODES)}")
    own = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if packing is False or mode == "model" or own in VARLEN_ATTENTION:
        return None
    if next(model.parameters()).device.type != "cuda":
        if mode == "auto":
            return None
        raise ValueError(f"learner.packed_attention=flex_attention needs a GPU: {FLEX_ON_CPU}; set "
                         "learner.packed_attention=auto or model")
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError as err:
        if mode == "auto":
            return None
        raise ValueError(f"learner.packed_attention=flex_attention needs torch's flex attention ({err}); "
                         "set learner.packed_attention=model") from None
    return "flex_attention"


FAILED_ATTENTION: set[str] = set()
"""Packed attention implementations that raised in this process (each then said once; the model's own from then)."""


@contextmanager
def attention_as(model: torch.nn.Module, attention: str | None):
    """Run ``model``'s forwards under the attention implementation ``attention`` (None: as it is), restored after."""
    config = model.config
    own = config._attn_implementation
    if attention is None or attention == own:
        yield
        return
    config._attn_implementation = attention
    try:
        yield
    finally:
        config._attn_implementation = own


def packed_forward(model: torch.nn.Module, attention: str | None, forward):
    """``forward()`` under the packed attention ``attention``; one that raises (a compilation that fails) is said in
    one line and the forward runs again, and from then on, under the model's own attention (its block mask)."""
    if attention is None or attention in FAILED_ATTENTION:
        return forward()
    try:
        with attention_as(model, attention):
            return forward()
    except torch.OutOfMemoryError:
        raise
    except Exception as err:  # noqa: BLE001 -- any failure of the kernel's compilation: the model's own attention
        FAILED_ATTENTION.add(attention)
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        print(f"grpoplus: note: the packed forward under {attention} failed ({type(err).__name__}: {first}); "
              "packed forwards use the model's own attention from now on", file=sys.stderr)
        return forward()


VARLEN_ATTENTION = frozenset({"flash_attention_2", "flash_attention_3", "flex_attention"})
"""Attention implementations whose packed forward computes each row's block alone (the others score the whole packed
sequence against itself under a block mask)."""


MASKED_SCORES = 1 << 28
"""Under ``auto``, a micro-batch packs without a varlen attention only while its packed sequence's block mask
(``[S, S]``, one byte or more per score) stays within this many scores (S up to 16,384 tokens)."""


@dataclass(frozen=True)
class ForwardCost:
    """A forward's estimated work per decoder layer: ``tokens`` through its linear layers, ``scores`` of attention."""

    tokens: int
    scores: int

    def flops(self, per_token: float, per_score: float) -> float:
        return self.tokens * per_token + self.scores * per_score


def padded_cost(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_mask: torch.Tensor,
                share_prompts: bool | str) -> ForwardCost:
    """The padded forward's work: prompt and response columns that are padding in every row trimmed; with shared
    prompts (where rows share one), each distinct prompt once and every response against it."""
    p, t = _trimmed(prompt_mask), _trimmed(response_mask, left=False)
    n = len(prompt_mask)
    if share_prompts and p:
        rows = torch.cat([prompt_ids * prompt_mask, prompt_mask], 1)
        distinct = len(torch.unique(rows, dim=0))
        if distinct < n or share_prompts == "always":
            return ForwardCost(distinct * p + n * t, distinct * p * p + n * t * (p + t))
    return ForwardCost(n * (p + t), n * (p + t) ** 2)


def packed_cost(prompt_mask: torch.Tensor, response_mask: torch.Tensor, varlen: bool) -> ForwardCost:
    """The packed forward's work: every row's real tokens once; attention over each row's block (``varlen``) or over
    the whole packed sequence under a block mask."""
    lengths = prompt_mask.sum(1) + response_mask.sum(1)
    total = int(lengths.sum())
    return ForwardCost(total, int((lengths * lengths).sum()) if varlen else total * total)


def layer_flops(model: torch.nn.Module, attention: str | None = None) -> tuple[float, float, bool]:
    """(FLOPs per token through a decoder layer's weights, FLOPs per attention score, whether its packed attention
    (``attention``, else the model's own) is varlen): 2 per weight (every weight counted, experts included),
    4 x heads x head dim per score, each the mean over the layers (layers may differ: :mod:`grpoplus.models.shape`)."""
    config = model.config
    layers, kinds = checkpointable_layers(model), layer_configs(config)
    weights = sum(p.numel() for layer in layers for p in layer.parameters()) / len(layers) if layers else \
        sum(p.numel() for p in model.parameters()) / len(kinds)
    attention = attention or getattr(config, "_attn_implementation", None)
    return 2.0 * weights, 4.0 * attention_width(config), attention in VARLEN_ATTENTION


def packing_pays(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                 response_mask: torch.Tensor, share_prompts: bool | str,
                 micro_batches: list[torch.Tensor] | None = None, attention: str | None = None) -> bool:
    """Whether packing these rows computes fewer FLOPs than padding them (``learner.packing=auto``): packing drops the
    padding, but computes every row's prompt (shared prompts compute a group's once) and, without a varlen attention,
    scores the packed sequence against itself under a block mask (never one of more than :data:`MASKED_SCORES`
    scores). ``micro_batches``: the row indices of each forward (default: all rows in one), costs added up over them,
    so that one answer holds for them all (an optimizer step's, the same on every learner rank); ``attention``: the
    packed forwards' attention implementation (:func:`packed_attention`; None: the model's own)."""
    per_token, per_score, varlen = layer_flops(model, attention)
    packed = padded = 0.0
    for idx in micro_batches if micro_batches is not None else [torch.arange(len(prompt_mask))]:
        cost = packed_cost(prompt_mask[idx], response_mask[idx], varlen)
        if not varlen and cost.scores > MASKED_SCORES:  # its [S, S] block mask alone would take more than this
            return False
        packed += cost.flops(per_token, per_score)
        padded += padded_cost(prompt_ids[idx], prompt_mask[idx], response_mask[idx], share_prompts).flops(
            per_token, per_score)
    return packed < padded


def _trimmed(mask: torch.Tensor, left: bool = True) -> int:
    """Columns of ``mask`` left once those that are padding in every row are cut (left-padded prompts from the left,
    right-padded responses from the right)."""
    real = mask.bool().any(0).nonzero()
    if not len(real):
        return 0
    return mask.shape[1] - int(real[0]) if left else int(real[-1]) + 1


def trimmed_width(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> int:
    """Columns of the padded forward over these rows: prompt and response columns that are padding in every row
    trimmed (:func:`grpoplus.learner.logprobs.trimmed_inputs`)."""
    return _trimmed(prompt_mask) + _trimmed(response_mask, left=False)


def padding_metrics(prompt_mask: torch.Tensor, response_mask: torch.Tensor, micro_batches: list[torch.Tensor],
                    packed: bool | list[bool]) -> dict[str, float]:
    """``learner/pad_frac``: the share of padding among the tokens the micro-batches' forwards hold (0 in a packed
    one); ``learner/pad_frac_padded``: the same micro-batches all padded; ``learner/packed_frac``: the share of the
    micro-batches packed (``packed``: all, none, or one flag per micro-batch)."""
    flags = packed if isinstance(packed, list) else [bool(packed)] * len(micro_batches)
    real = padded = held = 0
    for idx, pack in zip(micro_batches, flags):
        p, r = prompt_mask[idx], response_mask[idx]
        tokens, width = int(p.sum() + r.sum()), len(idx) * trimmed_width(p, r)
        real, padded, held = real + tokens, padded + width, held + (tokens if pack else width)
    return {"learner/pad_frac": 1.0 - real / held if held else 0.0,
            "learner/pad_frac_padded": 1.0 - real / padded if padded else 0.0,
            "learner/packed_frac": sum(flags) / len(flags) if flags else 0.0}
