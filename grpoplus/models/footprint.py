"""What a process keeps resident for the policy, in bytes, from the model's size alone: the one memory model of a run.

The dry run itemizes it per device (:mod:`grpoplus.dryrun.memory`) and the loader's memory check sums it, times
:data:`MARGIN`, before a weight is read (:func:`grpoplus.models.memory.check_fits`); the plan decides a process's
:class:`Footprint` once (``PolicyPlan.footprint``). Counted, in bytes per parameter: the policy's float32 master
weights (4; ``bf16_mixed`` keeps them float32 too), the gradients (4) and AdamW's two moments (8) of the parameters
that train (``learner.freeze`` leaves some out), all divided by the ranks under ``fsdp2``; with LoRA the frozen base
(4; with ``learner.quantize`` the decoder layers' linear weights 0.5 and a float32 scale per block) and 16 per adapter
parameter; rank 0's whole-policy copy under ``fsdp2``; the sampler's own copies where an engine samples in the same
process (a merged LoRA copy, an int8 or bf16-rounded copy, oneDNN's reordered weights on a CPU, vLLM's weights and
KV cache). Not counted: activations, the allocator's slack and the CUDA context (the margin's share).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from grpoplus.models.sizes import Arch, ModelSize

FP32, GRADIENT, ADAMW = 4, 4, 8
"""Bytes per parameter of a float32 weight, its float32 gradient and AdamW's two float32 moments."""
LORA_TRAINED = FP32 + GRADIENT + ADAMW
MARGIN = 1.25
"""The load check's allowance beyond the resident bytes: activations of a micro-batch, the allocator's slack."""
COMPUTE_BYTES = {"fp32": 4, "bf16_mixed": 2}  # learner.precision: the dtype the learner and the hf engine compute in
VLLM_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
VLLM_CPU_KV_BYTES = 1 << 30  # what the vllm engine reserves for its KV cache on a CPU (rollout/vllm_engine.py)


@dataclass(frozen=True)
class Item:
    what: str
    bytes: int | None  # None: not known (the model's size is unknown)


@dataclass(frozen=True, kw_only=True)
class Footprint:
    """How one process holds the policy: trained or a frozen copy, sharded, adapted, quantized, partly frozen, with
    rank 0's whole copy beside its shards, and the engine that samples in the same process (None: none)."""

    trains: bool = True  # False: a copy that is not trained where it is loaded (its weights alone)
    shards: int = 1  # ranks the training state is split over
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ("all-linear",)
    quantize: str = "none"  # none | nf4 | fp4: the base's decoder-layer linear weights in 4-bit
    freeze: tuple[str, ...] = ()  # learner.freeze: parameters with no gradient and no optimizer state
    train_vision: bool = False  # learner.train_vision: a vision-language policy's vision tower trains (else frozen)
    whole_copy: bool = False  # a sharded rank 0 also holds the whole policy on its device
    precision: str = "fp32"
    engine: str | None = None  # the rollout engine sampling in this process (hf | vllm | another), None: none
    own_copy: bool = False  # the engine samples its own copy of the policy (rollout.max_staleness > 0)
    on_gpus: bool = False
    quantization: str | None = None  # rollout.quantization of the hf engine: int8 | bf16_rounded
    engine_kwargs: tuple[tuple[str, object], ...] = ()

    def copy_only(self) -> Footprint:
        """A copy of the policy that is not trained where it is loaded, and samples nothing there."""
        return replace(self, trains=False, whole_copy=False, engine=None, own_copy=False)


def policy_items(fp: Footprint, size: ModelSize) -> list[Item]:
    """The policy as ``fp`` holds it: a frozen copy, LoRA over its base, or full fine-tuning; and rank 0's whole
    copy beside its shards."""
    if not fp.trains:
        return [Item("the policy's weights, fp32", param_bytes(size.params, FP32))]
    items = _adapted_items(fp, size) if fp.lora_rank else _trained_items(fp, size)
    if fp.whole_copy:
        items.append(whole_copy_item(size))
    return items


def whole_copy_item(size: ModelSize) -> Item:
    """A sharded learner's rank 0's whole copy of the policy (on its device, or in its host memory)."""
    return Item("whole-policy copy, fp32 (rank 0 under fsdp2: engines and checkpoints read it)",
                param_bytes(size.params, FP32))


def process_items(fp: Footprint, size: ModelSize) -> list[Item]:
    """Everything of the policy the process keeps: :func:`policy_items` and its engine's copies."""
    return policy_items(fp, size) + engine_items(fp, size)


def need_bytes(fp: Footprint, size: ModelSize) -> int:
    """What the load check asks to be free: the process's resident bytes (an unknown part counted 0) x MARGIN; a
    4-bit base is quantised after it loads, so loading it holds at least the whole model as loaded (fp32) first."""
    resident = sum(item.bytes or 0 for item in process_items(fp, size))
    if fp.trains and fp.quantize != "none":
        resident = max(resident, (size.params or 0) * FP32)
    return int(resident * MARGIN)


def _trained_items(fp: Footprint, size: ModelSize) -> list[Item]:
    params, share = size.params, f", a 1/{fp.shards} shard" if fp.shards > 1 else ""
    trained, note = params, ""
    if fp.freeze and size.arch is not None and params is not None:
        trained = params - size.arch.frozen_parameters(fp.freeze)
        note = f" of the {trained / 1e6:.1f}M trained parameters (learner.freeze)"
    elif fp.freeze:
        note = " (learner.freeze: which parameters are frozen is not known without the architecture: all counted)"
    if size.vision_params and not fp.train_vision and trained is not None:
        trained -= size.vision_params
        note += f" (the vision tower's {size.vision_params / 1e6:.2f}M frozen: learner.train_vision=false)"
    return [Item(f"weights, fp32 master{share}", param_bytes(params, FP32, fp.shards)),
            Item(f"gradients, fp32{note}{share}", param_bytes(trained, GRADIENT, fp.shards)),
            Item(f"AdamW moments (2), fp32{note}{share}", param_bytes(trained, ADAMW, fp.shards))]


def _adapted_items(fp: Footprint, size: ModelSize) -> list[Item]:
    items = base_items(fp, size)
    adapters = size.arch.lora_parameters(fp.lora_rank, list(fp.lora_targets)) if size.arch else None
    if adapters is not None:
        items.append(Item(f"LoRA adapters ({adapters / 1e6:.1f}M parameters): weights, gradients, AdamW, fp32",
                          adapters * LORA_TRAINED))
    return items


def base_items(fp: Footprint, size: ModelSize) -> list[Item]:
    """LoRA's frozen base: as loaded, or with ``learner.quantize`` its decoder layers' linear weights in 4-bit
    (grpoplus.models.qlora) and the rest (embeddings, norms, biases, an untied LM head) as loaded."""
    q, arch, params = fp.quantize, size.arch, size.params
    if q == "none":
        return [Item("base weights, fp32, frozen", param_bytes(params, FP32))]
    if arch is None or params is None:
        return [Item(f"base weights, counted fp32 (which are {q} is not known without the architecture), frozen",
                     param_bytes(params, FP32))]
    return [Item(f"base: decoder layers' linear weights in 4-bit {q} (with a float32 scale per block), frozen",
                 arch.four_bit_bytes()),
            Item(f"base: the rest (embeddings, norms, LM head{', the vision tower' if size.vision_params else ''}), "
                 "fp32, frozen", (params - arch.block_linear_weights()) * FP32)]


def frozen_item(precision: str, size: ModelSize, what: str) -> Item:
    """A frozen model on a learner rank (the reference, a teacher): float32, its linear weights stored in bfloat16
    under ``bf16_mixed`` (what autocast computes with)."""
    if precision == "fp32" or size.arch is None or size.params is None:
        return Item(f"{what}, fp32, frozen", param_bytes(size.params, FP32))
    linear = size.arch.linear_parameters()
    return Item(f"{what}, frozen (linear weights in bfloat16)", linear * 2 + (size.params - linear) * FP32)


def engine_items(fp: Footprint, size: ModelSize) -> list[Item]:
    """What the engine sampling in this process holds beyond the learner's weights: its own copy of the policy
    (``own_copy``), and the hf engine's working copies or vLLM's weights and (on a CPU) KV cache."""
    if fp.engine is None:
        return []
    items = [Item("the sampler's own copy of the policy, fp32", param_bytes(size.params, FP32))] if fp.own_copy else []
    if fp.engine == "vllm":
        return items + vllm_items(fp, size)
    return items + (hf_items(fp, size) if fp.engine == "hf" else [])


def hf_items(fp: Footprint, size: ModelSize) -> list[Item]:
    """The hf engine samples with the learner's own module; it adds a merged copy of the adapted layers (LoRA; not on
    a 4-bit base, sampled as it is), a quantized copy, on a CPU oneDNN's reordered copy of the linear weights
    while it samples (of a 4-bit base: of its LM head), or on a GPU in bf16 a bf16 copy of them kept between rollouts
    (:mod:`grpoplus.rollout.cast_weights`)."""
    arch, params = size.arch, size.params
    linear = arch.linear_parameters() if arch else params
    if fp.quantize != "none":
        linear = arch.vocab * arch.hidden if arch else None
    items: list[Item] = []
    if fp.lora_rank and fp.quantize == "none":
        merged = arch.adapted_weights(list(fp.lora_targets)) if arch else None
        items.append(Item("merged copy of the adapted layers (W + BA), fp32", param_bytes(merged, FP32)))
    if fp.quantization == "bf16_rounded":
        items.append(Item("bf16-rounded copy of the weights (stored fp32)", param_bytes(params, FP32)))
    elif fp.quantization == "int8":
        items.append(Item("int8 copy of the linear weights", param_bytes(linear, 1)))
    elif fp.on_gpus and fp.precision == "bf16_mixed" and fp.quantize == "none" and \
            dict(fp.engine_kwargs).get("cast_weights", "auto") is not False:
        head = arch.vocab * arch.hidden if arch and arch.tied else 0  # a tied head gets its own copy
        items.append(Item("bf16 copy of the linear weights, kept between rollouts", param_bytes(linear + head, 2)))
    elif not fp.on_gpus and dict(fp.engine_kwargs).get("pack_weights", True):
        which = "the LM head" if fp.quantize != "none" else "the linear weights"
        items.append(Item(f"oneDNN's reordered copy of {which}, while sampling",
                          param_bytes(linear, COMPUTE_BYTES[fp.precision])))
    return items


def vllm_dtype(fp: Footprint) -> str:
    """The dtype vLLM holds its weights in: rollout.engine_kwargs' ``dtype``, else the learner's compute dtype."""
    return str(dict(fp.engine_kwargs).get("dtype") or ("bfloat16" if fp.precision == "bf16_mixed" else "float32"))


def vllm_items(fp: Footprint, size: ModelSize) -> list[Item]:
    """vLLM's own copy of the (base) weights, and its KV cache where its size is set (on a CPU: 1 GiB unless
    ``kv_cache_memory_bytes`` says otherwise; on a GPU vLLM takes a share of the memory: the dry run notes it)."""
    extra, dtype = dict(fp.engine_kwargs), vllm_dtype(fp)
    base = "base weights" if fp.lora_rank else "weights"
    items = [Item(f"vLLM's copy of the {base} ({dtype})", param_bytes(size.params, VLLM_DTYPE_BYTES.get(dtype, 2)))]
    if "kv_cache_memory_bytes" in extra or not fp.on_gpus:
        kv = int(extra.get("kv_cache_memory_bytes", VLLM_CPU_KV_BYTES))
        items.append(Item("vLLM's KV cache (kv_cache_memory_bytes)", kv))
    return items


ACTIVATION_VALUES = (10, 4, 2)
"""Values a decoder layer keeps for its backward per token, as multiples of (hidden, intermediate, key/value width):
counted from the tensors autograd saves in a Llama-style layer's training forward (SDPA attention: no [T, T] scores),
fitted over seven shapes at 9.3 h + 4.0 i + 2.0 kv - 227 and rounded up (``benchmarks/activation_memory.py``)."""
ACTIVATION_BYTES = {"fp32": 4.0, "bf16_mixed": 3.0}
"""Bytes per kept value: float32; under bfloat16 autocast the matmuls' inputs in bfloat16, the residual stream and
the norms in float32 (counted: 0.59-0.71 of float32's bytes, the most for a wide hidden state)."""
HEAD_BYTES = (256 + 64) << 20  # the chunked head's kept softmax and its work chunk, at most (learner.logprobs)


def activation_bytes_per_token(arch: Arch, precision: str, checkpointing: bool) -> float:
    """Bytes a training forward keeps per token until its backward: every layer's kept values, or under gradient
    checkpointing each layer's float32 input and one layer's values (the layer being recomputed)."""
    a, b, c = ACTIVATION_VALUES
    layer = (a * arch.hidden + b * arch.intermediate + c * arch.kv_heads * arch.head_size) * ACTIVATION_BYTES[precision]
    return arch.layers * arch.hidden * FP32 + layer if checkpointing else arch.layers * layer


def token_budget(free: int, pending: int, per_token: float) -> int:
    """The tokens of a micro-batch whose kept activations fit in ``free`` bytes (of which MARGIN's share is left as
    slack) beside ``pending`` bytes the first update still allocates (gradients, AdamW's moments) and the head's."""
    return max(0, int((free / MARGIN - pending - HEAD_BYTES) // per_token))


def total(items: list[Item]) -> int | None:
    """The items' sum; None when one is not known."""
    sizes = [item.bytes for item in items]
    return None if None in sizes else sum(sizes)


def param_bytes(params: int | None, per: int, shards: int = 1) -> int | None:
    """``per`` bytes for each parameter of a rank's share: the whole, or a shard of ceil(params / shards)."""
    return None if params is None else -(-params // shards) * per
