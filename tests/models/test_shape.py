"""A config's shape read layer by layer: layers of different head sizes (Gemma 4's real layout), a multimodal config's
language model, and the packing cost model that reads them."""

import pytest
from transformers import AutoModelForCausalLM, Gemma3Config, LlamaConfig

from grpoplus.learner.activation_checkpointing import checkpointable_layers
from grpoplus.learner.packing import layer_flops
from grpoplus.models.families import HEAD_DIM, family_config
from grpoplus.models.shape import attention_width, head_size, layer_configs, text_config


def test_a_gemma4_config_has_its_full_attention_layers_own_head_size():
    config = family_config("gemma4_text", 64)
    kinds = list(config.layer_types)
    sizes = [head_size(layer) for layer in layer_configs(config)]
    assert sizes == [2 * HEAD_DIM if kind == "full_attention" else HEAD_DIM for kind in kinds]
    assert len(set(sizes)) == 2  # heterogeneous: what a read of config.head_dim refuses
    with pytest.raises(Exception, match="per-layer attribute"):
        config.head_dim  # noqa: B018


def test_a_uniform_config_repeats_itself_per_layer():
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=3, intermediate_size=128)
    assert layer_configs(config) == [config] * 3 and head_size(config) == 16 and attention_width(config) == 64


def test_a_multimodal_config_is_read_through_its_language_model():
    config = Gemma3Config(text_config=dict(hidden_size=96, num_attention_heads=3, head_dim=40, num_hidden_layers=2,
                                           intermediate_size=128))
    assert text_config(config) is config.text_config and attention_width(config) == 3 * 40


def test_the_packing_cost_of_a_model_whose_layers_differ_is_their_mean():
    model = AutoModelForCausalLM.from_config(family_config("gemma4_text", 64))
    layers = checkpointable_layers(model)
    widths = [layer.num_attention_heads * head_size(layer) for layer in layer_configs(model.config)]
    per_token, per_score, _ = layer_flops(model)
    assert per_token == 2 * sum(p.numel() for layer in layers for p in layer.parameters()) / len(layers)
    assert per_score == 4 * sum(widths) / len(widths) and len(set(widths)) == 2
