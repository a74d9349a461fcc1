"""``learner.strategy=fsdp2``: parameters, gradients and optimizer state sharded over the learner ranks.

torch's FSDP2 (``fully_shard``, Zhao et al. 2023, "PyTorch FSDP", arXiv:2304.11277) on every
decoder layer and then on the causal LM itself (embedding, final norm, head): each rank keeps
1/N of every parameter and of its AdamW moments, all-gathers a layer's parameters just before
the layer runs and reduce-scatters its gradient in the backward. gloo on a CPU, NCCL on GPUs,
one code path.

Three things follow from every forward being a collective, and the learner honours them:

- the learner's log-probs run as an FSDP forward method of the root (``LEARNER_FORWARD``): the
  learner calls the body and uses the head's weight itself, outside the root's ``forward``, so
  the root's hooks (unshard before, reduce-scatter after) are attached to that method instead;
- every rank runs the same number of forwards: each rank prepares the whole batch, scoring an equal
  share of its rows in the no-grad passes (the last share padded with copies of a row), and takes an
  equal number of micro-batches of each mini-batch, a rank short of one running a copy of one of its
  own with no loss (:class:`grpoplus.distributed.rank_hooks.ShardHooks`);
- every forward runs the same layers the same number of times: a shared-prompt forward runs its
  prompt pass and its response pass whatever the rows (``share_prompts="always"``), where one
  process skips the second pass when no two rows share a prompt.

Gradients are summed over the ranks (the loss is normalised over the whole mini-batch,
ALGORITHMS.md section 3), not averaged: FSDP2's divide factor is 1 and the reduction a sum.
With ``learner.precision=bf16_mixed`` the layers' parameters are all-gathered in bf16 and their
gradients reduced in float32 (FSDP2's ``MixedPrecisionPolicy``); the sharded master weights stay float32.

No rank builds the sharded model whole: every rank builds it on the meta device from rank 0's
model class and configuration (:func:`sharded_twin`), shards it, allocates only its own shards and
receives them from rank 0, one tensor at a time (``set_model_state_dict(broadcast_from_rank0=True)``).
The frozen reference of ``beta > 0`` is sharded the same way. Rank 0 alone holds the policy whole:
the model it loaded becomes its plain copy (the *mirror*): the in-process engine samples
with it, checkpoints write it, and after every update it is refreshed one tensor at a time (each
gathered whole from its shards, so the extra memory is one tensor: :func:`grpoplus.rollout.weights.gather_into`). A
checkpoint's optimizer state - twice the weights with AdamW - is never gathered: every rank writes its own
shards with ``torch.distributed.checkpoint`` (:func:`save_optimizer_shards`), and any strategy
or number of ranks reads them back (:func:`grpoplus.learner.checkpoint.load_optimizer`).
"""

from __future__ import annotations

import types
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict, set_model_state_dict
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
    register_fsdp_forward_method,
)

from grpoplus.learner.logprobs import LEARNER_FORWARD, logprobs_of
from grpoplus.learner.precision import COMPUTE_DTYPES
from grpoplus.models.device import set_compute_device

LANGUAGE_MODELS = ("language_model", "text_model")
"""Where a vision-language model keeps its language model under ``model.model`` (Qwen's and Gemma 3's, Idefics3's)."""


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers FSDP2 shards one by one: ``model.model.layers``, or a vision-language model's language
    model's."""
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    for name in LANGUAGE_MODELS:
        layers = layers if layers is not None else getattr(getattr(body, name, None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise ValueError(f"learner.strategy=fsdp2 shards a causal LM's decoder layers (model.model.layers); "
                         f"{type(model).__name__} has none: use learner.strategy=replicate")
    return list(layers)


def vision_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """A vision-language model's vision tower and projector, each sharded as one unit (gathered once per forward
    that reads images, beside the language model's layers); none in a text model."""
    from grpoplus.models.vision import VISION_PARTS

    body = getattr(model, "model", None)
    return [module for name, module in (body.named_children() if body is not None else ()) if name in VISION_PARTS]


def model_spec(model: torch.nn.Module) -> tuple:
    """What builds an empty twin of ``model`` on another rank: its class, configuration and train/eval mode."""
    return type(model), model.config, model.training


def sharded_twin(spec: tuple, whole: torch.nn.Module | None, device: torch.device, precision: str,
                 offload: bool = False, frozen: bool = False) -> torch.nn.Module:
    """Every rank: the model of ``spec`` (:func:`model_spec` of rank 0's) built on the meta device, sharded, its
    own shards allocated on ``device`` and filled from rank 0's ``whole`` model (None on the other ranks), one
    tensor at a time; no rank allocates the whole model. ``frozen``: the reference, no gradients."""
    cls, config, training = spec
    with torch.device("meta"):
        model = cls(config)
    model.train(training and not frozen).requires_grad_(not frozen)
    shard(model, precision, offload, device)
    model.to_empty(device="cpu" if offload else device)  # offloaded shards live in CPU memory, buffers on the GPU
    if offload:
        for module in model.modules():
            module._buffers.update({name: b.to(device) for name, b in module._buffers.items() if b is not None})
        set_compute_device(model, device)  # the learner's batches go to the GPU, not where the shards are
    fill_from_rank0(model, whole)
    return model


def fill_from_rank0(model: torch.nn.Module, whole: torch.nn.Module | None) -> None:
    """Every rank: its shards of rank 0's ``whole`` tensors (None on the other ranks) and rank 0's buffers (not
    sharded; a rotary embedding's are not in the state dict)."""
    state = {} if whole is None else whole.state_dict()
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    theirs = {} if whole is None else dict(whole.named_buffers())
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if whole is not None:
                buffer.copy_(theirs[name])
            dist.broadcast(buffer, src=0)


# A vision-language policy's learner forward calls the root's own forward (its logits, a slice of the head's output)
# inside the root's learner-forward method: FSDP2 warns that a view is returned, for fear of an in-place write into it
# that would drop its backward hook. The learner writes into no logits in place (tests/distributed/test_sharded.py: the
# sharded vision-language run trains like one process), so the warning would only alarm.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDP\w+ForConditionalGeneration\) returned a view")


def shard(model: torch.nn.Module, precision: str, offload: bool = False,
          device: torch.device | None = None) -> torch.nn.Module:
    """Shard ``model`` in place over the default process group (every rank calls this with the same weights, or
    with a model on the meta device, ``device`` then naming where its shards go);
    ``offload``: the shards live in CPU memory and each layer is copied to the GPU to run (learner.cpu_offload)."""
    device = device or next(model.parameters()).device
    # FSDP2's default mesh and NCCL streams live on the current device; "cuda" without an index (a Ray actor's
    # one GPU) is the current device already, and torch.cuda.set_device refuses a device without an index
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    policy = MixedPrecisionPolicy(param_dtype=COMPUTE_DTYPES[precision], reduce_dtype=torch.float32) \
        if precision != "fp32" else MixedPrecisionPolicy()
    placement = CPUOffloadPolicy() if offload else OffloadPolicy()
    for layer in [*decoder_layers(model), *vision_units(model)]:
        fully_shard(layer, mp_policy=policy, offload_policy=placement)
    fully_shard(model, mp_policy=policy, offload_policy=placement)
    setattr(model, LEARNER_FORWARD, types.MethodType(lambda self, *args, **kwargs: logprobs_of(self, *args, **kwargs),
                                                     model))
    register_fsdp_forward_method(model, LEARNER_FORWARD)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # the sum over ranks: the loss is normalised globally
            module.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
    return model


def save_optimizer_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Every rank: its shards of the optimizer state into the ``torch.distributed.checkpoint`` directory
    ``path`` (a collective; nothing is gathered: each rank writes its own file)."""
    dcp.save(get_optimizer_state_dict(model, optimizer), checkpoint_id=str(path))
