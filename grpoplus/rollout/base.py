"""The rollout-engine contract: what every engine (in-process Hugging Face, vLLM, ...) takes and returns.

An engine is built by its registered factory from the learner's model, its tokenizer and
engine-agnostic :class:`EngineOptions`; it samples :class:`~grpoplus.containers.Rollouts`
that record, for every sampled token, the log-prob under the distribution it was actually
sampled from (``logp_roll``), so the learner can measure and correct the mismatch; and it
loads the learner's new weights after every update (``sync_weights``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from grpoplus.containers import Rollouts, SamplingParams
from grpoplus.core.registry import Registry
from grpoplus.rollout.weights import WeightSource


@dataclass(frozen=True)
class EngineOptions:
    """Options every engine understands (an engine rejects a value it cannot honour)."""

    quantization: str = "none"
    """Sampler weights: none (the learner's precision), int8 (real int8 kernels), fp8 (GPU engines),
    bf16_rounded (weights rounded to bfloat16, computed in float32: a precision gap without int8 kernels)."""
    max_num_seqs: int | None = None
    """Most sequences decoded at once (None or 0: the engine's choice, as ``rollout.max_num_seqs=0``)."""
    max_model_len: int = 1024
    """Longest prompt + response, in tokens (engines that preallocate size their caches by it)."""
    seed: int = 0
    """Seed of engine-internal randomness not driven by the caller's generator."""
    start_timeout_s: float = 600.0
    """Longest an engine may take to start before the run stops with an error naming the engine."""
    generate_timeout_s: float = 600.0
    """Longest one generate call may take before the run stops with an error naming the engine."""
    record_routing: bool = False
    """MoE policies: return the experts the sampler routed every token to (``Rollouts.routing``), for
    routing replay R3 and the routing-mismatch metrics; engines that can set ``returns_routing = True``."""
    dtype: torch.dtype = torch.float32
    """What the engine computes in: float32, or bfloat16 (``learner.precision=bf16_mixed``; the hf engine decodes
    under autocast on bf16 weights, vLLM loads the weights in bf16)."""
    compile: bool = False
    """hf engine: decode with one compiled step at fixed shapes per batch (grpoplus.rollout.compiled_step)."""
    release_memory: bool = False
    """hf engine: ``offload`` (before each update) frees the compiled step's static batches and captured graphs
    (``run.release_memory``); else they are kept for the next rollout."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Engine-specific settings (e.g. vLLM's gpu_memory_utilization), passed through as they are."""


DEFAULT_OPTIONS = EngineOptions()  # an engine built without options (frozen: safe to share)


class RolloutEngine(Protocol):
    name: str  # the registered name, for messages
    pad_id: int  # the token that pads prompts and responses

    def generate(self, prompts: list[str] | list[list[int]], params: SamplingParams,
                 prompt_index: list[int] | None = None, generator: torch.Generator | None = None,
                 **per_prompt) -> Rollouts:
        """Sample ``params.n`` responses for every prompt; groups are contiguous rows. A prompt is a string (tokenized
        with the tokenizer's special tokens) or a list of token ids taken as they are (a multi-turn trajectory
        continues from the ids it holds: nothing is re-tokenized). ``per_prompt``: inputs with one value per prompt
        that an engine takes (a vision-language policy's ``images``, or ``vision`` with token ids: the hf engine);
        an engine that wraps another passes them on."""

    def sync_weights(self, weights: WeightSource | torch.nn.Module, version: int) -> None:
        """Load the learner's current weights from any :mod:`grpoplus.rollout.weights` source (a module is ``InProcess``);
        ``version`` is tagged on later rollouts."""

    def offload(self) -> None:
        """Free device memory the learner needs during its update (``sync_weights`` brings the engine back)."""

    def close(self) -> None:
        """Release the engine's processes and memory (idempotent)."""


# name -> factory(model, tokenizer, options: EngineOptions) -> RolloutEngine. A factory may carry
# ``requires = (module, install hint)``: the config check names the hint when the module is missing.
ENGINES: Registry = Registry("rollout engine")


class EngineError(RuntimeError):
    """A rollout engine failed in a way the run cannot survive; the message names the engine and the fix."""


def require_engine(name: str) -> None:
    """The engine ``name`` exists and its package is installed (checked before anything is loaded)."""
    import importlib.util

    factory = ENGINES.get(name)
    module, hint = getattr(factory, "requires", (None, None))
    if module is not None and importlib.util.find_spec(module) is None:
        from grpoplus.core.needs import unmet

        unmet(ImportError(f"rollout.engine={name} needs the {module} package, which is not installed: {hint}"))


def check_max_num_seqs(max_num_seqs: int | None) -> None:
    """Refuse a negative bound on the sequences an engine decodes at once (None or 0: the engine's choice); the engines
    and the config rule ``positive_sizes`` (``rollout.max_num_seqs``) both ask this."""
    if max_num_seqs is not None and max_num_seqs < 0:
        raise ValueError(f"config key rollout.max_num_seqs must be >= 0 (0 = the engine's choice), got {max_num_seqs}")


def check_request(prompts: list[str], params: SamplingParams, prompt_index: list[int] | None) -> None:
    """Reject a bad request with a message naming the field (instead of a failure deep in an engine)."""
    if not prompts or not (all(isinstance(p, str) for p in prompts) or all(is_token_ids(p) for p in prompts)):
        raise ValueError("prompts must be a non-empty list of strings, or of non-empty lists of token ids")
    if prompt_index is not None and len(prompt_index) != len(prompts):
        raise ValueError(f"prompt_index has {len(prompt_index)} entries for {len(prompts)} prompts")
    if params.n < 1 or params.max_new_tokens < 1:
        raise ValueError(f"SamplingParams.n and max_new_tokens must be >= 1, got n={params.n}, "
                         f"max_new_tokens={params.max_new_tokens}")
    if not params.greedy and params.temperature <= 0:
        raise ValueError(f"SamplingParams.temperature must be > 0 (greedy=True for argmax), got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {params.top_p}")


def is_token_ids(prompt) -> bool:
    """A prompt given as token ids: a non-empty list of ints."""
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(t, int) for t in prompt)


def encode_prompts(tokenizer, prompts: list[str] | list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``([B, P] ids, [B, P] mask)`` left-padded: strings through the tokenizer (its special tokens added), token-id
    prompts as they are."""
    if isinstance(prompts[0], str):
        enc = tokenizer(list(prompts), padding=True, padding_side="left", return_tensors="pt")
        return enc["input_ids"], enc["attention_mask"]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
    return ids, mask


def check_rollouts(rollouts: Rollouts, n_prompts: int, params: SamplingParams, engine: str) -> Rollouts:
    """An engine's answer as the learner needs it, or a one-line error naming the engine and the fault."""
    expected = n_prompts * params.n
    got = rollouts.response_ids.shape[0]
    if got != expected or len(rollouts.texts) != expected:
        raise EngineError(f"rollout engine {engine!r} returned {got} completions for {n_prompts} prompts x "
                           f"n={params.n} = {expected}; the engine is broken or was interrupted")
    logp = rollouts.logp_roll[rollouts.response_mask > 0]
    if not torch.isfinite(logp).all():
        bad = int((~torch.isfinite(logp)).sum())
        raise EngineError(f"rollout engine {engine!r} returned {bad} non-finite log-probs (NaN/inf) for sampled "
                           "tokens; check the model's weights and the engine's dtype/quantization")
    return rollouts
