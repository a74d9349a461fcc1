"""Checkpoints that resume exactly.

A checkpoint is a Hugging Face model directory (weights + tokenizer; for a LoRA policy
the adapters alone, ``adapter_model.safetensors``, the base weights being read from the
model path again) plus ``trainer_state.pt`` (optimizer, scheduler, RNG states, data position, counters) and,
when a reference model is used, ``reference.safetensors``. A sharded learner's optimizer state is
not in ``trainer_state.pt`` but in ``optimizer/``: each rank's shards, written and read with
``torch.distributed.checkpoint``. It is written into a
temporary directory, the ``COMPLETE`` marker is written last, and the directory is then
renamed into place: a run killed while saving leaves only a temporary directory, which
resume ignores, and the previous complete checkpoint is used.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, load_model, save_file, save_model
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule

from grpoplus.core.rundir import RunDir
from grpoplus.models.lora import ADAPTER_FILE, is_lora, load_adapters
from grpoplus.models.vision import processor_of

MARKER = "COMPLETE"
STATE_FILE = "trainer_state.pt"
REF_FILE = "reference.safetensors"
OPTIMIZER_DIR = "optimizer"  # a sharded learner's optimizer state: torch.distributed.checkpoint shards
_STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_dir(run_dir: str | Path) -> Path:
    return RunDir(run_dir).checkpoints


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer, state: dict,
                    ref_model: torch.nn.Module | None = None, keep: int = 2, write_shards=None) -> Path:
    """Write ``checkpoints/step-<step>`` atomically; keep the newest ``keep`` complete ones. ``write_shards``:
    called with the directory being written, before it is marked complete (a sharded learner's ranks write
    their optimizer shards into it)."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if processor_of(tokenizer) is not None:  # a vision-language policy's: the checkpoint loads as a model dir
        processor_of(tokenizer).save_pretrained(tmp)
    torch.save(state, tmp / STATE_FILE)
    if ref_model is not None:
        save_model(ref_model, str(tmp / REF_FILE))  # handles tied embeddings
    if write_shards is not None:
        write_shards(tmp)
    _fsync_dir_files(tmp)
    (tmp / MARKER).write_text(str(step))
    if final.exists():  # a re-save of the same step (e.g. after resume): replace it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    _prune(root, keep)
    return final


def _fsync_dir_files(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())


def _prune(root: Path, keep: int) -> None:
    complete = list_checkpoints(root.parent)
    for old in complete[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-step-*"):
        shutil.rmtree(stale, ignore_errors=True)


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints (marker present), oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / MARKER).is_file():
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    complete = list_checkpoints(run_dir)
    return complete[-1] if complete else None


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load a checkpoint's model weights (a LoRA policy: its adapters) into ``model`` (same architecture) in place."""
    if is_lora(model):
        load_adapters(model, path)
        return
    files = sorted(path.glob("model*.safetensors"))
    if not files and (path / ADAPTER_FILE).is_file():
        raise ValueError(f"checkpoint {path} holds LoRA adapters, not a whole model: resume with the "
                         "learner.lora_rank and lora_target_modules of the run that saved it")
    if not files:
        raise FileNotFoundError(f"checkpoint {path} holds no model*.safetensors file")
    if isinstance(model, FSDPModule):  # learner.strategy=fsdp2: rank 0 reads, every rank keeps its shards
        load_from_rank0(model, lambda: _checked_weights(model, path, files))
    else:
        model.load_state_dict(_checked_weights(model, path, files), strict=False)


def _checked_weights(model: torch.nn.Module, path: Path, files: list[Path]) -> dict:
    state = {}
    for file in files:
        state.update(load_file(file))
    own = model.state_dict()
    # Tied embeddings are saved once; anything else missing means the wrong model.
    missing = [k for k in own if k not in state and not k.endswith("lm_head.weight")]
    unexpected = [k for k in state if k not in own]
    reshaped = [k for k in state if k in own and state[k].shape != own[k].shape]
    if missing or unexpected or reshaped:
        raise ValueError(f"checkpoint {path} does not match the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}, different shapes {reshaped[:5]}")
    return state


def load_from_rank0(model: torch.nn.Module, read) -> None:
    """A sharded model's tensors from what ``read()`` returns on rank 0 (the other ranks read nothing): each
    tensor broadcast in turn, every rank keeping its shards (a tied head is filled with its embedding)."""
    state = read() if dist.get_rank() == 0 else {}
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                                                strict=False))


def whole_state_on_rank0(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A sharded model's whole tensors in rank 0's CPU memory, gathered one at a time (every rank calls this;
    the others get an empty dict)."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def optimizer_state_by_name(state: dict, names: list[str]) -> dict:
    """torch's optimizer state dict (parameters numbered in the optimizer's order) keyed by the parameters'
    ``names`` instead (the form :mod:`torch.distributed.checkpoint.state_dict` reads)."""
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {names[i]: v for i, v in state["state"].items()}, "param_groups": groups}


def optimizer_dir(checkpoint: str | Path) -> Path:
    """Where a checkpoint keeps a sharded learner's optimizer shards."""
    return Path(checkpoint) / OPTIMIZER_DIR


def load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path, state: dict) -> None:
    """The checkpoint's optimizer state into ``optimizer``, whichever strategy wrote it and whichever reads it:
    a sharded learner's shards (``OPTIMIZER_DIR``, read with ``torch.distributed.checkpoint``, which re-shards
    them for any number of ranks or none), or the one-process state in ``state`` (set whole, or cut into
    this rank's shards). Every rank of a learner calls this (a collective when a process group is up)."""
    shards = optimizer_dir(path)
    if shards.is_dir():
        target = get_optimizer_state_dict(model, optimizer)
        dcp.load(target, checkpoint_id=str(shards))
        set_optimizer_state_dict(model, optimizer, target)
    elif isinstance(model, FSDPModule):
        names = [name for name, p in model.named_parameters() if p.requires_grad]
        set_optimizer_state_dict(model, optimizer, optimizer_state_by_name(state["optimizer"], names),
                                 options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(state["optimizer"])


def load_state(path: Path) -> dict:
    """The trainer state of the checkpoint at ``path``, its tensors on the CPU: a GPU run's optimizer state was saved
    on the GPU that wrote it (every rank would otherwise load it onto that one GPU); ``Optimizer.load_state_dict``
    moves each tensor to its parameter's device."""
    return torch.load(path / STATE_FILE, weights_only=False, map_location="cpu")


def load_reference(ref_model: torch.nn.Module, path: Path) -> None:
    if isinstance(ref_model, FSDPModule):  # a sharded learner's reference: rank 0 reads, every rank its shards
        load_from_rank0(ref_model, lambda: load_file(path / REF_FILE))
    else:
        load_model(ref_model, str(path / REF_FILE))


def save_reference(state: dict[str, torch.Tensor], checkpoint: Path, model: torch.nn.Module) -> None:
    """A reference's whole tensors (:func:`whole_state_on_rank0` of the sharded ``model``) into the checkpoint
    being written, as a one-process reference is saved: a tensor tied to others once, under the first name."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    dropped = {name for tied in names.values() for name in sorted(tied)[1:]}
    save_file({name: t.contiguous() for name, t in state.items() if name not in dropped},
              str(Path(checkpoint) / REF_FILE))
