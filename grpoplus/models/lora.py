"""LoRA adapters on the policy (Hu et al. 2021, arXiv:2106.09685) with ``peft``.

The learner trains ``W + (alpha / r) B A`` for the adapted linear layers, ``B`` [out, r]
starting at zero and ``A`` [r, in] random, so the adapted policy starts equal to the
base model; only ``A`` and ``B`` require grad. Three consumers need the policy in
other forms, and this module gives each one without a second copy of the base model:

- the reference policy for KL is the base model itself: :func:`adapters_off` runs a
  block with the adapters disabled;
- the in-process sampler runs a plain module (:func:`plain_model`) that shares every
  base parameter and holds its own weight only for the adapted layers, refreshed as
  ``W + delta W`` at each sync (:func:`merge_into`): a decode step then costs what the
  base model's does. A 4-bit base (:mod:`grpoplus.models.qlora`) cannot hold ``W + delta W``
  (re-quantising it would round the adapters' update away): the sampler runs the policy itself;
- checkpoints hold the adapters only (:func:`save_adapters`, :func:`load_adapters`); the
  base weights come from the model path again on resume.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import torch

from grpoplus.models.cpu_matmul import route_like
from grpoplus.models.qlora import is_4bit, plain_linear_types
from grpoplus.models.vision import is_vision_model, is_vision_part

ADAPTER_FILE = "adapter_model.safetensors"
INSTALL_HINT = "pip install peft (or pip install -e '.[lora]')"


def require_peft() -> None:
    if importlib.util.find_spec("peft") is None:
        from grpoplus.core.needs import unmet

        unmet(ImportError(f"learner.lora_rank > 0 trains LoRA adapters with the peft package, which is not "
                          f"installed: {INSTALL_HINT}"))


def add_lora(model: torch.nn.Module, rank: int, alpha: float, dropout: float, target_modules: list[str]
             ) -> torch.nn.Module:
    """``model`` wrapped in a peft ``PeftModel`` with rank-``rank`` adapters on ``target_modules``
    (module names such as ``q_proj``, or ``["all-linear"]``: every linear layer but the LM head).
    The base parameters are frozen; the adapters' ``A`` is drawn from torch's global generator. A 4-bit base
    (:func:`grpoplus.models.qlora.quantize_base`) gets peft's 4-bit LoRA layers, prepared by peft for k-bit
    training (gradient checkpointing stays learner.gradient_checkpointing's)."""
    require_peft()
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if is_4bit(model):
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    targets = _all_linear(model) if list(target_modules) == ["all-linear"] else list(target_modules)
    if is_vision_model(model):  # the language model's layers only: the vision tower stays as it is
        targets = language_linears(model, None if list(target_modules) == ["all-linear"] else list(target_modules))
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none",
                        task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, config)
    except ValueError as err:  # peft names the modules it did not find
        names = sorted({name.rpartition(".")[2] for name, m in model.named_modules()
                        if isinstance(m, torch.nn.Linear)})
        raise ValueError(f"learner.lora_target_modules={list(target_modules)}: {str(err).splitlines()[0]}; "
                         f"the model's linear layers are {', '.join(names)} (or use all-linear)") from None


def language_linears(model: torch.nn.Module, names: list[str] | None) -> list[str]:
    """A vision-language model's linear layers that get adapters: the language model's (every one but the LM head,
    or those whose last name part is in ``names``), by full name; none of the vision tower's or projector's."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    plain = plain_linear_types(model)
    return [name for name, m in model.named_modules() if type(m) in plain and m is not head
            and not is_vision_part(name) and (names is None or name.rpartition(".")[2] in names)] or list(names or [])


def _all_linear(model: torch.nn.Module) -> str | list[str]:
    """peft's ``all-linear`` (every linear layer but the LM head), without the modules that subclass ``nn.Linear``
    but compute something else (Llama 4's router returns its scores and logits): then the plain ones by name."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linear = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head]
    plain = plain_linear_types(model)
    if all(type(m) in plain for _, m in linear):
        return "all-linear"
    return [name for name, m in linear if type(m) in plain]


def is_lora(model: torch.nn.Module) -> bool:
    """True for a policy wrapped by :func:`add_lora` (a peft model)."""
    return hasattr(model, "get_base_model") and hasattr(model, "peft_config")


def compute_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose forward computes the policy: a peft model's base model (its layers carry
    the adapters), any other model itself."""
    return model.get_base_model() if is_lora(model) else model


def adapters_off(model: torch.nn.Module):
    """Context manager: inside it ``model`` computes the base policy (the KL reference)."""
    return model.disable_adapter()


def _adapted(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Module name (in the base model) -> its LoRA layer."""
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in compute_module(model).named_modules() if isinstance(m, LoraLayer)}


def plain_model(model: torch.nn.Module, merged: bool = True) -> torch.nn.Module:
    """A module of the base architecture without LoRA layers, for inference.

    Every parameter of the base model is shared (no copy); each adapted layer becomes an
    ``nn.Linear`` with its own weight, ``W + delta W`` when ``merged`` (refresh it with
    :func:`merge_into`), else the base weight itself (shared: the base model as saved for
    an engine that applies adapters itself). Gradients off, eval mode. A 4-bit base is refused.
    """
    _refuse_4bit(model)
    base, layers = compute_module(model), _adapted(model)
    shared = {id(p): p for p in base.parameters()}  # deepcopy keeps these objects
    plain = copy.deepcopy(base, memo=shared)
    modules = dict(plain.named_modules())
    for name, layer in layers.items():
        inner = layer.get_base_layer()
        linear = torch.nn.Linear(inner.in_features, inner.out_features, bias=False, device=inner.weight.device,
                                 dtype=inner.weight.dtype)
        linear.weight = torch.nn.Parameter(inner.weight.detach().clone() if merged else inner.weight,
                                           requires_grad=False)
        linear.bias = inner.bias
        route_like(linear, inner)  # multiplied as the layer it stands in for (grpoplus.models.cpu_matmul)
        parent, _, child = name.rpartition(".")
        setattr(modules[parent] if parent else plain, child, linear)
    if merged:
        merge_into(plain, model)
    return plain.requires_grad_(False).eval()


@torch.no_grad()
def merge_into(plain: torch.nn.Module, model: torch.nn.Module) -> None:
    """Set each adapted layer of ``plain`` (from :func:`plain_model`) to ``W + delta W`` of ``model``'s
    current adapters. Computed from the frozen ``W`` each time: no rounding accumulates over syncs."""
    _refuse_4bit(model)
    modules = dict(plain.named_modules())
    for name, layer in _adapted(model).items():
        delta = sum(layer.get_delta_weight(adapter) for adapter in layer.active_adapters)  # [out, in]
        torch.add(layer.get_base_layer().weight, delta, out=modules[name].weight)


def _refuse_4bit(model: torch.nn.Module) -> None:
    if is_4bit(model):
        raise ValueError("a 4-bit base (learner.quantize) cannot hold its adapters merged into its weights: sample "
                         "the policy itself (rollout.engine=hf does)")


def save_adapters(model: torch.nn.Module, path: Path) -> None:
    """The adapters and their config (peft's ``adapter_config.json`` + ``adapter_model.safetensors``)."""
    model.save_pretrained(path, safe_serialization=True)


def load_adapters(model: torch.nn.Module, path: Path) -> None:
    """Load adapters saved by :func:`save_adapters` into ``model`` (same rank and targets) in place."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    file = Path(path) / ADAPTER_FILE
    if not file.is_file():
        raise ValueError(f"checkpoint {path} holds no LoRA adapters ({ADAPTER_FILE}): it was saved by a run "
                         "without learner.lora_rank; resume it with the same setting")
    state = load_file(file)
    own = {k: v.shape for k, v in get_peft_model_state_dict(model).items()}
    if {k: v.shape for k, v in state.items()} != own:
        differ = sorted(set(own).symmetric_difference(state))[:3] or [k for k in own if own[k] != state[k].shape][:3]
        raise ValueError(f"checkpoint {path} holds adapters that do not match the model's (e.g. {differ}): "
                         "resume with the lora_rank and lora_target_modules of the run that saved it")
    set_peft_model_state_dict(model, state)
