"""What a machine offers a run: library versions, the device, its memory, bf16, TF32 and NCCL.

:func:`environment` gathers the facts (nothing here fails: a missing piece is reported as such);
:func:`device_problem` says in one line why the chosen device cannot run the checks at all.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess

import torch

from grpoplus import __version__
from grpoplus.models.device import cpuinfo

CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
"""The /proc/cpuinfo flags that decide CPU speed in fp32 and bf16 (oneDNN's kernels)."""


def environment(device: str) -> dict:
    """Versions and the facts of ``device`` (a CPU, or a CUDA device)."""
    facts = {"grpoplus": __version__, "python": platform.python_version(), "torch": torch.__version__,
             "transformers": _version("transformers"), "peft": _version("peft"), "cpu_cores": os.cpu_count(),
             "cpu_flags": cpu_flags()}
    facts.update(_cuda_facts(device) if device.startswith("cuda") else _cpu_facts())
    return facts


def device_problem(device: str) -> str | None:
    """Why the checks cannot run on ``device`` at all, in one line; None when they can."""
    if not device.startswith("cuda"):
        return None if device == "cpu" else f"--device {device}: choose cuda, cuda:N or cpu"
    if torch.version.cuda is None:
        return (f"--device {device}: torch {torch.__version__} is a CPU build (torch.version.cuda is None): "
                "install a CUDA build of torch, or use --device cpu")
    if not torch.cuda.is_available():
        return (f"--device {device}: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device "
                "(torch.cuda.is_available() is False): check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES")
    index = torch.device(device).index or 0
    if index >= torch.cuda.device_count():
        return f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible"
    return None


def bf16_problem(device: str) -> str | None:
    """Why ``learner.precision=bf16_mixed`` is refused on ``device``, in one line; None when it runs."""
    if device.startswith("cuda") and not torch.cuda.is_bf16_supported(including_emulation=False):
        name = torch.cuda.get_device_name(device)
        major, minor = torch.cuda.get_device_capability(device)
        return (f"{name} (compute capability {major}.{minor}) has no native bfloat16 (8.0 or newer has it): "
                "learner.precision=bf16_mixed is refused on it; train with learner.precision=fp32")
    return None


def nccl_problem() -> str | None:
    """Why NCCL cannot run collectives here, in one line; None when it can."""
    import torch.distributed as dist

    if not dist.is_available():
        return f"torch {torch.__version__} was built without torch.distributed: NCCL cannot run"
    if not dist.is_nccl_available():
        return (f"torch {torch.__version__} has no NCCL backend: sharded and data-parallel learners cannot run on "
                "GPUs (install a CUDA build of torch with NCCL)")
    return None


def cpu_flags() -> list[str]:
    """Those of :data:`CPU_FLAGS` this CPU has (empty where /proc/cpuinfo is not readable)."""
    have = set(cpuinfo("flags").split())
    return [flag for flag in CPU_FLAGS if flag in have]


def _cpu_facts() -> dict:
    from grpoplus.learner.precision import cpu_has_native_bf16
    from grpoplus.models.cpu_matmul import cpu_vendor, uses_onednn

    return {"device": "cpu", "device_name": cpuinfo("model name") or platform.machine(),
            "vendor": cpu_vendor(), "bf16_native": cpu_has_native_bf16(), "tf32": False,
            "threads": torch.get_num_threads(), "fp32_products": "onednn" if uses_onednn("auto") else "torch"}


def _cuda_facts(device: str) -> dict:
    facts: dict = {"device": device, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
                   "nccl": _nccl_version(), "driver": _driver_version()}
    if device_problem(device) is not None:
        return facts
    props = torch.cuda.get_device_properties(device)
    free, total = torch.cuda.mem_get_info(device)
    facts.update({"device_name": props.name, "device_count": torch.cuda.device_count(),
                  "capability": f"{props.major}.{props.minor}", "memory_total_gb": round(total / 1e9, 1),
                  "memory_free_gb": round(free / 1e9, 1), "multiprocessors": props.multi_processor_count,
                  "bf16_native": bf16_problem(device) is None, "tf32": props.major >= 8,
                  "cudnn": torch.backends.cudnn.version()})
    return facts


def _nccl_version() -> str | None:
    if nccl_problem() is not None:
        return None
    try:
        version = torch.cuda.nccl.version()
    except (RuntimeError, AttributeError):
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _driver_version() -> str | None:
    """The NVIDIA driver's version, from nvidia-smi when it is on PATH."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
