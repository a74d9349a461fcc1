"""Memory per device for a dry run: the plan's placement, each device holding what the run's one memory model
(:mod:`grpoplus.models.footprint`, which the loader's check sums) says its roles keep resident, plus the frozen
reference and teacher on every learner rank. Not counted: activations (they grow with ``learner.micro_batch_size``
and the sequence length), the allocator's slack and the CUDA context; KV caches on a GPU are sized roughly beside
the total, not in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from grpoplus.dryrun.tokens import Tokens
from grpoplus.models.footprint import (
    FP32,
    Footprint,
    Item,
    engine_items,
    frozen_item,
    param_bytes,
    policy_items,
    total,
    whole_copy_item,
)
from grpoplus.models.sizes import ModelSize
from grpoplus.plan import RunPlan

VLLM_GPU_UTILIZATION = 0.9  # vLLM's own default share of the GPU's memory


@dataclass
class Device:
    """One device (or ``count`` alike), the roles on it, what they keep resident, and what is sized or
    reserved beside the total (``aside``)."""

    label: str
    roles: str
    count: int = 1
    items: list[Item] = field(default_factory=list)
    aside: list[str] = field(default_factory=list)

    @property
    def total(self) -> int | None:
        return total(self.items)


def estimate_memory(plan: RunPlan, policy: ModelSize, teacher: ModelSize | None, tokens: Tokens) -> list[Device]:
    """The devices of the plan's placement with their resident memory (``teacher``: a local teacher, else None)."""
    devices = _ray_devices(plan, policy, teacher, tokens) if plan.placement.cluster == "ray" else \
        _local_devices(plan, policy, teacher, tokens)
    devices += filter(None, [_host_copy_device(plan, policy)])
    where = plan.placement
    label = _label(plan, 1, where.ranks - 1)
    if where.ranks > 1:
        others = where.ranks - 1
        devices.append(Device(label, f"learner ranks 1-{others}, each", others,
                              learner_items(plan, policy, teacher, rank=1)))
    if where.cluster == "ray":
        devices.append(Device("the driver's host memory", "driver (loads the policy on its CPU to hand the weights "
                              "out)", 1, [Item("the policy, fp32", param_bytes(policy.params, FP32)),
                                          Item("its weights in Ray's object store", param_bytes(policy.params, FP32))]))
    return devices


def _local_devices(plan: RunPlan, policy: ModelSize, teacher: ModelSize | None, tokens: Tokens) -> list[Device]:
    fp = plan.learner.policy.footprint
    first = Device(_label(plan, 0), f"learner rank 0 + rollout engine {fp.engine} (the driver's process)")
    first.items = learner_items(plan, policy, teacher, rank=0) + engine_items(fp, policy)
    first.aside = _engine_aside(plan, fp, policy, tokens, workers=1)
    return [first]


def _ray_devices(plan: RunPlan, policy: ModelSize, teacher: ModelSize | None, tokens: Tokens) -> list[Device]:
    where, engine = plan.placement, plan.rollout.engine.name
    label = _label(plan, 0)
    host = where.on_gpus and engine == "vllm"  # a vLLM worker's own copy stays in host memory, beside vLLM's on the GPU
    worker = replace(plan.learner.policy.footprint, trains=False, whole_copy=False, engine=engine, own_copy=not host)
    devices = [Device(label, f"rollout worker ({engine}), each", where.rollout_workers, engine_items(worker, policy),
                      _engine_aside(plan, worker, policy, tokens, workers=where.rollout_workers))]
    if host:
        devices.append(Device("a rollout worker's host memory", "rollout worker's copy of the policy (vLLM starts from "
                              "it and takes the synced weights through it), each", where.rollout_workers,
                              [Item("the policy, fp32", param_bytes(policy.params, FP32))]))
    devices.append(Device(label, "learner rank 0", 1, learner_items(plan, policy, teacher, rank=0)))
    return devices


def _label(plan: RunPlan, first: int, last: int | None = None) -> str:
    """``cuda:0``, ``cuda:1-7`` (a rank's local device), ``1 GPU each`` on Ray, or the CPU's memory."""
    where = plan.placement
    if where.cluster == "ray":
        return "1 GPU each" if where.on_gpus else "cpu (a Ray node's memory)"
    if not where.on_gpus:
        return "cpu (host memory)"
    if where.device != "cuda":
        return where.device
    return f"cuda:{first}" if last is None or last == first else f"cuda:{first}-{last}"


def learner_items(plan: RunPlan, policy: ModelSize, teacher: ModelSize | None, rank: int) -> list[Item]:
    """What learner rank ``rank`` keeps on its device: the trained policy (its shard; rank 0's whole copy beside it
    under fsdp2 unless that copy lives in host memory), the reference and the teacher."""
    fp = plan.learner.policy.footprint
    return policy_items(replace(fp, whole_copy=fp.whole_copy and rank == 0), policy) + \
        _frozen_items(plan, policy, teacher)


def _frozen_items(plan: RunPlan, policy: ModelSize, teacher: ModelSize | None) -> list[Item]:
    """The frozen KL reference as the learner decides it (a copy when beta > 0 without LoRA; sharded like the
    policy under fsdp2) and a local teacher, both on every learner rank."""
    items, precision, where = [], plan.learner.update.precision, plan.placement
    if plan.learner.reference == "copy":
        if where.sharded:  # float32 shards, gathered in the compute dtype to run
            items.append(Item(f"reference, fp32, frozen, a 1/{where.shards} shard",
                              param_bytes(policy.params, FP32, where.shards)))
        else:
            items.append(frozen_item(precision, policy, "reference"))
    if teacher is not None:
        items.append(frozen_item(precision, teacher, f"teacher {teacher.name}"))
    return items


def _host_copy_device(plan: RunPlan, policy: ModelSize) -> Device | None:
    """The host memory of a sharded learner's rank 0 on GPUs when its whole copy of the policy lives there."""
    if not plan.placement.whole_copy_in_host_memory:
        return None
    return Device("learner rank 0's host memory", "learner rank 0's whole-policy copy (checkpoints, weights to the "
                  "engines)", 1, [whole_copy_item(policy)])


def _engine_aside(plan: RunPlan, fp: Footprint, policy: ModelSize, tokens: Tokens, workers: int) -> list[str]:
    """What an engine takes beside the total: vLLM's share of a GPU, and a rough KV cache size."""
    aside = [] if fp.engine in ("hf", "vllm") else [f"rollout engine {fp.engine}: its own memory is not estimated"]
    extra = dict(fp.engine_kwargs)
    if fp.engine == "vllm" and fp.on_gpus and "kv_cache_memory_bytes" not in extra:
        share = extra.get("gpu_memory_utilization")
        said = f"gpu_memory_utilization={share}" if share is not None else \
            f"gpu_memory_utilization={VLLM_GPU_UTILIZATION} (vLLM's default: not set in rollout.engine_kwargs)"
        sleep = ("; it sleeps (frees it) during each update" if extra.get("sleep_between_steps")
                 else "; held during the update too (rollout.engine_kwargs.sleep_between_steps: true frees it)")
        aside.append(f"vLLM takes {said} of the GPU's memory for its weights, KV cache and activations, not in the "
                     f"total{sleep}")
    kv = kv_cache_note(plan, policy, tokens, workers)
    return aside + ([kv] if kv else [])


def kv_cache_note(plan: RunPlan, policy: ModelSize, tokens: Tokens, workers: int) -> str | None:
    """A rough KV cache size: the rows an engine decodes at once, each at its longest, x the bytes per token."""
    from grpoplus.models.footprint import COMPUTE_BYTES

    if policy.arch is None:
        return None
    seqs = plan.rollout.engine.max_num_seqs
    rows = seqs or -(-tokens.rows // workers)
    length = tokens.longest_row or tokens.budget
    per_token = policy.arch.kv_bytes_per_token(COMPUTE_BYTES[plan.learner.update.precision])
    what = "prompt + response" if tokens.longest_row else "responses only: prompt length unknown"
    at_once = "rollout.max_num_seqs" if seqs else \
        "the whole batch at once" if workers == 1 else "a worker's share of the batch at once"
    return (f"KV cache, rough: {rows} rows x {length} tokens ({what}) x {per_token / 1024:.0f} KiB per token = "
            f"{gigabytes(rows * length * per_token)} ({at_once}; not in the total)")


def gigabytes(size: int | None) -> str:
    """``12.30 GB`` or ``3.4 MB`` (powers of 10, as the loader's own memory check says them), or ``unknown``."""
    if size is None:
        return "unknown"
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"
