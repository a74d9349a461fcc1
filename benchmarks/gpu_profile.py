"""What ``gpu_vs_trl.py`` adds to each side's step time, so the work between GPU runs starts from numbers:

- the decode's floor: every new token of a rollout reads the weights once (in bfloat16: what an engine needs read)
  and every row's keys and values so far; those bytes over the device's copy bandwidth, measured in the same process
  (:func:`copy_gb_s`), are the least time the rollout's decode can take (:func:`decode_floor_s`);
- a torch profiler summary of one extra step (after the measured ones, so its overhead is in no median): the top
  operators and kernels by time, written to a text file small enough to come back from the GPU machine, and the
  kernel launches it made (CUDA: ``cudaLaunchKernel`` and graph launches; on a CPU the operator calls), per step and
  per new token (:class:`StepProfile`).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")
TOP = 25  # rows of the profiler's table written out


def copy_gb_s(device: str) -> float:
    """The device's copy bandwidth (GB/s: bytes read + written per second) this process gets: a 1 GiB bfloat16 copy
    on a GPU, 128 MiB on a CPU, timed after a warm-up."""
    size = (1 << 30) if device == "cuda" else (128 << 20)
    src = torch.empty(size // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    _sync(device)
    repeats, started = 10, time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    _sync(device)
    seconds = time.perf_counter() - started
    del src, dst
    if device == "cuda":
        torch.cuda.empty_cache()
    return 2 * size * repeats / seconds / 1e9


def decode_floor_s(config, rows: int, prompt_tokens: float, new_tokens: int, gb_s: float) -> float:
    """The least seconds ``new_tokens`` decode steps of ``rows`` rows take at ``gb_s``: each step reads the weights
    once in bfloat16 and each row's keys and values so far (``prompt_tokens`` per row on average, then one more per
    step), in bfloat16."""
    from grpoplus.models.sizes import arch_from_config

    arch = arch_from_config(config.to_dict())
    weights = 2 * arch.parameters()
    per_token = arch.kv_bytes_per_token(2)
    cached = rows * (prompt_tokens * new_tokens + new_tokens * (new_tokens + 1) / 2)  # tokens read, summed over steps
    return (new_tokens * weights + cached * per_token) / (gb_s * 1e9)


class StepProfile:
    """One step under ``torch.profiler``: ``with StepProfile(device) as p: step()``; then :meth:`write`."""

    def __init__(self, device: str):
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.device, self.profiler = device, torch.profiler.profile(activities=activities)

    def __enter__(self) -> StepProfile:
        _sync(self.device)
        self.profiler.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        _sync(self.device)
        self.profiler.__exit__(*exc)

    def launches(self) -> int:
        """Kernel launches of the step (on a CPU: operator calls, what a launch costs there)."""
        events = self.profiler.key_averages()
        if self.device == "cuda":
            return sum(e.count for e in events if e.key in LAUNCHES)
        return sum(e.count for e in events if e.key.startswith("aten::"))

    def write(self, path: Path, title: str) -> None:
        """The top operators and kernels by self time on the device (CPU time on a CPU), with the launch count."""
        sort = "self_cuda_time_total" if self.device == "cuda" else "self_cpu_time_total"
        table = self.profiler.key_averages().table(sort_by=sort, row_limit=TOP, max_name_column_width=60)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{title}\nkernel launches in the step: {self.launches()}\n\n{table}\n")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize(device)
