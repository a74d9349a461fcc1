"""The built-in tiny mixture-of-experts policy: a small Qwen3-MoE (``Qwen3MoeForCausalLM``), fp32.

Every decoder layer replaces the dense MLP by ``num_experts`` small SwiGLU experts of which
a linear router picks the top ``num_experts_per_tok`` per token (softmax over the router
logits, top-k, renormalised to sum to 1: ``norm_topk_prob``, as in the released Qwen3-MoE
checkpoints). It exists so that routing replay (:mod:`grpoplus.models.routing`, ALGORITHMS.md
section 8) can be developed and tested on CPU in minutes; it is an ordinary transformers
model, and vLLM serves the same architecture.

Head size 32 (hidden 96 = 3 heads x 32): vLLM's CPU attention only supports head sizes
32, 64, 80, 96, ...
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from transformers import Qwen3MoeConfig

MOE_SIZES: dict[str, dict] = {
    # Unit tests: 2 layers of 4 experts, top-2.
    "moe-nano": dict(hidden_size=64, num_attention_heads=2, num_hidden_layers=2, num_experts=4,
                     num_experts_per_tok=2, moe_intermediate_size=64),
    # The MoE counterpart of the dense 'small' model: same width, depth and attention, and the
    # same active MLP width per token (2 experts x 128 = 256 = the dense intermediate size),
    # spread over 4 experts of which each token uses 2.
    "moe": dict(hidden_size=96, num_attention_heads=3, num_hidden_layers=3, num_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=128),
}
HEAD_DIM = 32


def tiny_moe_config(vocab_size: int, *, size: str = "moe", **overrides) -> Qwen3MoeConfig:
    """A ``Qwen3MoeConfig`` of one of the ``MOE_SIZES``; ``overrides`` replace any config field.

    Raises ``ValueError`` for an unknown size.
    """
    if size not in MOE_SIZES:
        raise ValueError(f"unknown tiny MoE size {size!r}; choose one of: {', '.join(MOE_SIZES)}")
    fields = dict(
        vocab_size=vocab_size,
        head_dim=HEAD_DIM,
        max_position_embeddings=256,
        num_key_value_heads=MOE_SIZES[size]["num_attention_heads"],
        intermediate_size=256,  # only used by dense layers, of which there are none (mlp_only_layers=[])
        norm_topk_prob=True,
        router_aux_loss_coef=0.01,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
    )
    fields.update(MOE_SIZES[size])
    fields.update(overrides)
    return Qwen3MoeConfig(**fields)


@contextmanager
def balance_loss_while_training(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block, ``model(**batch).loss`` of an MoE model includes the router
    load-balancing loss (Fedus et al., 2021, Switch Transformer eq. 4, scaled by
    ``router_aux_loss_coef``), which keeps the supervised warm start from sending every
    token to the same experts. The config flag is restored on exit, so the saved model's
    forward does not compute it. A no-op for a model without the flag (dense).
    """
    config = model.config
    if not hasattr(config, "output_router_logits"):
        yield
        return
    before = config.output_router_logits
    config.output_router_logits = True
    try:
        yield
    finally:
        config.output_router_logits = before
