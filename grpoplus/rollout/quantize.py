"""Low-precision sampler weights for the in-process engine: the sampler/learner mismatch, for real.

- ``none``: the sampler is the learner's own module (no copy, no gap beyond kernel order).
- ``bf16_rounded``: a copy whose weights are rounded to bfloat16 and computed in float32:
  the gap of bf16 weights alone (this CPU has no bf16 arithmetic to run a bf16 engine).
- ``int8``: a copy whose ``nn.Linear`` layers are int8 kernels (PyTorch's dynamic
  quantization: int8 weights per output channel, activations quantized per batch at run
  time, int8 GEMM via fbgemm/oneDNN), the low-precision rollout setting of the off-policy
  RL literature. CPU only; on a GPU use the vLLM engine's quantization.
"""

from __future__ import annotations

import copy
import warnings

import torch

QUANTIZATIONS = ("none", "bf16_rounded", "int8")


def check_quantization(quantization: str, device: str | torch.device, dtype: torch.dtype = torch.float32) -> None:
    """Refuse sampler weights the hf engine cannot sample with on ``device`` in ``dtype``: the one statement of these
    refusals, for the engine (its Python callers too) and the config rule ``sampler_weights`` (``device`` =
    learner.device, ``dtype`` = learner.precision's)."""
    if quantization == "fp8":
        raise ValueError("rollout.quantization=fp8 needs fp8 GPU kernels: use rollout.engine=vllm on a GPU, or "
                         "rollout.quantization=int8 (the hf engine's CPU int8 kernels) or bf16_rounded")
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"rollout engine 'hf': quantization={quantization!r} is not available; choose one of: "
                         f"{', '.join(QUANTIZATIONS)}")
    if quantization == "int8" and torch.device(device).type != "cpu":
        raise ValueError(f"rollout.quantization=int8 with rollout.engine=hf uses CPU int8 kernels, but "
                         f"learner.device={device}: use rollout.engine=vllm with rollout.quantization=int8")
    if quantization == "int8" and dtype != torch.float32:
        raise ValueError("rollout.quantization=int8 samples with int8 kernels, which do not run under the bfloat16 "
                         "autocast of learner.precision=bf16_mixed: use learner.precision=fp32 with it, or "
                         "rollout.quantization=none")


def sampler_model(model: torch.nn.Module, quantization: str) -> torch.nn.Module:
    """The module the engine samples with: ``model`` itself, or a low-precision copy of it."""
    if quantization == "none":
        return model
    sampler = copy.deepcopy(model).requires_grad_(False).eval()
    if quantization == "bf16_rounded":
        with torch.no_grad():
            for p in sampler.parameters():
                p.copy_(p.to(torch.bfloat16).to(p.dtype))
        return sampler
    with warnings.catch_warnings():  # torch.ao's eager quantization warns that it moves to torchao
        warnings.simplefilter("ignore")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        return quantize_dynamic(sampler, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8,
                                inplace=True)
