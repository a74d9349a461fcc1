"""Where a model computes (not always where its parameters are), and in which dtype its matmuls run."""

from __future__ import annotations

from contextlib import nullcontext

import torch

COMPUTE_DEVICE = "grpoplus_compute_device"
"""An attribute naming the device a model runs on when its parameters live elsewhere."""


def compute_device(model: torch.nn.Module) -> torch.device:
    """The device ``model``'s forwards run on: its parameters' device, or the one recorded by
    :func:`set_compute_device` (a sharded learner with ``learner.cpu_offload``: its shards live in host memory and
    FSDP2 copies each layer to the GPU to run, so its inputs, and everything computed from its outputs, belong on
    the GPU)."""
    return getattr(model, COMPUTE_DEVICE, None) or next(model.parameters()).device


def set_compute_device(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    setattr(model, COMPUTE_DEVICE, torch.device(device))
    return model


def autocast_to(dtype: torch.dtype | None, device: str | torch.device):
    """Autocast to ``dtype`` on ``device``'s type; nothing for float32 or None (the weights' own precision)."""
    if dtype is None or dtype == torch.float32:
        return nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def cpuinfo(field: str) -> str:
    """The first value of ``field`` in /proc/cpuinfo ("" where it is not readable): ``model name``, ``vendor_id``,
    ``flags``."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.split(":", 1)[0].strip() == field:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
