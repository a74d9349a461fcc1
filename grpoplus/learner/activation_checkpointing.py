"""Activation checkpointing of the learner's training forward (``learner.gradient_checkpointing``).

Without it, autograd keeps every decoder layer's intermediate tensors (attention inputs,
the MLP's [tokens x intermediate] products, ...) from the forward until the backward has
used them: on SmolLM2-135M that is most of the learner's memory beyond weights, gradients
and optimizer state. With it, each decoder layer keeps only its inputs and is run again
in the backward, when its gradients are due (``torch.utils.checkpoint``, non-reentrant,
random state restored): one more forward of the body per update, the same numbers.

Transformers' own switch (``gradient_checkpointing_enable``) drops the key/value cache of a
checkpointed layer, which the shared-prompt forward (:mod:`~grpoplus.learner.shared_prompt`)
needs; here the layers are wrapped for the duration of one forward instead, cache kept (its
updates are pure functions, so the recompute sees what the forward saw).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import torch
from torch.utils.checkpoint import checkpoint
from transformers.modeling_layers import GradientCheckpointingLayer

from grpoplus.models.lora import compute_module


def checkpointable_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of ``model`` (those transformers marks as checkpointable); empty if it has none."""
    return [m for m in compute_module(model).modules() if isinstance(m, GradientCheckpointingLayer)]


def require_checkpointable(model: torch.nn.Module) -> None:
    """Refuse ``learner.gradient_checkpointing`` for a model with no decoder layers to checkpoint, in one line."""
    if not checkpointable_layers(model):
        raise ValueError(f"learner.gradient_checkpointing=true needs a transformers decoder model; "
                         f"{type(compute_module(model)).__name__} has no checkpointable layers: set it to false")


def _recomputed(forward, *args, **kwargs):
    if not torch.is_grad_enabled():  # a no-grad pass keeps nothing for backward anyway
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


@contextmanager
def checkpointed_layers(model: torch.nn.Module, enabled: bool = True) -> Iterator[None]:
    """Within the block, every decoder layer of ``model`` under grad keeps only its inputs for backward.

    The backward may run after the block: the recompute calls the layer's own forward.
    ``enabled=False``: a no-op, so callers need no branch.
    """
    with wrapped_forwards(checkpointable_layers(model) if enabled else [], lambda f: partial(_recomputed, f)):
        yield


@contextmanager
def wrapped_forwards(layers: list[torch.nn.Module], wrap: Callable) -> Iterator[None]:
    """Within the block, each layer's forward is ``wrap(forward)`` (an instance attribute); after it, the
    forward the layer had: its class's, or one set on the instance (e.g. by accelerate)."""
    own = [layer.__dict__.get("forward") for layer in layers]
    for layer in layers:
        layer.forward = wrap(layer.forward)
    try:
        yield
    finally:
        for layer, forward in zip(layers, own):
            if forward is None:
                del layer.forward  # the class's method again
            else:
                layer.forward = forward
