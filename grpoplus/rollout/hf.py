"""In-process rollout engine on a Hugging Face causal LM: a hand-written KV-cached decode loop.

``model.generate`` carries a large fixed cost per call and per step (logits processors,
stopping criteria, cache bookkeeping) that dominates for tiny models; this loop does only
what GRPO needs: prefill the left-padded prompts once, then one cached forward per new
token, recording the log-prob of every sampled token under the distribution it was drawn
from (``logp_roll``).
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedTokenizerBase
from transformers.cache_utils import Cache, DynamicLayer

from grpoplus.containers import Rollouts, SamplingParams
from grpoplus.models.device import autocast_to
from grpoplus.models.kv_cache import cache_kwargs
from grpoplus.models.lora import compute_module, is_lora, merge_into, plain_model
from grpoplus.models.qlora import is_4bit
from grpoplus.models.routing import NATURAL, rollout_routing, routing_spec
from grpoplus.models.vision import (
    VisionInputs,
    forward_inputs,
    is_vision_model,
    placeholder_ids,
    text_positions,
    vision_positions,
)
from grpoplus.models.vision import encode_prompts as encode_vision_prompts
from grpoplus.rollout.base import (
    DEFAULT_OPTIONS,
    ENGINES,
    EngineOptions,
    check_max_num_seqs,
    check_request,
    encode_prompts,
)
from grpoplus.rollout.cast_weights import cast_copy, casts_linears, refresh_cast
from grpoplus.rollout.compiled_step import CompiledStep, StaticRows, bucket_capacity, bucket_rows, static_refusal
from grpoplus.rollout.decode_ops import expand_to_rows, packed_linears, select_rows
from grpoplus.rollout.quantize import check_quantization, sampler_model
from grpoplus.rollout.sampling import sample_next
from grpoplus.rollout.weights import WeightSource, module_of


def stop_token_ids(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """End-of-sequence ids: the tokenizer's EOS plus any the generation config lists."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])
    ids.discard(None)
    if not ids:
        raise ValueError("the tokenizer defines no eos_token_id: set tokenizer.eos_token (needed to end responses)")
    return sorted(ids)


def scatter_rows(values: torch.Tensor, rows: torch.Tensor, n: int, fill) -> torch.Tensor:
    """[m] values of the batch slots -> [n] output rows (``fill`` on rows no slot holds)."""
    return values.new_full((n,), fill).index_copy_(0, rows, values)


@torch.inference_mode()
def decode(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, repeats: torch.Tensor,
           params: SamplingParams, stop_ids: torch.Tensor, pad_id: int, generator: torch.Generator | None,
           pack_weights: bool = True, dtype: torch.dtype = torch.float32, step: CompiledStep | None = None,
           vision: list[VisionInputs] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample ``repeats[j]`` responses for the left-padded prompt ``j``; rows of one prompt are contiguous.

    Each distinct prompt is prefilled once and its KV cache copied to its rows (a group of
    G samples shares one prompt, so this divides the prefill work by G) in a cache
    allocated at its final length: a step writes one position and copies nothing
    (:mod:`grpoplus.rollout.decode_ops`, also for the attention kernel and, with ``pack_weights``, oneDNN's
    reordered linear weights: a copy of every fp32 weight for the rollout's duration, ~3x faster decode GEMMs
    and ~2x faster prefill GEMMs on an AVX2 CPU). Rows
    that have ended are dropped from the batch once they make up a quarter of it, so later
    steps mostly compute live rows. With ``step`` (``rollout.compile``) every decode step is that compiled
    step at the batch's fixed shapes (:mod:`grpoplus.rollout.compiled_step`: ended rows are computed and ignored).

    Args:
        input_ids, attention_mask: [b, P] left-padded distinct prompts.
        repeats: [b] long, rows per prompt (n = repeats.sum()).
        stop_ids: [k] long, end-of-sequence ids.
        dtype: float32, or bfloat16: the matmuls under autocast, the packed weights reordered in bfloat16.
        vision: a vision-language model's prompts: each one's processor outputs beyond the ids (its images are
            encoded once, in the prefill, and its rows decode text after them).

    Returns:
        ``(tokens [n, T], mask [n, T] float, logp [n, T] float32, finished [n] bool)``,
        ``T <= params.max_new_tokens`` (the loop stops once every row has ended).
    """
    rows = int(repeats.sum())
    packed = packed_linears(model, rows, dtype, opaque=step is not None) if pack_weights else nullcontext()
    with packed, autocast_to(dtype, input_ids.device):
        state = prefill(model, input_ids, attention_mask, repeats, input_ids.shape[1] + params.max_new_tokens, step,
                        vision)
        return sample_loop(state, params, stop_ids, pad_id, generator)


class EagerRows:
    """The batch being decoded eagerly: m live slots, compacted as rows end (see :func:`decode`)."""

    def __init__(self, model, cache: Cache, masks: torch.Tensor, next_pos: torch.Tensor, length: int):
        self.model, self.cache = model, cache  # cache: the m slots, room for `capacity` positions
        self.masks = masks  # [n, capacity] attention mask; slot i uses row i, columns up to the current length
        self.next_pos = next_pos  # [m, 1] position id of the next token
        self.length = length  # positions filled so far (prompt columns + sampled tokens)

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        """[m] tokens of the slots -> [m, V] next-token logits."""
        self.length += 1
        logits = self.model(input_ids=tok[:, None], attention_mask=self.masks[: len(tok), : self.length],
                            position_ids=self.next_pos, **cache_kwargs(self.model, self.cache), use_cache=True)
        self.next_pos = self.next_pos + 1
        return logits.logits[:, -1]

    def keep(self, keep: torch.Tensor) -> None:
        """Keep the slots ``keep`` ([k] long, in order), compacting the cache and masks in place."""
        select_rows(self.cache, keep)
        self.masks[: len(keep)] = self.masks[keep]
        self.next_pos = self.next_pos[keep]


@dataclass
class DecodeState:
    """The batch being decoded: m live slots of the n output rows."""

    batch: EagerRows | StaticRows  # the slots' cache, masks and positions, and their forward
    logits: torch.Tensor  # [m, V] next-token logits
    rows: torch.Tensor  # [m] output row of each slot


def prefill(model, input_ids, attention_mask, repeats, capacity: int, step: CompiledStep | None = None,
            vision: list[VisionInputs] | None = None) -> DecodeState:
    """Forward the b distinct prompts once (their images too) and copy their cache and logits to the n =
    repeats.sum() rows."""
    extra = {} if vision is None else forward_inputs(vision, attention_mask, 0)
    # Position of every real token counted from the row's first real token (left padding); Qwen's three rows of an
    # image's tokens (grpoplus.models.vision)
    position_ids = vision_positions(model, input_ids, attention_mask, extra)  # [b, P] or [3, b, P]
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **extra,
                   **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1).logits[:, -1]  # [b, V]
    position_ids = text_positions(position_ids)  # a decode step's: the text position (Qwen's three are equal there)
    expand = torch.arange(len(repeats), device=input_ids.device).repeat_interleave(repeats)  # [n]
    n, plain = len(expand), all(type(layer) is DynamicLayer for layer in cache.layers)
    static = step is not None and plain
    if static:  # a few shapes for every rollout: rows and positions in buckets (the rows added copy the last one)
        capacity = bucket_capacity(capacity)
        expand = torch.cat([expand, expand[-1:].expand(bucket_rows(n) - n)])
    masks = attention_mask.new_ones(len(expand), capacity)  # sampled columns are attended to
    masks[:, : input_ids.shape[1]] = attention_mask[expand]
    cache = expand_to_rows(cache, expand, capacity, step.pool.empty if static else None)
    next_pos, length = position_ids[expand, -1:] + 1, input_ids.shape[1]
    batch = StaticRows(model, cache.layers, masks, next_pos, length, step, rows=n) if static else \
        EagerRows(model, cache, masks, next_pos, length)
    return DecodeState(batch, logits[expand[:n]], torch.arange(n, device=input_ids.device))


def sample_loop(s: DecodeState, params: SamplingParams, stop_ids, pad_id: int, generator):
    """Sample up to ``params.max_new_tokens`` tokens per row from the prefilled state (see :func:`decode`)."""
    n = len(s.rows)
    running = torch.ones(n, dtype=torch.bool, device=s.rows.device)  # [m] slot still generating
    finished = torch.zeros(n, dtype=torch.bool, device=s.rows.device)  # [n]
    tokens, logps, masks = [], [], []
    for step in range(params.max_new_tokens):
        tok, logp = sample_next(s.logits, temperature=params.temperature, top_p=params.top_p, greedy=params.greedy,
                                generator=generator)  # [m], [m]
        tokens.append(scatter_rows(tok.masked_fill(~running, pad_id), s.rows, n, pad_id))
        logps.append(scatter_rows(logp.masked_fill(~running, 0.0), s.rows, n, 0.0))
        masks.append(scatter_rows(running, s.rows, n, False))
        ended = running & torch.isin(tok, stop_ids)  # [m]
        finished[s.rows[ended]] = True
        running = running & ~ended
        stopped = int((~running).sum())
        if step + 1 == params.max_new_tokens or stopped == len(s.rows):
            break
        if 4 * stopped >= len(s.rows):  # drop ended slots once they are a quarter of the batch (amortised copy)
            keep = running.nonzero().squeeze(1)
            s.batch.keep(keep)
            s.rows, running, tok = s.rows[keep], running[keep], tok[keep]
        s.logits = s.batch.forward(tok)  # [m, V]
    return torch.stack(tokens, 1), torch.stack(masks, 1).float(), torch.stack(logps, 1), finished


def compiled_step(model: torch.nn.Module, compile: bool) -> CompiledStep | None:
    """``rollout.compile``'s decode step for ``model`` (CUDA graphs on a GPU, inductor elsewhere), or None: not asked
    for, or a model it cannot compile (said in one line; the engine then decodes eagerly)."""
    if not compile:
        return None
    refusal = static_refusal(model)
    if refusal is not None:
        print(f"grpoplus: rollout.compile: the decode step of this model is not compiled ({refusal}); decoding "
              "eagerly", file=sys.stderr)
        return None
    cuda = next(model.parameters()).device.type == "cuda"
    return CompiledStep("reduce-overhead" if cuda else None)


@dataclass(frozen=True)
class HFEngineKwargs:
    """``rollout.engine_kwargs`` of the hf engine: ``pack_weights`` (true/false, default true: on a CPU, oneDNN's
    reordered copy of the fp32 linear weights for each rollout) and ``cast_weights`` (auto/true/false, default auto:
    a bf16 decode of fp32 weights on a GPU samples a bf16 copy of the linear weights, :mod:`~grpoplus.rollout.cast_weights`)."""

    pack_weights: bool = True
    cast_weights: str | bool = "auto"


def hf_engine_kwargs(extra: dict) -> HFEngineKwargs:
    """Check and read the hf engine's ``rollout.engine_kwargs`` (:class:`HFEngineKwargs`): a one-line error otherwise."""
    unknown = sorted(set(extra) - {"pack_weights", "cast_weights"})
    if unknown:
        raise ValueError(f"rollout.engine_kwargs {unknown}: the hf engine takes only pack_weights (true/false) and "
                         "cast_weights (auto/true/false)")
    kwargs = HFEngineKwargs(**extra)
    if not isinstance(kwargs.pack_weights, bool):
        raise ValueError(f"rollout.engine_kwargs pack_weights must be true or false, got {kwargs.pack_weights!r}")
    if not (kwargs.cast_weights == "auto" or isinstance(kwargs.cast_weights, bool)):
        raise ValueError(f"rollout.engine_kwargs cast_weights must be auto, true or false, got {kwargs.cast_weights!r}")
    return kwargs


@ENGINES.register("hf")
class HFEngine:
    """Batched, KV-cached sampling of ``params.n`` responses per prompt with a transformers model.

    Args:
        model: a causal LM (``LlamaForCausalLM`` or any model taking ``position_ids`` and a KV
            cache, ``past_key_values`` or ``cache``: grpoplus.models.kv_cache); its device is used.
        tokenizer: its tokenizer; prompts are tokenised with its own special tokens
            (e.g. ``<bos>``) and left-padded with its pad token (EOS when it has none).
        options: ``quantization`` chooses the sampler's weights (grpoplus.rollout.quantize: the
            learner's module itself, or a bf16-rounded or int8 copy made again at every sync; a
            LoRA policy's merged weights; a LoRA policy on a 4-bit base: its own module, adapters on);
            ``max_num_seqs`` bounds the rows decoded at once (``None``: all ``B * G``);
            ``record_routing`` (MoE policies) returns the sampler's expert routing with the rollouts;
            ``extra={"pack_weights": False}`` decodes with the weights as they are instead of oneDNN's
            reordered copy of every fp32 linear weight made for each rollout
            (:func:`~grpoplus.rollout.decode_ops.packed_linears`: ~3x faster decode GEMMs on a CPU, ~0.5 GB
            more for SmolLM2 during a rollout); ``extra={"cast_weights": ...}``: whether a bf16 decode of fp32
            weights samples a bf16 copy of the linear weights kept between rollouts (auto: on a GPU;
            :mod:`~grpoplus.rollout.cast_weights`).
    """

    name = "hf"
    returns_routing = True  # honours EngineOptions.record_routing

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
                 options: EngineOptions = DEFAULT_OPTIONS):
        if options.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"the hf engine computes in float32 or bfloat16, not {options.dtype}")
        check_quantization(options.quantization, next(model.parameters()).device, options.dtype)
        self.dtype = options.dtype
        check_max_num_seqs(options.max_num_seqs)
        # a vision-language model's processor (its tokenizer inside): prompts with images go through it
        self.processor = tokenizer if hasattr(tokenizer, "image_processor") else None
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer) if self.processor is not None else tokenizer
        self.tokenizer = tokenizer
        self.vision = is_vision_model(model)
        self.placeholders = placeholder_ids(model.config) if self.vision else []
        self.quantization = options.quantization
        self.max_batch_size = options.max_num_seqs or None  # 0: the engine's choice, as None
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.stop_ids = stop_token_ids(model, tokenizer)
        self.version = 0
        self.record_routing = options.record_routing
        kwargs = hf_engine_kwargs(options.extra)
        self.pack_weights, self.cast_weights = kwargs.pack_weights, kwargs.cast_weights
        self.cast: tuple[torch.nn.Module, torch.nn.Module] | None = None  # (module, its bf16-linear copy)
        self.step = compiled_step(model, options.compile)
        self.release_memory = options.release_memory
        self.merged = None  # a LoRA policy's plain module with merged weights (grpoplus.models.lora)
        self.base = model  # takes weights that come from outside this process's modules
        self.model = self._sampler(model)
        if self.record_routing:
            routing_spec(self.merged if self.merged is not None else model)  # ValueError: the model has no MoE router

    def sync_weights(self, weights: WeightSource | torch.nn.Module, version: int) -> None:
        """Load the learner's weights (any :mod:`grpoplus.rollout.weights` source): share a module in this process itself,
        or make a new low-precision copy of it; other sources are copied into the module the engine was built
        on. A LoRA policy is sampled through a plain module whose adapted weights are re-merged here (W + delta W);
        one on a 4-bit base (learner.quantize) through its own module, adapters on."""
        self.model = self._sampler(module_of(weights, self.base))
        self.version = version

    def _sampler(self, model: torch.nn.Module) -> torch.nn.Module:
        if is_lora(model) and is_4bit(model):  # 4-bit weights cannot hold W + delta W: the policy's own module
            return compute_module(model)
        if is_lora(model):  # merged weights decode at the base model's cost (no adapter matmuls per step)
            if self.merged is None:
                self.merged = plain_model(model, merged=True)
            else:
                merge_into(self.merged, model)
            model = self.merged
        model = sampler_model(model, self.quantization)
        if self.quantization != "none" or not casts_linears(self.cast_weights, next(model.parameters()).device,
                                                            self.dtype, model):
            return model
        if self.cast is None or self.cast[0] is not model:
            self.cast = (model, cast_copy(model, self.dtype))
        else:
            refresh_cast(self.cast[1], model)
        return self.cast[1]

    def offload(self) -> None:
        """Before an update: with ``run.release_memory``, the compiled step's static batches and captured graphs are
        freed (the engine samples with the learner's module, or a small copy of it: nothing else to free)."""
        if self.release_memory and self.step is not None:
            self.step.release()

    def close(self) -> None:
        """Nothing to release: the engine lives in the learner's process."""

    def generate(self, prompts: list[str] | list[list[int]], params: SamplingParams,
                 prompt_index: list[int] | None = None, generator: torch.Generator | None = None,
                 images: list[list] | None = None, vision: list[VisionInputs] | None = None) -> Rollouts:
        """Sample ``params.n`` responses for each prompt (text, or token ids taken as they are); groups are
        contiguous rows of the result. ``images``: a vision-language model's, per prompt (its chat-template text
        holds their placeholders): the rows carry the processor's outputs (``Rollouts.vision``). ``vision``: with
        token-id prompts, each one's processor outputs already taken (per-token values over its ids, its images: a
        multi-turn context, :mod:`grpoplus.envs.episodes`)."""
        check_request(prompts, params, prompt_index)
        device = next(self.model.parameters()).device
        ids, mask, vision = self._encode(prompts, images, vision)
        ids, mask = ids.to(device), mask.to(device)  # [B, P]
        stop_ids = torch.tensor(self.stop_ids, device=device)
        was_training = self.model.training
        self.model.eval()
        try:
            parts = [decode(self.model, chunk_ids, chunk_mask, repeats, params, stop_ids, self.pad_id, generator,
                            self.pack_weights, self.dtype, self.step,
                            None if vision is None else vision[first:first + len(repeats)])
                     for chunk_ids, chunk_mask, repeats, first in row_chunks(ids, mask, params.n, self.max_batch_size)]
        finally:
            self.model.train(was_training)
        prompt_ids, prompt_mask = ids.repeat_interleave(params.n, 0), mask.repeat_interleave(params.n, 0)  # [N, P]
        tokens, mask, logp = (pad_right([p[k] for p in parts], fill) for k, fill in ((0, self.pad_id), (1, 0), (2, 0)))
        finished = torch.cat([p[3] for p in parts])
        if self.placeholders:
            end_before(tokens, mask, logp, finished, torch.tensor(self.placeholders, device=tokens.device), self.pad_id)
        lengths = mask.sum(1).long().tolist()
        texts = self.tokenizer.batch_decode([row[:n].tolist() for row, n in zip(tokens, lengths)],
                                            skip_special_tokens=True)
        cpu = torch.device("cpu")  # the trainer's bookkeeping lives on the CPU; the learner moves what it needs
        routing = self._routing(prompt_ids, prompt_mask, tokens, mask).to(cpu) if self.record_routing else None
        return Rollouts(
            prompt_ids=prompt_ids.to(cpu), prompt_mask=prompt_mask.to(cpu), response_ids=tokens.to(cpu),
            response_mask=mask.to(cpu), logp_roll=logp.to(cpu), finished=finished.to(cpu),
            group_ids=torch.arange(len(prompts)).repeat_interleave(params.n),
            texts=texts, prompt_index=list(prompt_index) if prompt_index is not None else list(range(len(prompts))),
            policy_version=self.version, routing=routing,
            vision=None if vision is None else [vision[j] for j in range(len(prompts)) for _ in range(params.n)],
        )

    def _encode(self, prompts, images, vision=None) -> tuple[torch.Tensor, torch.Tensor, list[VisionInputs] | None]:
        """Left-padded ids and mask of the prompts, and a vision-language model's processor outputs per prompt."""
        if (images is not None or vision is not None) and not self.vision:
            raise ValueError(f"prompts with images, but the policy ({type(self.model).__name__}) is a text model: use "
                             "an image-text-to-text model, or rows without images")
        if vision is not None:  # token ids whose processor outputs were taken already
            if len(vision) != len(prompts) or isinstance(prompts[0], str):
                raise ValueError(f"vision inputs go with token-id prompts, one each: {len(vision)} for {len(prompts)}")
            return (*encode_prompts(self.tokenizer, prompts, self.pad_id), list(vision))
        if not self.vision or self.processor is None:
            if self.vision and images is not None:
                raise ValueError("prompts with images need the model's processor: build the engine with it")
            return (*encode_prompts(self.tokenizer, prompts, self.pad_id), None)
        if not isinstance(prompts[0], str):
            raise ValueError("a vision-language model's prompts are chat-template text (its processor expands the "
                             "image placeholders), not token ids")
        return encode_vision_prompts(self.processor, prompts, images, self.pad_id)

    def _routing(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, tokens: torch.Tensor,
                 mask: torch.Tensor) -> torch.Tensor:
        """[N, P + T, L, k] the experts the sampler's model routes every token to (one teacher-forced
        forward, grpoplus.models.routing.rollout_routing: the decode loop's choices up to float rounding,
        i.e. except at a near-tie of two experts), NATURAL on padding."""
        routing = rollout_routing(self.model, prompt_ids, prompt_mask, tokens, mask,
                                  micro_batch_size=self.max_batch_size)
        real = torch.cat([prompt_mask.bool(), mask.bool()], 1)  # [N, P + T]
        return routing.masked_fill(~real[:, :, None, None], NATURAL)


def row_chunks(input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int, max_rows: int | None
               ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]:
    """Split the ``B * n`` rows (``n`` per prompt, contiguous) into runs of at most ``max_rows``.

    Returns, per run, the distinct prompts it touches ([b, P] ids and mask), how many of
    its rows each one has ([b] long) and the first one's index; a group may straddle two runs.
    """
    total = input_ids.shape[0] * n
    step = max_rows or total
    chunks = []
    for start in range(0, total, step):
        prompt_of_row = torch.arange(start, min(start + step, total)) // n  # [rows]
        first = int(prompt_of_row[0])
        repeats = torch.bincount(prompt_of_row - first).to(input_ids.device)  # [b]
        chunks.append((input_ids[first:first + len(repeats)], attention_mask[first:first + len(repeats)], repeats,
                       first))
    return chunks


def end_before(tokens, mask, logp, finished, banned: torch.Tensor, pad_id: int) -> None:
    """End each row before the first sampled token of ``banned`` (an image placeholder: the row could not be
    forwarded again), in place: that token and the rest are padding, and the row is unfinished (as if cut)."""
    hit = torch.isin(tokens, banned) & mask.bool()  # [N, T]
    if hit.any():
        after = hit.long().cumsum(1) > 0
        tokens.masked_fill_(after, pad_id)
        mask.masked_fill_(after, 0)
        logp.masked_fill_(after, 0.0)
        finished.masked_fill_(hit.any(1), False)


def pad_right(parts: list[torch.Tensor], fill: float) -> torch.Tensor:
    """Concatenate [n_i, T_i] tensors along rows, right-padding each to the largest T_i."""
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=fill) for p in parts])
