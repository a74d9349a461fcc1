"""Numeric precision of the learner's forwards and of the sampler (``learner.precision``, ``learner.tf32``).

- ``fp32``: parameters, activations, gradients and optimizer state in float32 (the exact
  path: every log-prob equality test runs on it).
- ``bf16_mixed``: float32 master weights, gradients and AdamW state; the matmuls of every
  learner forward (the policy's, the reference's, the recomputed pi_old) run in bfloat16
  under ``torch.autocast`` (Micikevicius et al. 2018, "Mixed Precision Training",
  arXiv:1710.03740, with bf16 in place of fp16 so no loss scaling is needed), the residual
  stream and norms stay float32 (transformers computes them in the input's dtype), and the
  log-softmax over the vocabulary and the loss are taken in float32
  (:mod:`grpoplus.learner.logprobs`). The frozen reference keeps its linear weights in
  bfloat16 (what autocast would cast them to anyway: the same numbers, half the memory), and
  the rollout engines sample in bfloat16 (the hf engine's decode under autocast on bf16
  reordered weights, vLLM with ``dtype=bfloat16``), so the sampler/learner mismatch metrics
  (``mismatch/*``) measure the real bf16 gap.

``learner.tf32``: float32 matmuls on an NVIDIA GPU use TF32 tensor cores (10-bit mantissa
inputs, float32 accumulation); no effect on a CPU.
"""

from __future__ import annotations

import sys

import torch

from grpoplus.models.device import autocast_to

PRECISIONS = ("fp32", "bf16_mixed")
"""The values of ``learner.precision``."""

COMPUTE_DTYPES = {"fp32": torch.float32, "bf16_mixed": torch.bfloat16}
"""The dtype the matmuls run in, per ``learner.precision``: the learner's autocast, FSDP2's gathered
parameters, the frozen reference's linear weights, the rollout engines."""


def _device_type(device: str | torch.device) -> str:
    return torch.device(device).type


def autocast(precision: str, device: str | torch.device):
    """The context every learner forward runs in: bf16 autocast for ``bf16_mixed``, nothing for ``fp32``."""
    return autocast_to(COMPUTE_DTYPES[precision], device)


def check_precision(precision: str, device: str | torch.device) -> None:
    """Refuse a precision the device cannot run; say on stderr when bf16 runs without native support."""
    if precision not in PRECISIONS:
        raise ValueError(f"learner.precision={precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return
    kind = _device_type(device)
    if kind == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise ValueError(f"learner.precision={precision}: {torch.cuda.get_device_name(device)} has no native bfloat16 "
                         "(NVIDIA compute capability 8.0 or newer has it): use learner.precision=fp32")
    if kind == "cpu" and not cpu_has_native_bf16():
        print(f"note: learner.precision={precision}: this CPU has no native bfloat16 instructions (avx512_bf16 or "
              "AMX), so bf16 matmuls are emulated and slower than fp32; learner.precision=fp32 is faster here",
              file=sys.stderr)


def cpu_has_native_bf16() -> bool:
    """True where oneDNN runs bfloat16 matmuls on native instructions (avx512_bf16, AMX)."""
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def set_tf32(enabled: bool) -> None:
    """TF32 for float32 matmuls on NVIDIA GPUs (this process), or IEEE float32 (torch's own default)."""
    torch.backends.cuda.matmul.fp32_precision = "tf32" if enabled else "ieee"


def lower_frozen_linears(model: torch.nn.Module, precision: str) -> torch.nn.Module:
    """A frozen model (the reference) with its linear weights stored in the compute dtype of ``precision``.

    Under bf16 autocast a float32 linear weight is cast to bfloat16 at every forward: storing it
    in bfloat16 gives the same numbers for half its memory. A weight shared with another module
    (a head tied to the embedding) stays as it is: the embedding lookup is not autocast."""
    if precision == "fp32":
        return model
    dtype = COMPUTE_DTYPES[precision]
    shared = {id(p) for m in model.modules() if not isinstance(m, torch.nn.Linear)
              for p in m.parameters(recurse=False)}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and id(module.weight) not in shared:
            module.to(dtype)
    return model
