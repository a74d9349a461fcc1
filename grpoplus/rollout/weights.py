"""Weight sync: the learner's weights at one version, as every rollout engine takes them.

A *weight source* says where the weights are; every engine's ``sync_weights(source, version)``
loads from any of them, and so does every copy of the policy that is not the learner's own:

- :class:`InProcess`: the whole policy as a module in this process. The hf engine samples with
  the module itself (or its low-precision copy); vLLM streams its tensors.
- :class:`StateDict`: tensors by state-dict name, held in this process (a snapshot taken while
  the learner goes on, or what a Ray rollout worker received through the object store).
- :class:`ObjectStore`: a Ray object-store reference to such a state dict of CPU tensors (learner
  rank 0 to the rollout workers; the driver never holds the weights).
- :class:`Collective`: broadcast from learner rank 0 in the weight-sync group of
  ``ray.weight_sync=collective`` (:mod:`grpoplus.distributed.weight_sync`).
- :class:`Gathered`: an FSDP2-sharded learner's weights, each tensor gathered whole from its
  shards in turn (a collective every learner rank iterates), so the extra memory is one tensor.

A source that is not in a module is loaded into one tensor by tensor (:func:`load_into`): a
Ray worker's or a sampling snapshot's own copy of the policy, or rank 0's plain copy of a
sharded policy. A module passed where a source is expected is :class:`InProcess`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class InProcess:
    """The whole policy as a module in this process."""

    module: torch.nn.Module


@dataclass(frozen=True)
class StateDict:
    """Tensors by state-dict name, in this process."""

    tensors: dict[str, torch.Tensor]


@dataclass(frozen=True)
class ObjectStore:
    """A Ray object-store reference to a state dict of CPU tensors."""

    ref: object  # ray.ObjectRef


@dataclass(frozen=True)
class Collective:
    """Learner rank 0's broadcast to the rollout workers (a ``grpoplus.distributed.weight_sync.Broadcast``)."""

    broadcast: object


@dataclass(frozen=True)
class Gathered:
    """A sharded learner's weights, gathered whole one tensor at a time (every learner rank iterates)."""

    model: torch.nn.Module


WeightSource = InProcess | StateDict | ObjectStore | Collective | Gathered


def as_source(weights) -> WeightSource:
    """``weights`` as a source: a module is :class:`InProcess`."""
    if isinstance(weights, torch.nn.Module):
        return InProcess(weights)
    if isinstance(weights, WeightSource):
        return weights
    raise TypeError(f"weights to sync must be a module or a grpoplus.rollout.weights source, not {type(weights).__name__}")


def tensors(source: WeightSource) -> Iterator[tuple[str, torch.Tensor]]:
    """(state-dict name, whole tensor) of every weight, one at a time."""
    if isinstance(source, InProcess):
        yield from ((name, t.detach()) for name, t in source.module.state_dict().items())
    elif isinstance(source, StateDict):
        yield from source.tensors.items()
    elif isinstance(source, ObjectStore):
        import ray

        yield from ray.get(source.ref).items()
    elif isinstance(source, Gathered):
        from torch.distributed.tensor import DTensor

        for name, t in source.model.state_dict().items():
            yield name, (t.full_tensor() if isinstance(t, DTensor) else t).detach()
    else:
        raise TypeError(f"{type(source).__name__} weights reach the rollout workers by broadcast, not as tensors "
                        "in this process")


def load_into(module: torch.nn.Module, source: WeightSource) -> torch.nn.Module:
    """Copy the source's weights into ``module`` tensor by tensor (no second whole copy) and return it;
    a source that is ``module`` itself is left alone. Names must match the module's state dict exactly."""
    source = as_source(source)
    if isinstance(source, InProcess) and source.module is module:
        return module
    targets = module.state_dict(keep_vars=True)
    seen = set()
    with torch.no_grad():
        for name, tensor in tensors(source):
            if name not in targets:
                raise ValueError(f"the synced weights hold {name!r}, which the receiving "
                                 f"{type(module).__name__} lacks: both sides must load the same learner.model")
            if targets[name].shape != tensor.shape:
                raise ValueError(f"the synced weight {name!r} has shape {tuple(tensor.shape)}, the receiving "
                                 f"{type(module).__name__}'s {tuple(targets[name].shape)}: both sides must load "
                                 "the same learner.model")
            targets[name].copy_(tensor)
            seen.add(name)
    missing = targets.keys() - seen
    if missing:
        raise ValueError(f"the synced weights lack {len(missing)} of the receiving {type(module).__name__}'s "
                         f"tensors (e.g. {sorted(missing)[0]!r}): both sides must load the same learner.model")
    return module


def module_of(weights, own: torch.nn.Module) -> torch.nn.Module:
    """The module holding the weights: an in-process source's own module (shared, not copied), else ``own``
    (the module an engine was built on) loaded from the source."""
    source = as_source(weights)
    return source.module if isinstance(source, InProcess) else load_into(own, source)


def cpu_state_dict(weights) -> dict[str, torch.Tensor]:
    """The source's tensors by name on the CPU (what Ray's object store carries to the rollout workers)."""
    return {name: t.detach().cpu() for name, t in tensors(as_source(weights))}


def snapshot(source: WeightSource) -> StateDict:
    """A copy of the source's weights as they are now (the learner may change them afterwards)."""
    return StateDict({name: t.detach().clone() for name, t in tensors(as_source(source))})


def gather_into(mirror: torch.nn.Module | None, model: torch.nn.Module) -> None:
    """Every rank of a sharded learner: each tensor of ``model`` gathered whole in turn; rank 0 copies them
    into its plain ``mirror`` (the other ranks pass None and only take part in the gathers)."""
    if mirror is not None:
        load_into(mirror, Gathered(model))
        return
    for _ in tensors(Gathered(model)):
        pass
