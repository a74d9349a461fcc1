"""Memory per device for a dry run: what each role keeps resident, from the parameter counts alone.

Counted, in bytes per parameter: the policy's float32 master weights (4; ``bf16_mixed`` keeps them float32
too), their gradients (4) and AdamW's two moments (8), all divided by the ranks under ``fsdp2`` and whole on
every rank under ``replicate``; with LoRA the frozen base weights (4; with ``learner.quantize`` the decoder
layers' linear weights 0.5 and a float32 scale per block of 64 or 32) and 16 per adapter parameter; rank 0's
whole-policy copy under ``fsdp2`` (4; in its host memory on GPUs when vLLM or Ray's workers sample); the frozen
reference (4, its linear weights 2 under ``bf16_mixed``; a 1/N shard of 4 under ``fsdp2``) and teacher (the same
but never sharded) on every learner rank; the engines' own copies of the weights. Not counted: activations (they
grow with ``learner.micro_batch_size`` and the sequence length), the allocator's slack and the CUDA context;
KV caches are sized roughly beside the total, not in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpoplus.config import Config
from grpoplus.dryrun.sizes import ModelSize
from grpoplus.dryrun.tokens import Tokens
from grpoplus.plan.placement import on_gpus, shards, whole_copy_in_host_memory
from grpoplus.plan.run import reference_kind

FP32, GRADIENT, ADAMW = 4, 4, 8
"""Bytes per parameter of a float32 weight, its float32 gradient and AdamW's two float32 moments."""
LORA_TRAINED = FP32 + GRADIENT + ADAMW
VLLM_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
VLLM_CPU_KV_BYTES = 1 << 30  # what the vllm engine reserves for its KV cache on a CPU (rollout/vllm_engine.py)
VLLM_GPU_UTILIZATION = 0.9  # vLLM's own default share of the GPU's memory


@dataclass(frozen=True)
class Item:
    what: str
    bytes: int | None  # None: not known (the model's size is unknown)


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
        sizes = [item.bytes for item in self.items]
        return None if None in sizes else sum(sizes)


def estimate_memory(cfg: Config, policy: ModelSize, teacher: ModelSize | None, tokens: Tokens) -> list[Device]:
    """The devices of ``cfg``'s placement with their resident memory (``teacher``: a local teacher, else None)."""
    if cfg.run.cluster == "ray":
        return _ray_devices(cfg, policy, teacher, tokens)
    return _local_devices(cfg, policy, teacher, tokens)


def _local_devices(cfg: Config, policy: ModelSize, teacher: ModelSize | None, tokens: Tokens) -> list[Device]:
    lrn, r = cfg.learner, cfg.rollout
    first = Device(_device_label(lrn.device, 0), f"learner rank 0 + rollout engine {r.engine} (the driver's process)")
    first.items = learner_items(cfg, policy, teacher, rank=0)
    engine, aside = engine_items(cfg, policy, own_copy=r.max_staleness > 0, tokens=tokens, workers=1)
    first.items += engine
    first.aside += aside
    devices = [first, *filter(None, [host_copy_device(cfg, policy)])]
    if lrn.data_parallel > 1:
        others = lrn.data_parallel - 1
        devices.append(Device(_device_label(lrn.device, 1, lrn.data_parallel - 1), f"learner ranks 1-{others}, each",
                              others, learner_items(cfg, policy, teacher, rank=1)))
    return devices


def _ray_devices(cfg: Config, policy: ModelSize, teacher: ModelSize | None, tokens: Tokens) -> list[Device]:
    lrn, r = cfg.learner, cfg.rollout
    gpu = on_gpus(cfg)
    label = "1 GPU each" if gpu else "cpu (a Ray node's memory)"
    host = gpu and r.engine == "vllm"  # a vLLM worker's own copy stays in host memory, beside vLLM's on the GPU
    engine, aside = engine_items(cfg, policy, own_copy=not host, tokens=tokens, workers=r.workers)
    devices = [Device(label, f"rollout worker ({r.engine}), each", r.workers, engine, aside),
               *([Device("a rollout worker's host memory", "rollout worker's copy of the policy (vLLM starts from "
                         "it and takes the synced weights through it), each", r.workers,
                         [Item("the policy, fp32", _bytes(policy.params, FP32))])] if host else []),
               Device(label, "learner rank 0", 1, learner_items(cfg, policy, teacher, rank=0)),
               *filter(None, [host_copy_device(cfg, policy)])]
    if lrn.data_parallel > 1:
        others = lrn.data_parallel - 1
        devices.append(Device(label, f"learner ranks 1-{others}, each", others,
                              learner_items(cfg, policy, teacher, rank=1)))
    devices.append(Device("the driver's host memory", "driver (loads the policy on its CPU to hand the weights out)",
                          1, [Item("the policy, fp32", _bytes(policy.params, FP32)),
                              Item("its weights in Ray's object store", _bytes(policy.params, FP32))]))
    return devices


def _device_label(device: str, first: int, last: int | None = None) -> str:
    """``cuda:0``, ``cuda:1-7`` (a rank's local device), or the CPU's host memory."""
    if not device.startswith("cuda"):
        return "cpu (host memory)"
    if device != "cuda":
        return device
    return f"cuda:{first}" if last is None or last == first else f"cuda:{first}-{last}"


def learner_items(cfg: Config, policy: ModelSize, teacher: ModelSize | None, rank: int) -> list[Item]:
    """What learner rank ``rank`` keeps on its device: the trained policy (its shard), rank 0's whole copy under
    fsdp2 (unless it is kept in host memory: :func:`host_copy_device`), the reference and the teacher."""
    items = policy_items(cfg, policy)
    if rank == 0 and cfg.learner.sharded and not whole_copy_in_host_memory(cfg):
        items.append(whole_copy_item(policy))
    reference = reference_item(cfg, policy)
    if reference is not None:
        items.append(reference)
    if teacher is not None:
        items.append(frozen_item(cfg, teacher, f"teacher {teacher.name}"))
    return items


def whole_copy_item(policy: ModelSize) -> Item:
    return Item("whole-policy copy, fp32 (rank 0 under fsdp2: engines and checkpoints read it)",
                _bytes(policy.params, FP32))


def host_copy_device(cfg: Config, policy: ModelSize) -> Device | None:
    """The host memory of a sharded learner's rank 0 on GPUs when its whole copy of the policy lives there (no
    engine samples with it in rank 0's process: vLLM, or Ray's rollout workers); else None."""
    if not whole_copy_in_host_memory(cfg):
        return None
    return Device("learner rank 0's host memory", "learner rank 0's whole-policy copy (checkpoints, weights to the "
                  "engines)", 1, [whole_copy_item(policy)])


def policy_items(cfg: Config, policy: ModelSize) -> list[Item]:
    """The trained policy: full fine-tuning (weights, gradients, AdamW; sharded under fsdp2) or LoRA."""
    lrn, params = cfg.learner, policy.params
    if lrn.lora_rank:
        items = base_items(cfg, policy)
        adapters = policy.arch.lora_parameters(lrn.lora_rank, lrn.lora_target_modules) if policy.arch else None
        if adapters is not None:
            items.append(Item(f"LoRA adapters ({adapters / 1e6:.1f}M parameters): weights, gradients, AdamW, fp32",
                              adapters * LORA_TRAINED))
        return items
    shards, share = _share(cfg)
    return [Item(f"weights, fp32 master{share}", _bytes(params, FP32, shards)),
            Item(f"gradients, fp32{share}", _bytes(params, GRADIENT, shards)),
            Item(f"AdamW moments (2), fp32{share}", _bytes(params, ADAMW, shards))]


def base_items(cfg: Config, policy: ModelSize) -> list[Item]:
    """LoRA's frozen base: as loaded, or with ``learner.quantize`` its decoder layers' linear weights in 4-bit
    (grpoplus.models.qlora) and the rest (embeddings, norms, biases, an untied LM head) as loaded."""
    q, arch, params = cfg.learner.quantize, policy.arch, policy.params
    if q == "none":
        return [Item("base weights, fp32, frozen", _bytes(params, FP32))]
    if arch is None or params is None:
        return [Item(f"base weights, counted fp32 (which are {q} is not known without the architecture), frozen",
                     _bytes(params, FP32))]
    quantized = arch.block_linear_weights()
    return [Item(f"base: decoder layers' linear weights in 4-bit {q} (with a float32 scale per block), frozen",
                 arch.four_bit_bytes()),
            Item("base: the rest (embeddings, norms, LM head), fp32, frozen", (params - quantized) * FP32)]


def reference_item(cfg: Config, policy: ModelSize) -> Item | None:
    """The frozen KL reference, as the learner decides it (:func:`grpoplus.plan.run.reference_kind`): a copy when
    the stage's beta > 0 without LoRA (with LoRA it is the policy with its adapters off: nothing more)."""
    if reference_kind(cfg) != "copy":
        return None
    if cfg.learner.sharded:  # sharded like the policy: float32 shards, gathered in the compute dtype to run
        shards, share = _share(cfg)
        return Item(f"reference, fp32, frozen{share}", _bytes(policy.params, FP32, shards))
    return frozen_item(cfg, policy, "reference")


def frozen_item(cfg: Config, model: ModelSize, what: str) -> Item:
    """A frozen model on every learner rank (the reference, a teacher): float32, its linear weights stored in
    bfloat16 under ``bf16_mixed`` (what autocast computes with)."""
    if cfg.learner.precision == "fp32" or model.arch is None or model.params is None:
        return Item(f"{what}, fp32, frozen", _bytes(model.params, FP32))
    linear = model.arch.linear_parameters()
    return Item(f"{what}, frozen (linear weights in bfloat16)", linear * 2 + (model.params - linear) * FP32)


def _share(cfg: Config) -> tuple[int, str]:
    """(ranks a sharded learner's tensors are split over, or 1; its label)."""
    parts = shards(cfg)
    return parts, f", a 1/{parts} shard" if parts > 1 else ""


def engine_items(cfg: Config, policy: ModelSize, own_copy: bool, tokens: Tokens, workers: int
                 ) -> tuple[list[Item], list[str]]:
    """A rollout engine's memory beyond the learner's: ``own_copy`` when it samples its own copy of the policy
    (a Ray rollout worker, or a sampler running ahead with max_staleness > 0). Returns (items, aside)."""
    r = cfg.rollout
    items = [Item("the sampler's own copy of the policy, fp32", _bytes(policy.params, FP32))] if own_copy else []
    aside: list[str] = []
    if r.engine == "vllm":
        more, aside = _vllm(cfg, policy)
        items += more
    elif r.engine == "hf":
        more, aside = _hf(cfg, policy)
        items += more
    else:
        aside.append(f"rollout engine {r.engine}: its own memory is not estimated")
    kv = kv_cache_note(cfg, policy, tokens, workers)
    return items, aside + ([kv] if kv else [])


def _hf(cfg: Config, policy: ModelSize) -> tuple[list[Item], list[str]]:
    """The hf engine samples with the learner's own module; it adds a merged copy of the adapted layers (LoRA; not on
    a 4-bit base, sampled as it is), a quantized copy, or on a CPU oneDNN's reordered copy of the linear weights
    while it samples (of a 4-bit base: of its LM head)."""
    from grpoplus.learner.precision import COMPUTE_DTYPES

    lrn, r, arch, params = cfg.learner, cfg.rollout, policy.arch, policy.params
    linear = arch.linear_parameters() if arch else params
    if lrn.quantize != "none":
        linear = arch.vocab * arch.hidden if arch else None
    items: list[Item] = []
    if lrn.lora_rank and lrn.quantize == "none":
        merged = arch.adapted_weights(lrn.lora_target_modules) if arch else None
        items.append(Item("merged copy of the adapted layers (W + BA), fp32", _bytes(merged, FP32)))
    if r.quantization == "bf16_rounded":
        items.append(Item("bf16-rounded copy of the weights (stored fp32)", _bytes(params, FP32)))
    elif r.quantization == "int8":
        items.append(Item("int8 copy of the linear weights", _bytes(linear, 1)))
    elif not on_gpus(cfg) and r.engine_kwargs.get("pack_weights", True):
        size = COMPUTE_DTYPES[lrn.precision].itemsize
        which = "the LM head" if lrn.quantize != "none" else "the linear weights"
        items.append(Item(f"oneDNN's reordered copy of {which}, while sampling", _bytes(linear, size)))
    return items, []


def _vllm(cfg: Config, policy: ModelSize) -> tuple[list[Item], list[str]]:
    """vLLM's own copy of the (base) weights, and its KV cache: sized on a CPU, a share of the GPU on a GPU."""
    lrn, r = cfg.learner, cfg.rollout
    extra = r.engine_kwargs
    dtype = str(extra.get("dtype") or ("bfloat16" if lrn.precision == "bf16_mixed" else "float32"))
    size = VLLM_DTYPE_BYTES.get(dtype, 2)
    base = "base weights" if lrn.lora_rank else "weights"
    items = [Item(f"vLLM's copy of the {base} ({dtype})", _bytes(policy.params, size))]
    if not on_gpus(cfg):
        kv = int(extra.get("kv_cache_memory_bytes", VLLM_CPU_KV_BYTES))
        return items + [Item("vLLM's KV cache (kv_cache_memory_bytes)", kv)], []
    if "kv_cache_memory_bytes" in extra:
        return items + [Item("vLLM's KV cache (kv_cache_memory_bytes)", int(extra["kv_cache_memory_bytes"]))], []
    share = extra.get("gpu_memory_utilization")
    said = f"gpu_memory_utilization={share}" if share is not None else \
        f"gpu_memory_utilization={VLLM_GPU_UTILIZATION} (vLLM's default: not set in rollout.engine_kwargs)"
    sleep = ("; it sleeps (frees it) during each update" if extra.get("sleep_between_steps")
             else "; held during the update too (rollout.engine_kwargs.sleep_between_steps: true frees it)")
    return items, [f"vLLM takes {said} of the GPU's memory for its weights, KV cache and activations, not in the "
                   f"total{sleep}"]


def kv_cache_note(cfg: Config, policy: ModelSize, tokens: Tokens, workers: int) -> str | None:
    """A rough KV cache size: the rows an engine decodes at once, each at its longest, x the bytes per token."""
    from grpoplus.learner.precision import COMPUTE_DTYPES

    if policy.arch is None:
        return None
    r = cfg.rollout
    rows = r.max_num_seqs or -(-tokens.rows // workers)
    length = tokens.longest_row or tokens.budget
    per_token = policy.arch.kv_bytes_per_token(COMPUTE_DTYPES[cfg.learner.precision].itemsize)
    what = "prompt + response" if tokens.longest_row else "responses only: prompt length unknown"
    at_once = "rollout.max_num_seqs" if r.max_num_seqs else \
        "the whole batch at once" if workers == 1 else "a worker's share of the batch at once"
    return (f"KV cache, rough: {rows} rows x {length} tokens ({what}) x {per_token / 1024:.0f} KiB per token = "
            f"{gigabytes(rows * length * per_token)} ({at_once}; not in the total)")


def _bytes(params: int | None, per: int, shards: int = 1) -> int | None:
    """``per`` bytes for each parameter of a rank's share: the whole, or a shard of ceil(params / shards)."""
    return None if params is None else -(-params // shards) * per


def gigabytes(size: int | None) -> str:
    """``12.30 GB`` or ``3.4 MB`` (powers of 10, as the loader's own memory check says them), or ``unknown``."""
    if size is None:
        return "unknown"
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"
