"""Tiny random vision-language models with their processors, built offline from transformers' own config classes.

What the architecture matrix and the tests of image rows run on: each family's real layout (its vision tower, its
projector, its image placeholder tokens, its positions: Qwen's multimodal rotary positions, Gemma 3's bidirectional
image block over sliding and full attention layers) at toy scale: a text model of hidden size 64 and 2 layers, a
vision tower of 1 layer and hidden size 32, about 0.1-0.2M parameters. The tokenizer is the built-in character one
(:mod:`grpoplus.models.tokenizer`) with the family's special tokens; the image processors are transformers' PIL
ones (no torchvision needed); a 56x56 image becomes 4 placeholder tokens in every family.

Nothing is downloaded. :data:`VISION_FAMILIES` lists the families; :func:`tiny_vision_model` builds one.
"""

from __future__ import annotations

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForImageTextToText, PreTrainedTokenizerFast

from grpoplus.models.tokenizer import ALPHABET, SPECIAL_TOKENS
from grpoplus.models.vision import image_only

TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
            head_dim=32, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False)
"""The text model of every family, at toy scale."""

QWEN_SPECIALS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
    "{% if c.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c.type == 'text' %}{{ c.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
GEMMA_SPECIALS = ("<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>")
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
    "{% if c.type == 'image' %}<start_of_image>{% elif c.type == 'text' %}{{ c.text }}{% endif %}{% endfor %}"
    "{% endif %}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
IDEFICS_SPECIALS = ("<|im_start|>", "<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
                    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)))
IDEFICS_TEMPLATE = (
    "<|im_start|>{% for m in messages %}{{ m.role | capitalize }}:"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
    "{% if c.type == 'image' %}<image>{% elif c.type == 'text' %}{{ c.text }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}")


def family_tokenizer(specials: tuple[str, ...], named: dict[str, str]) -> PreTrainedTokenizerFast:
    """The character tokenizer with ``specials`` after its alphabet, never split; ``named``: special tokens a
    processor reads by attribute (``image_token`` -> ``tokenizer.image_token`` and ``.image_token_id``)."""
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for token in (*ALPHABET, *specials):
        vocab.setdefault(token, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                  unk_token="<unk>", padding_side="left", clean_up_tokenization_spaces=False,
                                  model_max_length=4096, extra_special_tokens=dict(named))
    tok.add_special_tokens({"additional_special_tokens": list(specials)}, replace_extra_special_tokens=False)
    return tok


def _ids(tok) -> dict:
    return dict(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)


def _qwen(config_cls, processor_cls, patch: int, rope: dict, vision: dict, text: dict | None = None):
    from transformers import Qwen2VLImageProcessorPil

    tok = family_tokenizer(QWEN_SPECIALS, dict(image_token="<|image_pad|>", video_token="<|video_pad|>",
                                               vision_start_token="<|vision_start|>", vision_end_token="<|vision_end|>"))
    ids = {f"{name}_id": tok.convert_tokens_to_ids(token) for name, token in (
        ("image_token", "<|image_pad|>"), ("video_token", "<|video_pad|>"), ("vision_start_token", "<|vision_start|>"),
        ("vision_end_token", "<|vision_end|>"))}
    text_config = dict(TEXT, vocab_size=len(tok), **_ids(tok), **(text or {}),
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0, **rope})
    config = config_cls(text_config=text_config, vision_config=dict(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=patch, spatial_merge_size=2,
        temporal_patch_size=2, out_hidden_size=64, **vision), **ids)
    unit = (patch * 2) ** 2  # pixels (h x w) of one merged token: from 1 to 16 of them per image
    images = Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                      size={"shortest_edge": unit, "longest_edge": 16 * unit})
    tok.chat_template = QWEN_TEMPLATE  # the tokenizer renders image messages too, as a real model's does
    return config, image_only(processor_cls)(image_processor=images, tokenizer=tok, chat_template=QWEN_TEMPLATE)


def qwen2_5_vl():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLProcessor

    config, processor = _qwen(Qwen2_5_VLConfig, Qwen2_5_VLProcessor, 14, {"mrope_section": [4, 6, 6]},
                              dict(window_size=56, fullatt_block_indexes=[0]))
    return config, processor


def qwen3_vl():
    from transformers import Qwen3VLConfig, Qwen3VLProcessor

    return _qwen(Qwen3VLConfig, Qwen3VLProcessor, 16, {"mrope_section": [6, 5, 5], "mrope_interleaved": True},
                 dict(num_position_embeddings=16, deepstack_visual_indexes=[0]))


def qwen3_5():
    """Qwen3.5, multimodal from the start: Qwen3-VL's vision tower and processor over a hybrid language model (linear
    attention layers, then a full attention one, rotating a quarter of each head by Qwen's three positions)."""
    from transformers import Qwen3_5Config, Qwen3VLProcessor

    from grpoplus.models.families import FAMILIES

    return _qwen(Qwen3_5Config, Qwen3VLProcessor, 16,
                 {"mrope_section": [2, 1, 1], "mrope_interleaved": True, "partial_rotary_factor": 0.25},
                 dict(num_position_embeddings=16), text=dict(FAMILIES["qwen3_5_text"], linear_conv_kernel_dim=4,
                                                             layer_types=["linear_attention", "full_attention"]))


def smolvlm():
    """SmolVLM: Idefics3's layout under its own classes and processor."""
    from transformers import SmolVLMConfig, SmolVLMImageProcessorPil, SmolVLMProcessor

    return _idefics(SmolVLMConfig, SmolVLMImageProcessorPil, image_only(SmolVLMProcessor))


def gemma3():
    from transformers import Gemma3Config, Gemma3ImageProcessorPil, Gemma3Processor

    tok = family_tokenizer(GEMMA_SPECIALS, dict(boi_token="<start_of_image>", eoi_token="<end_of_image>",
                                                image_token="<image_soft_token>"))
    text_config = dict(TEXT, vocab_size=len(tok), **_ids(tok), sliding_window=8, query_pre_attn_scalar=32,
                       layer_types=["sliding_attention", "full_attention"])
    config = Gemma3Config(text_config=text_config, vision_config=dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=7),
        mm_tokens_per_image=4, image_token_index=tok.convert_tokens_to_ids("<image_soft_token>"),
        boi_token_index=tok.convert_tokens_to_ids("<start_of_image>"),
        eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"))
    images = Gemma3ImageProcessorPil(size={"height": 28, "width": 28}, do_pan_and_scan=False)
    tok.chat_template = GEMMA_TEMPLATE
    return config, Gemma3Processor(image_processor=images, tokenizer=tok, chat_template=GEMMA_TEMPLATE,
                                   image_seq_length=4)


def idefics3():
    from transformers import Idefics3Config, Idefics3ImageProcessorPil, Idefics3Processor

    return _idefics(Idefics3Config, Idefics3ImageProcessorPil, Idefics3Processor)


def _idefics(config_cls, images_cls, processor_cls):
    tok = family_tokenizer(IDEFICS_SPECIALS, dict(image_token="<image>", fake_image_token="<fake_token_around_image>",
                                                  global_image_token="<global-img>",
                                                  end_of_utterance_token="<end_of_utterance>"))
    config = config_cls(text_config=dict(TEXT, model_type="llama", vocab_size=len(tok), **_ids(tok)),
                        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=28, patch_size=7),
                        scale_factor=2, image_token_id=tok.convert_tokens_to_ids("<image>"),
                        pad_token_id=tok.pad_token_id)
    images = images_cls(size={"longest_edge": 28}, max_image_size={"longest_edge": 28}, do_image_splitting=False)
    tok.chat_template = IDEFICS_TEMPLATE
    return config, processor_cls(image_processor=images, tokenizer=tok, image_seq_len=4,
                                 chat_template=IDEFICS_TEMPLATE)


VISION_FAMILIES = {"qwen2_5_vl": qwen2_5_vl, "qwen3_vl": qwen3_vl, "qwen3_5": qwen3_5, "gemma3": gemma3,
                   "idefics3": idefics3, "smolvlm": smolvlm}
"""``config.model_type`` -> the builder of its tiny config and processor."""


def tiny_vision_model(family: str, seed: int = 0):
    """``(model, processor)``: the tiny random ``family`` model (float32, eval mode) and its processor."""
    if family not in VISION_FAMILIES:
        raise ValueError(f"no tiny vision-language model of family {family!r}; one of {', '.join(VISION_FAMILIES)}")
    config, processor = VISION_FAMILIES[family]()
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config).float().eval()
    with torch.no_grad():  # matrices a family starts at zero (Gemma 3's image projection): random, so images count
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, 0.02)
    return model, processor
