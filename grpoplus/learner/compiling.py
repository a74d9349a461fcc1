"""Compiled learner forwards and backwards (``learner.compile``): each decoder layer through ``torch.compile``.

What is compiled is the decoder layer, one graph for every layer of a class (their code is one function; the
parameters are the graph's inputs), forward and backward (AOTAutograd): inductor's C++ kernels on a CPU, Triton on a
GPU. The rest stays eager on purpose: the attention mask and packed-sequence detection of the body (data-dependent
branches that would break or multiply graphs), the chunked LM head (a Python loop over chunks of matmuls) and the
loss (small). This is torchtitan's per-block compilation; it composes with what wraps a layer from outside
(activation checkpointing recomputes the compiled layer; FSDP2's hooks gather and free around it).

Shapes: a micro-batch's rows and width vary from step to step, so the layers compile with dynamic shapes
(``dynamic=True``): one graph per kind of forward (with or without grad, attention mask or packed, autocast or
not), not one per width. ``compiled_graphs`` counts them for the step's metrics.

A forward that carries a key/value cache (the shared-prompt path, :mod:`~grpoplus.learner.shared_prompt`) runs its
layers eagerly: the cache is indexed by the layer's number, so dynamo would compile one graph per layer, past its
recompilation limit on a real model. With ``learner.compile`` the plan therefore turns prompt sharing off
(:func:`grpoplus.plan.run.shares_prompts`): every row is computed whole, through the compiled layers.

A compilation that fails (dynamo cannot trace the layer, inductor cannot build a kernel, a layer would need more
graphs than dynamo's recompilation limit) does not end the run: the failing call runs eagerly, one line says why,
and that layer class stays eager for the rest of the process. The backward graph is compiled with the forward where
it keeps symbolic sizes (as here); where AOTAutograd defers it, or retries it, to the first backward, a failure
there is not caught: it would end the update with inductor's error.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
from torch._dynamo.exc import FailOnRecompileLimitHit, TorchDynamoException

from grpoplus.learner.activation_checkpointing import checkpointable_layers, wrapped_forwards

COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
"""torch.compile modes the learner may use; reduce-overhead (CUDA graphs) is not one: a graph per shape of a
training step whose shapes change every step would be recorded again and again."""

LAYER_GRAPHS = 16
"""Graphs one layer class may compile (dynamo's recompilation limit, raised to this while a layer runs): one per kind
of forward (grad or not, padded or packed, autocast or not, LoRA adapters on or off, ...), with room; a layer that
specialises on its own index would need one per layer and fails into the eager fallback instead."""

_COMPILED: dict[tuple[type, str], object] = {}  # (layer class, mode) -> the compiled forward, or None once it failed


def compiled_forward(layer_class: type, mode: str):
    """The compiled ``layer_class.forward`` for ``mode`` (compiled lazily on its first call), None once it failed."""
    key = (layer_class, mode)
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(layer_class.forward, mode=None if mode == "default" else mode, dynamic=True)
    return _COMPILED[key]


def _call(layer: torch.nn.Module, mode: str, eager, *args, **kwargs):
    fn = compiled_forward(type(layer), mode)
    if fn is None or kwargs.get("past_key_values") is not None:  # a cache: the shared-prompt path, see the module
        return eager(*args, **kwargs)
    limit = max(torch._dynamo.config.recompile_limit, LAYER_GRAPHS)
    try:  # past the recompilation limit dynamo would run the layer eagerly without a word: fail, and say so here
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True, recompile_limit=limit):
            return fn(layer, *args, **kwargs)
    except (TorchDynamoException, FailOnRecompileLimitHit) as err:
        _COMPILED[(type(layer), mode)] = None
        print(f"grpoplus: note: learner.compile: compiling {type(layer).__name__} failed ({_reason(err, limit)}); it "
              "runs eagerly from now on", file=sys.stderr)
        return eager(*args, **kwargs)


def _reason(err: Exception, limit: int) -> str:
    if isinstance(err, FailOnRecompileLimitHit):
        return f"it needed more than {limit} graphs (torch._dynamo.config.recompile_limit)"
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0][:200] if text else ''}"


@contextmanager
def compiled_layers(model: torch.nn.Module, mode: str | None) -> Iterator[None]:
    """Within the block, ``model``'s decoder layers run compiled (the backward of what they computed too, after
    the block). ``mode`` off (or None): a no-op. A layer whose forward was replaced on the instance (e.g. by accelerate's
    hooks) stays eager: its class's forward is not what it runs."""
    layers = [m for m in checkpointable_layers(model) if "forward" not in m.__dict__] \
        if mode not in (None, "off") else []
    with wrapped_forwards(layers, lambda forward: partial(_call, forward.__self__, mode, forward)):
        yield


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (each recompilation for a new kind of input is one more)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_refusal(model: torch.nn.Module, routing: bool) -> str | None:
    """Why ``model``'s learner forwards cannot be compiled, or None where they can."""
    if routing:  # the routing hooks replay and record inside the layer, per call, from Python state
        return "an MoE policy's routing hooks (recorded, replayed or measured per forward) run inside its layers"
    if not checkpointable_layers(model):
        return f"{type(model).__name__} has no transformers decoder layers to compile"
    return None


def check_compile(enabled: bool, mode: str, model: torch.nn.Module, routing: bool) -> str | None:
    """The mode the learner compiles ``model``'s layers with, or None (eager): ``enabled`` where it can, else one
    line on stderr and eager layers."""
    if not enabled:
        return None
    if mode not in COMPILE_MODES:
        raise ValueError(f"learner.compile_mode={mode!r} is not one of {', '.join(COMPILE_MODES)}")
    why = compile_refusal(model, routing)
    if why is None:
        return mode
    print(f"grpoplus: note: learner.compile=true runs this model's layers eagerly: {why}", file=sys.stderr)
    return None
