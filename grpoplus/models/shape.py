"""A model config's shape, read layer by layer: the one place grpoplus reads widths, head counts and head sizes.

A config may be heterogeneous: transformers gives each layer its own config (``config.per_layer_config``) where the
layers differ (Gemma 4's full-attention layers have a head size and key/value heads of their own), and reading such
an attribute on the whole config raises ``AmbiguousGlobalPerLayerAttributeError``. A multimodal config holds its
language model's config inside (``get_text_config``). These helpers read the decoder's layers either way.
"""

from __future__ import annotations


def text_config(config):
    """The decoder's config: the config itself, or a multimodal config's language model config."""
    getter = getattr(config, "get_text_config", None)
    return getter(decoder=True) if getter is not None else config


def layer_configs(config) -> list:
    """Each decoder layer's config: its own where the config is heterogeneous, else the decoder's config once per
    layer (at least one)."""
    text = text_config(config)
    if getattr(text, "is_heterogeneous", False):
        return list(text.per_layer_config)
    return [text] * max(1, int(getattr(text, "num_hidden_layers", 1) or 1))


def head_size(layer) -> int:
    """A layer's attention head size: its ``head_dim``, else its hidden size over its heads."""
    return getattr(layer, "head_dim", None) or layer.hidden_size // layer.num_attention_heads


def attention_width(config) -> float:
    """Query heads x head size, averaged over the decoder's layers: the FLOPs of an attention score are 4 x this."""
    layers = layer_configs(config)
    return sum(getattr(layer, "num_attention_heads", 1) * head_size(layer) for layer in layers) / len(layers)
