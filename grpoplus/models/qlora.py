"""QLoRA's frozen 4-bit base (Dettmers et al. 2023, "QLoRA", arXiv:2305.14314) with ``bitsandbytes``.

``learner.quantize=nf4`` (or ``fp4``) turns the linear layers of the decoder blocks into bitsandbytes
``Linear4bit`` layers when the policy is loaded: each weight is stored as 4-bit codes with one float32 scale per
block of 64 (or 32) weights, and dequantised to the compute dtype (the learner's: float32 or bfloat16) inside
each forward. The LM head, the embeddings, the norms and a vision-language model's vision tower stay as loaded.
LoRA adapters (:mod:`grpoplus.models.lora`) then train on top in full precision, the 4-bit weights frozen.

Every way grpoplus loads a model ends in a model in memory (a .gguf file is de-quantised by transformers, the
built-in tiny models are warm-started), so :func:`quantize_base` quantises one in place: transformers' own
bitsandbytes integration picks and swaps the layers (``replace_with_bnb_linear`` with a ``BitsAndBytesConfig``)
and the glue here fills each one from the weight it replaces. Two departures from what loading with
``quantization_config`` would do, both for bitsandbytes' CPU kernels:

- the block size divides each layer's input width (64, else 32): the CPU dequantisation kernel takes a block
  as part of one row, so a row width that 64 does not divide (the built-in models' 96) dequantises wrongly
  with bitsandbytes' default of 64; a layer that neither divides stays as loaded;
- bitsandbytes' CPU inference repacking is off (``support_avx512bf16_for_cpu``): on an avx512_bf16 CPU its first
  forward without gradients (the sampler's) would repack the weight in place into a bf16-only inference layout
  that every later forward, the learner's training forward included, would then take, without a gradient to
  its input. Its optional ``kernels`` package (bitsandbytes names it in a warning at import) is that path's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

BLOCK_SIZES = (64, 32)
"""Block sizes of the 4-bit codes, preferred first: one float32 scale per block (1/16 or 1/8 byte a weight)."""


@dataclass(frozen=True)
class FourBit:
    """How the frozen base is quantised: bitsandbytes' 4-bit data type and the dtype its matmuls compute in."""

    quant_type: str  # nf4 | fp4
    compute_dtype: torch.dtype  # float32 | bfloat16: the learner's precision


def block_size(in_features: int) -> int | None:
    """The largest of :data:`BLOCK_SIZES` that divides a layer's input width (None: the layer stays as loaded)."""
    return next((size for size in BLOCK_SIZES if in_features % size == 0), None)


def stored_bytes(in_features: int, out_features: int) -> int:
    """Bytes one linear weight of this shape takes in the 4-bit base: two codes a byte and a float32 scale per block,
    or float32 as loaded when no block size divides its input width (the dry run's count)."""
    weights, size = in_features * out_features, block_size(in_features)
    return weights * 4 if size is None else weights // 2 + weights // size * 4


def quantize_base(model: torch.nn.Module, four_bit: FourBit) -> torch.nn.Module:
    """``model`` with the plain ``nn.Linear`` layers of its decoder blocks made frozen bitsandbytes ``Linear4bit``
    layers, in place (each full-precision weight is freed once its layer is quantised, on the device it is on).
    Not quantised: the output embedding (the LM head), a vision-language model's vision tower and projector (frozen
    as loaded, so the images read as in the model as published), layers that subclass ``nn.Linear`` to compute something
    else (routers), and layers whose input width no block size divides. Marks the model as peft recognises a
    4-bit base (``is_loaded_in_4bit``), so its adapters wrap the 4-bit layers."""
    import bitsandbytes as bnb
    from transformers import BitsAndBytesConfig
    from transformers.integrations import replace_with_bnb_linear

    from grpoplus.models.vision import is_vision_part

    head = model.get_output_embeddings()
    quantized = {name: m for name, m in model.named_modules() if type(m) is torch.nn.Linear and m is not head
                 and block_size(m.in_features) and not is_vision_part(name)}
    kept = [re.escape(name) + "$" for name, m in model.named_modules()  # exact names: patterns match prefixes too
            if isinstance(m, torch.nn.Linear) and name not in quantized]
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=four_bit.quant_type,
                                bnb_4bit_compute_dtype=four_bit.compute_dtype)
    replace_with_bnb_linear(model, modules_to_not_convert=kept, quantization_config=config)
    for name in list(quantized):
        layer, loaded = model.get_submodule(name), quantized.pop(name)
        if not isinstance(layer, bnb.nn.Linear4bit):
            raise ValueError(f"learner.quantize: transformers did not make {name} a 4-bit layer")
        _fill(layer, loaded, config)
    model.is_loaded_in_4bit = True
    return model


@torch.no_grad()
def _fill(layer: torch.nn.Module, loaded: torch.nn.Linear, config) -> None:
    """Quantise ``loaded``'s weight into the (meta-device) 4-bit ``layer`` that replaces it, as transformers'
    loader does, with the block size of :func:`block_size`."""
    import bitsandbytes as bnb

    weight = loaded.weight.detach()
    layer.weight = bnb.nn.Params4bit(weight.contiguous(), requires_grad=False, blocksize=block_size(loaded.in_features),
                                     compress_statistics=config.bnb_4bit_use_double_quant,
                                     quant_type=config.bnb_4bit_quant_type, quant_storage=config.bnb_4bit_quant_storage,
                                     module=layer).to(weight.device)
    layer.bias = None if loaded.bias is None else torch.nn.Parameter(loaded.bias.detach(), requires_grad=False)
    layer.support_avx512bf16_for_cpu = False  # see the module docstring: no in-place repacking for inference


def is_4bit(model: torch.nn.Module) -> bool:
    """True for a model :func:`quantize_base` quantised, or a peft model wrapped around one."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return bool(getattr(inner, "is_loaded_in_4bit", False))


def plain_linear_types(model: torch.nn.Module) -> tuple[type, ...]:
    """The layer types of ``model`` that compute ``x W^T + b``: ``nn.Linear``, and bitsandbytes' ``Linear4bit`` in a
    4-bit model (subclasses of ``nn.Linear`` that compute something else, such as routers, are not among them)."""
    if not is_4bit(model):
        return (torch.nn.Linear,)
    import bitsandbytes as bnb

    return torch.nn.Linear, bnb.nn.Linear4bit


def parameter_count(model: torch.nn.Module) -> int:
    """Parameters as the model has them before quantisation: a 4-bit weight stores two codes a byte, its shape
    is in its quantisation state."""
    total = 0
    for p in model.parameters():
        shape = getattr(getattr(p, "quant_state", None), "shape", None)
        total += math.prod(shape) if shape is not None else p.numel()
    return total
