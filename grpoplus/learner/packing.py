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

from dataclasses import dataclass

import torch

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
    index of the output that predicts each scored token (the token before it in its row).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    keep: torch.Tensor
    predict: torch.Tensor


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
              scored: tuple[torch.Tensor, torch.Tensor], first_scored_col: int) -> PackedRows:
    """Pack the rows of one padded forward.

    Args:
        input_ids, attention_mask, position_ids: [n, L] the padded forward's inputs (left-padded prompts, then
            right-padded responses; positions counted over the real tokens from 0).
        scored: (rows, cols) of the M scored tokens, cols counted from ``first_scored_col`` (the response's first
            column); each has a real token before it in its row (its prompt's last token at least).
    """
    keep = attention_mask.bool()  # [n, L]
    slot = keep.reshape(-1).cumsum(0).reshape(keep.shape) - 1  # [n, L] packed index of each real token
    rows, cols = scored
    predict = slot[rows, cols + first_scored_col] - 1  # [M]: the output one token earlier in the same row
    return PackedRows(input_ids[keep][None], position_ids[keep][None], keep, predict)


def packing_refusal(model: torch.nn.Module) -> str | None:
    """Why ``model``'s packed forward would differ from its padded one, or None where it packs."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in PACKED_MODEL_TYPES:
        return (f"a {model_type} model is not among the architectures proven to pack ({', '.join(sorted(PACKED_MODEL_TYPES))}"
                "; a recurrent or convolutional layer would carry one row's state into the next)")
    attention = getattr(config, "_attn_implementation", None)
    if attention not in PACKED_ATTENTION:
        return f"its attention implementation {attention!r} does not read restarting position ids as separate rows"
    return None


def check_packing(mode: str, model: torch.nn.Module) -> bool:
    """Whether the learner packs ``model``'s micro-batches: ``off`` never; ``on`` where it can, else a one-line
    ``ValueError``; ``auto`` where it can, else one line on stderr and padded micro-batches."""
    if mode not in PACKING_MODES:
        raise ValueError(f"learner.packing={mode!r} is not one of {', '.join(PACKING_MODES)}")
    if mode == "off":
        return False
    why = packing_refusal(model)
    if why is None:
        return True
    if mode == "on":
        raise ValueError(f"learner.packing=on cannot pack this model: {why}; set learner.packing=auto or off")
    import sys

    print(f"grpoplus: note: learner.packing=auto pads this model's micro-batches: {why}", file=sys.stderr)
    return False


def trimmed_width(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> int:
    """Columns of the padded forward over these rows: prompt and response columns that are padding in every row
    trimmed (:func:`grpoplus.learner.logprobs.trimmed_inputs`)."""
    prompt = prompt_mask.bool().any(0).nonzero()
    response = response_mask.bool().any(0).nonzero()
    return (prompt_mask.shape[1] - int(prompt[0]) if len(prompt) else 0) + (int(response[-1]) + 1 if len(response) else 0)


def padding_metrics(prompt_mask: torch.Tensor, response_mask: torch.Tensor, micro_batches: list[torch.Tensor],
                    packed: bool) -> dict[str, float]:
    """``learner/pad_frac``: the share of padding among the tokens the micro-batches' forwards hold (0 packed);
    ``learner/pad_frac_padded``: the same micro-batches padded."""
    real = padded = 0
    for idx in micro_batches:
        p, r = prompt_mask[idx], response_mask[idx]
        real += int(p.sum() + r.sum())
        padded += len(idx) * trimmed_width(p, r)
    frac = 1.0 - real / padded if padded else 0.0
    return {"learner/pad_frac": 0.0 if packed else frac, "learner/pad_frac_padded": frac}
