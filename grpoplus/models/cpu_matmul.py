"""Float32 linear layers on a CPU through oneDNN instead of torch's BLAS, where that is the faster library.

PyTorch's x86 wheels multiply float32 matrices with MKL, which runs its generic AVX2 kernels on AMD processors.
oneDNN, the library PyTorch bundles for its CPU inference kernels, has AVX-512 kernels of its own. On a 2-core AMD
EPYC with ``avx512_vp2intersect`` and ``avx_vnni`` (2026-11-27) a float32 product of SmolLM2's learner shapes (768 x
576 by 576 x 1536 and the like) ran 2-2.3x faster through oneDNN than through MKL, for the forward product and both
backward ones (``dX = dY W``, ``dW = dY^T X``); on a 2-core EPYC without those two flags (2026-11-29) the two
libraries were level over a whole forward and backward (``benchmarks/cpu_matmul.py`` measures a machine; its record
is in ``docs/results/smollm2-speed.md``). The same numbers to float32 rounding either way.

The routing is scoped to the models grpoplus loads: :func:`route` marks each ``nn.Linear`` of one model (a plain
attribute, kept through a copy, pickling, peft's wrapping and FSDP2's class swap), and :func:`use_cpu_matmul`, called
by a run's process setup only (never on import or on loading a model), sets the process's mode. A marked layer (and
:func:`mm`, the chunked LM head's products, where its head is marked) then sends float32 CPU products to oneDNN
(``torch.ops.mkldnn._linear_pointwise``, which reads the weight as it is stored: no copy), with a backward of its own
of the same products; a layer of any other model (a library user's own) computes as torch does. Everything else
keeps torch's path too: other dtypes, autocast (``learner.precision=bf16_mixed``), GPUs, tensor subclasses (sharded
DTensors, 4-bit weights), tracing under ``torch.compile``. The mode (``learner.cpu_matmul``): ``auto`` uses oneDNN
on AMD x86 CPUs (where it was measured faster) and torch's BLAS elsewhere; ``onednn`` and ``torch`` force one.
"""

from __future__ import annotations

import functools
import platform

import torch
import torch.nn.functional as F

from grpoplus.models.device import cpuinfo

MODES = ("auto", "onednn", "torch")
MARK = "grpoplus_cpu_matmul"
"""The attribute :func:`route` sets on a linear layer of a model grpoplus loaded."""
_state = {"active": False, "installed": False, "every": False}
_PLAIN = (torch.Tensor, torch.nn.Parameter)


@functools.cache
def onednn_available() -> bool:
    """True where this torch has oneDNN's linear op (x86 and arm64 CPU builds)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def cpu_vendor() -> str:
    """The CPU's ``vendor_id`` (GenuineIntel, AuthenticAMD, ...; empty where /proc/cpuinfo does not say)."""
    return cpuinfo("vendor_id")


def uses_onednn(mode: str) -> bool:
    """Whether ``mode`` sends float32 CPU products to oneDNN on this machine; refuses an unknown mode, and
    ``onednn`` where this torch lacks it, in one line."""
    if mode not in MODES:
        raise ValueError(f"learner.cpu_matmul={mode!r}: expected one of {', '.join(MODES)}")
    if mode == "onednn" and not onednn_available():
        raise ValueError(f"learner.cpu_matmul=onednn: this torch {torch.__version__} has no oneDNN linear op "
                         "(torch.ops.mkldnn._linear_pointwise); use learner.cpu_matmul=auto or torch")
    if mode == "auto":
        return onednn_available() and platform.machine() in ("x86_64", "AMD64") and cpu_vendor() == "AuthenticAMD"
    return mode == "onednn"


def auto_choice() -> str:
    """What ``learner.cpu_matmul=auto`` picks on this machine, and why, in one line."""
    if not onednn_available():
        return f"torch's BLAS: this torch {torch.__version__} has no oneDNN linear op"
    if uses_onednn("auto"):
        return ("oneDNN: an AMD x86 CPU, where torch's MKL runs generic AVX2 kernels; oneDNN was measured 2-2.3x "
                "faster on the learner's float32 products on one AMD EPYC and level on another")
    return (f"torch's BLAS: a {cpu_vendor() or platform.machine()} CPU (oneDNN is picked on AMD x86 only, where it "
            "was measured faster; learner.cpu_matmul=onednn forces it)")


def use_cpu_matmul(mode: str) -> bool:
    """Route the float32 CPU products of the layers :func:`route` marked by ``mode`` from now on in this process (a
    run's process setup calls it); returns whether oneDNN is used."""
    _state["active"] = uses_onednn(mode)
    if not _state["installed"]:  # unmarked layers keep torch's own computation (_linear_forward)
        torch.nn.Linear.forward = _linear_forward
        _state["installed"] = True
    return _state["active"]


def reset() -> None:
    """Undo :func:`use_cpu_matmul` (tests): ``nn.Linear`` gets torch's forward back and nothing is routed."""
    if _state["installed"]:
        torch.nn.Linear.forward = _TORCH_FORWARD
    _state.update(active=False, installed=False, every=False)


def route_every_layer(on: bool = True) -> None:
    """Treat every ``nn.Linear`` of this process as marked (``on``), for a process whose models all stand for ones a
    run loads: the test suite builds its tiny models directly and multiplies them as a run would its own."""
    _state["every"] = on


def route(model: torch.nn.Module) -> torch.nn.Module:
    """Mark every ``nn.Linear`` of ``model`` for the process's mode (:func:`use_cpu_matmul`); returns ``model``."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            setattr(module, MARK, True)
    return model


def route_like(module: torch.nn.Module, source: torch.nn.Module) -> torch.nn.Module:
    """Mark ``module`` (a layer made to stand in for ``source``) as ``source`` is marked; returns ``module``."""
    if source.__dict__.get(MARK, False):
        setattr(module, MARK, True)
    return module


def routes(module: torch.nn.Module) -> bool:
    """Whether ``module``'s float32 CPU products go to oneDNN: it is marked (or every layer is) and the process's mode
    says so."""
    return _state["active"] and (_state["every"] or module.__dict__.get(MARK, False))


def in_use() -> bool:
    """Whether this process sends the float32 CPU products of marked layers to oneDNN."""
    return _state["installed"] and _state["active"]


_TORCH_FORWARD = torch.nn.Linear.forward


def _linear_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if _state["every"] or self.__dict__.get(MARK, False):
        return linear(x, self.weight, self.bias)
    return F.linear(x, self.weight, self.bias)


def _routed(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (_state["active"] and type(x) in _PLAIN and type(weight) in _PLAIN and x.device.type == "cpu"
            and x.dtype == weight.dtype == torch.float32 and x.numel() > 0 and weight.numel() > 0
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling())


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` by oneDNN (``weight`` [out, in], either memory order)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, by oneDNN where routed (with its backward), else torch's."""
    if not _routed(x, weight) or (bias is not None and type(bias) not in _PLAIN):
        return F.linear(x, weight, bias)
    grads = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    return _Linear.apply(x, weight, bias) if grads else onednn_linear(x, weight, bias)


def mm(a: torch.Tensor, b: torch.Tensor, onednn: bool = True) -> torch.Tensor:
    """``a @ b`` for 2-D ``a`` [M, K] and ``b`` [K, N] in a custom autograd function's forward or backward, by oneDNN
    where routed (``onednn``: the caller's layer is, :func:`routes`); torch's differentiable product where grad mode is
    on (a backward building a second derivative)."""
    routed = onednn and _routed(a, b) and a.dim() == b.dim() == 2 and not torch.is_grad_enabled()
    return onednn_linear(a, b.T) if routed else a @ b


class _Linear(torch.autograd.Function):
    """``x W^T + b`` and its backward, every product by oneDNN: ``dX = dY W``, ``dW = dY^T X``, ``db = sum dY``
    (through :func:`mm`: torch's differentiable products when the backward builds a graph for a second derivative)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return onednn_linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        rows = grad.reshape(-1, grad.shape[-1])  # [M, out]; mm takes torch's product under create_graph
        d_x = mm(rows, weight).view(*grad.shape[:-1], weight.shape[1]) if need_x else None
        d_w = mm(rows.T, x.reshape(-1, x.shape[-1])) if need_w else None
        d_b = rows.sum(0) if need_b and ctx.has_bias else None
        return d_x, d_w, d_b
