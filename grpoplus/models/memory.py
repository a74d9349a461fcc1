"""Will the model fit? Parameter count before loading, the memory training it needs, and giving freed memory back.

Loading a model too large for the machine ends in the kernel's out-of-memory killer, or in
swapping for an hour, long after the mistake was made. The parameter count is read
without loading any weight (a Hugging Face dir: its ``config.json`` instantiated on the
``meta`` device; a GGUF file: the tensor shapes in its header), and the run is refused
with the numbers when training cannot fit in the memory available now.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import re
import struct
from dataclasses import replace
from pathlib import Path

import torch

from grpoplus.models.footprint import MARGIN, Footprint, need_bytes, process_items
from grpoplus.models.sizes import ModelSize

_GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
_GGUF_STRING, _GGUF_ARRAY = 8, 9


EAGER_TRIM_LAYERS = 6
"""``run.release_memory=eager``: freed memory goes back every this many decoder-layer passes of a backward
(every 3 layers when prompts are shared: each layer runs once for the prompts, once for the responses)."""


def give_back_freed_memory() -> bool:
    """glibc: return the free pages of the process's heaps to the system (``malloc_trim(0)``).

    glibc keeps freed blocks below its mapping threshold (which it raises up to 32 MiB as large
    tensors come and go) for reuse, so after a rollout and a learner pass the resident size holds
    the free space both left behind. Called between the two phases, the next phase starts from what
    is live. Returns False where the C library is not glibc (nothing done).
    """
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def hf_parameter_count(path: Path) -> int:
    """Parameters of the model a Hugging Face dir describes (its config.json, no weights read)."""
    return hf_parameter_counts(path)[0]


def hf_parameter_counts(path: Path) -> tuple[int, int]:
    """(parameters, of which a vision-language model's vision tower and projector) of the model a Hugging Face dir
    describes (its config.json, no weights read)."""
    from transformers import AutoConfig

    try:
        json.loads((path / "config.json").read_text())
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - boundary: a user's file, whatever transformers makes of it, in one line
        raise ValueError(f"model dir {str(path)!r}: config.json is not a usable model config "
                         f"({str(err).splitlines()[0]}); point at a Hugging Face model dir") from None
    return config_parameter_counts(config)


def config_parameter_counts(config) -> tuple[int, int]:
    """(parameters, of which the vision tower and projector) of the model a transformers ``config`` describes, built
    on the meta device."""
    from transformers import AutoModelForCausalLM

    from grpoplus.models.vision import vision_parameters

    with torch.device("meta"):
        if getattr(config, "vision_config", None) is not None:  # an image-text-to-text model, vision tower included
            from transformers import AutoModelForImageTextToText

            model = AutoModelForImageTextToText.from_config(config)
        else:
            model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters()), vision_parameters(model)


def gguf_parameter_count(file: Path) -> int:
    """Parameters of a GGUF file: the sum of its tensors' element counts, read from the header."""
    with open(file, "rb") as handle:
        data = handle.read(min(os.path.getsize(file), 64 << 20))  # header: metadata + tensor table
    try:
        if data[:4] != b"GGUF":
            raise ValueError("no GGUF magic")
        n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
        at = 24
        for _ in range(n_kv):
            at = _skip_string(data, at)
            (kind,), at = struct.unpack_from("<I", data, at), at + 4
            at = _skip_value(data, at, kind)
        total = 0
        for _ in range(n_tensors):
            at = _skip_string(data, at)
            (n_dims,), at = struct.unpack_from("<I", data, at), at + 4
            total += math.prod(struct.unpack_from(f"<{n_dims}Q", data, at))
            at += 8 * n_dims + 12  # dims, then the type (u32) and the offset (u64)
        return total
    except (struct.error, ValueError, KeyError) as err:
        raise ValueError(f"{str(file)!r} is not a readable GGUF file ({err})") from None


def _skip_string(data: bytes, at: int) -> int:
    (length,) = struct.unpack_from("<Q", data, at)
    return at + 8 + length


def _skip_value(data: bytes, at: int, kind: int) -> int:
    if kind == _GGUF_STRING:
        return _skip_string(data, at)
    if kind == _GGUF_ARRAY:
        inner, count = struct.unpack_from("<IQ", data, at)
        at += 12
        if inner in _GGUF_SCALARS:
            return at + count * _GGUF_SCALARS[inner]
        for _ in range(count):
            at = _skip_value(data, at, inner)
        return at
    return at + _GGUF_SCALARS[kind]


def available_bytes(device: torch.device) -> int:
    """Memory free for this process now: the accelerator's free memory, or the OS's MemAvailable."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as handle:
            fields = dict(line.split(":", 1) for line in handle)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_fits(size: ModelSize, device: str | torch.device, footprint: Footprint) -> None:
    """Raise ``ValueError`` with the estimate and the memory available when the process cannot hold the policy as
    ``footprint`` says it does (:mod:`grpoplus.models.footprint`, the dry run's model of the same bytes)."""
    device = torch.device(device)
    need, free = need_bytes(footprint, size), available_bytes(device)
    if need <= free:
        return
    name, params, gb = size.name, size.params or 0, 1e9
    if not footprint.trains:
        raise ValueError(f"model {name!r} has {params / 1e9:.2f}B parameters: about {need / gb:.1f} GB to hold it, "
                         f"but {free / gb:.1f} GB is available on {device.type}; serve it with vLLM and name its URL")
    what = "QLoRA" if footprint.quantize != "none" else "LoRA" if footprint.lora_rank else "full fine-tuning"
    held = ", ".join(re.split(r",| \(", item.what)[0] for item in process_items(footprint, size))
    lora = need_bytes(replace(footprint, lora_rank=16, freeze=()), size)
    hint = "a smaller model" if footprint.lora_rank else (f"a smaller model, more ranks with learner.strategy=fsdp2, "
                                                          f"or LoRA (learner.lora_rank=16: about {lora / gb:.1f} GB)")
    raise ValueError(
        f"model {name!r} has {params / 1e9:.2f}B parameters: {what} needs about {need / gb:.1f} GB ({held}; "
        f"+{MARGIN - 1:.0%} for activations) but {free / gb:.1f} GB is available on {device.type}; use {hint}")


AUTO_ROWS = 1 << 30  # learner.micro_batch_size=auto: no row cap; the token budget bounds each micro-batch


def auto_token_budget(model: torch.nn.Module, precision: str, checkpointing: bool, row_tokens: int = 0) -> int:
    """``learner.micro_batch_size=auto``: the most tokens (rows x padded width) a micro-batch may take, from the
    device's free memory now (the model, its reference and teacher loaded), less the gradients and AdamW moments its
    first update still allocates and the head's working memory, over the activations a token keeps
    (:func:`grpoplus.models.footprint.activation_bytes_per_token`). Refused in one line, with the figures, when the
    longest row (``row_tokens``; 0: the model's context) does not fit, or the architecture is not one it can size."""
    import sys

    from grpoplus.data.lengths import model_context
    from grpoplus.models.device import compute_device
    from grpoplus.models.footprint import activation_bytes_per_token, token_budget
    from grpoplus.models.sizes import arch_from_config

    arch = arch_from_config(model.config.to_dict())
    if arch is None:
        raise ValueError(f"learner.micro_batch_size=auto sizes the activations of Llama-style decoders, not this "
                         f"{model.config.model_type!r} model: set learner.micro_batch_size to a number")
    device = compute_device(model)
    trained = [p for p in model.parameters() if p.requires_grad]
    pending = sum(3 * p.numel() * p.element_size() for p in trained)  # a gradient and two moments per weight
    free, per_token = available_bytes(device), activation_bytes_per_token(arch, precision, checkpointing)
    budget, longest = token_budget(free, pending, per_token), row_tokens or model_context(model.config) or 0
    gb = 1e9
    figures = (f"{free / gb:.1f} GB free on {device.type}, {pending / gb:.2f} GB of gradients and AdamW moments to "
               f"come, {per_token / 1024:.0f} KiB of activations per token")
    if budget < max(longest, 1):
        raise ValueError(f"learner.micro_batch_size=auto: {figures} leave room for {budget} tokens, fewer than the "
                         f"longest row's {longest}: free memory, shorten rows (data.max_prompt_tokens, "
                         "rollout.max_new_tokens), or turn on learner.gradient_checkpointing")
    print(f"grpoplus: learner.micro_batch_size=auto: micro-batches of up to {budget} tokens ({figures})",
          file=sys.stderr)
    return budget
