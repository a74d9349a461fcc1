"""The hf engine's bfloat16 copy of the linear weights, for a bf16 decode of float32 weights on a GPU.

Under bf16 autocast (``learner.precision=bf16_mixed``) every linear layer of every decode step casts its float32
weight to bfloat16 again: the step reads 4 bytes per weight, writes 2 and reads those 2 (8 bytes where 2 would do)
and launches a cast kernel per layer. A decode step reads every weight once, so it is bound by those bytes: the
engine instead samples a module whose ``nn.Linear`` weights are a bfloat16 copy (:func:`cast_copy`), made once and
refreshed in place at each weight sync (:func:`refresh_cast`), while every other parameter (embeddings, norms) is
the policy's own float32 tensor, shared. Under the same autocast the products are the same ones: autocast casts a
float32 weight to bfloat16 by rounding, as the copy did, so the rollouts are bit for bit those of the float32 module
(tests/rollout/test_cast_weights.py). The copies keep their addresses across syncs, as a captured CUDA graph needs.

On a CPU the engine has oneDNN's reordered copy instead (:func:`grpoplus.rollout.decode_ops.packed_linears`).
"""

from __future__ import annotations

import copy

import torch


def casts_linears(choice: str | bool, device: torch.device, dtype: torch.dtype, model: torch.nn.Module) -> bool:
    """Whether the engine samples ``model`` through a bf16 copy of its linear weights: ``rollout.engine_kwargs``
    ``cast_weights`` true, or ``auto`` (the default): a bf16 decode of float32 linear weights on a GPU."""
    if choice is False or dtype != torch.bfloat16:
        return False
    fp32 = any(type(m) is torch.nn.Linear and m.weight.dtype == torch.float32 for m in model.modules())
    return fp32 and (choice is True or device.type != "cpu")


def cast_copy(model: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """``model`` for sampling: its float32 ``nn.Linear`` weights copied to ``dtype`` (a tied LM head gets its own copy,
    the embedding stays as it is), every other tensor shared (the policy's own); eval mode."""
    linears = _linears(model)
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}  # deepcopy keeps these objects
    sampler = copy.deepcopy(model, memo=shared)
    modules = dict(sampler.named_modules(remove_duplicate=False))
    with torch.no_grad():
        for name, linear in linears.items():
            modules[name].weight = torch.nn.Parameter(linear.weight.detach().to(dtype), requires_grad=False)
    return sampler.eval()


def refresh_cast(sampler: torch.nn.Module, model: torch.nn.Module) -> None:
    """Copy ``model``'s current linear weights into ``sampler``'s (from :func:`cast_copy`), in place."""
    modules = dict(sampler.named_modules(remove_duplicate=False))
    with torch.no_grad():
        for name, linear in _linears(model).items():
            modules[name].weight.copy_(linear.weight)


def _linears(model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    """The float32 plain ``nn.Linear`` layers of ``model`` by module name (a tied head included: its own name)."""
    return {name: m for name, m in model.named_modules(remove_duplicate=False)
            if type(m) is torch.nn.Linear and m.weight.dtype == torch.float32}
