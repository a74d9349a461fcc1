"""The built-in tiny policy: a small Llama (Hugging Face ``LlamaForCausalLM``), fp32.

It is an ordinary transformers model, so everything downstream (generation, log-probs,
``save_pretrained``) is the same code path as for a real checkpoint.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase, Qwen3MoeForCausalLM

from grpoplus.models.families import FAMILIES, tiny_family_model
from grpoplus.models.moe import MOE_SIZES, tiny_moe_config

# Attention heads are 32 wide in every size: vLLM's CPU attention kernels take head sizes of
# 32, 64, 80, 96, ... only, and the built-in models must run on every rollout engine.
SIZES: dict[str, dict] = {
    # ~0.09M parameters: unit tests.
    "nano": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2),
    # ~0.34M parameters: the default policy of the built-in tasks. Chosen over ~1M because it
    # learns the arithmetic task in fewer CPU-seconds (a step costs ~1/3), which is what the
    # 10-minute budget of the demo run (warm start + RL on 2 cores) needs.
    "small": dict(hidden_size=96, intermediate_size=256, num_hidden_layers=3, num_attention_heads=3),
    # ~1.8M parameters: the built-in teacher (grpoplus.sft.warmstart.teacher_recipe), stronger than "small" on the
    # same character tokenizer, for distillation into the default policy.
    "medium": dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=6),
}


def tiny_config(vocab_size: int, *, size: str = "small", **overrides) -> LlamaConfig:
    """A ``LlamaConfig`` of one of the ``SIZES``; ``overrides`` replace any config field.

    Raises ``ValueError`` for an unknown size.
    """
    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; choose one of: {', '.join(SIZES)}")
    fields = dict(
        vocab_size=vocab_size,
        max_position_embeddings=256,
        num_key_value_heads=SIZES[size]["num_attention_heads"],
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
    )
    fields.update(SIZES[size])
    fields.update(overrides)
    return LlamaConfig(**fields)


def tiny_model(tokenizer: PreTrainedTokenizerBase, *, size: str = "small", seed: int = 0,
               **overrides) -> LlamaForCausalLM:
    """A randomly initialised fp32 tiny Llama for ``tokenizer``; same ``seed`` -> same weights.
    ``overrides`` are LlamaConfig fields on top of the ``size`` preset (e.g. ``hidden_size``).
    A size of ``MOE_SIZES`` ("moe", "moe-nano") gives the tiny Qwen3-MoE of :mod:`grpoplus.models.moe`; an
    architecture of ``FAMILIES`` (``"qwen3_5_text"``) its small model (:mod:`grpoplus.models.families`).

    The special-token ids of the tokenizer are written into the config and the generation
    config, so ``model.generate`` stops at ``<eos>`` and pads with ``<pad>``.
    """
    if size in FAMILIES:  # the built-in model of another architecture, at the small size
        return tiny_family_model(tokenizer, size, size="small", seed=seed, **overrides)
    special = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                   eos_token_id=tokenizer.eos_token_id)
    if size in MOE_SIZES:
        config, cls = tiny_moe_config(len(tokenizer), size=size, **special, **overrides), Qwen3MoeForCausalLM
    else:
        config, cls = tiny_config(len(tokenizer), size=size, **special, **overrides), LlamaForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config).to(torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def tiny_moe_model(tokenizer: PreTrainedTokenizerBase, *, size: str = "moe", seed: int = 0,
                   **overrides) -> Qwen3MoeForCausalLM:
    """A randomly initialised fp32 tiny Qwen3-MoE for ``tokenizer``; same ``seed`` -> same weights
    (``tiny_model`` with an MoE size; ``overrides`` are Qwen3MoeConfig fields)."""
    return tiny_model(tokenizer, size=size, seed=seed, **overrides)
