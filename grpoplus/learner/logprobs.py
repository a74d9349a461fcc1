"""The learner's log-probs of sampled response tokens (``logp``, ``logp_old``, ``logp_ref``).

One forward over ``cat(prompt, response)`` with the same attention mask and position-id
convention as the rollout engine, so that with equal weights and fp32 the learner's
numbers equal the sampler's ``logp_roll`` (tests/rollout checks this to 1e-5).

Memory and work: the vocabulary is large (49k for SmolLM2), so [tokens x V] logits are
never held. For the architectures in :data:`HEAD_MODEL_TYPES` the model body runs alone
(:func:`body_hidden_states`) and :class:`ChunkedHeadLogProb` applies the LM head to the
hidden states of the response tokens only (prompt and padding positions never reach the
head), chunk by chunk: forward keeps ``logsumexp`` per token, backward recomputes each
chunk's logits and accumulates ``d hidden`` and ``d head.weight``. On that path rows that
share a prompt (a GRPO group) compute it once (:mod:`~grpoplus.learner.shared_prompt`). Other models (a head
with a bias, a logit soft-cap or scale, hooks on the head) take the logits path: the
model's own logits, then :class:`TokenLogProb` over row chunks.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial

import torch

from grpoplus.containers import Rollouts
from grpoplus.learner.packing import PackedRows, pack_rows, packed_forward, packing_pays
from grpoplus.learner.shared_prompt import shared_prompt_hidden
from grpoplus.models.cpu_matmul import mm, routes
from grpoplus.models.device import autocast_to
from grpoplus.models.lora import compute_module
from grpoplus.models.vision import forward_inputs, placeholder_ids, vision_positions

CHUNK_ELEMENTS = 1 << 24  # float32 elements per chunk of the [tokens, V] softmax work (64 MiB)
SAVED_SOFTMAX_BYTES = 256 << 20  # a head's whole [tokens, V] softmax is kept for its backward up to this size

HEAD_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "olmo2", "olmo3", "phi3", "smollm3",
    "glm4", "glm4_moe", "deepseek_v3", "llama4_text", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "olmo_hybrid",
    "lfm2", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "idefics3", "smolvlm", "gemma3"})
"""``config.model_type`` of the transformers causal LMs whose logits are exactly
``lm_head(model.model(...).last_hidden_state)``: no bias, scale or soft-cap after the head."""


def float_work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision and float32 models, float64 for float64 ones (exact gradient tests)."""
    return torch.promote_types(dtype, torch.float32)


def row_slices(total: int, width: int) -> list[slice]:
    """Slices of at most ``CHUNK_ELEMENTS // width`` rows covering ``range(total)``."""
    rows = max(1, CHUNK_ELEMENTS // max(1, width))
    return [slice(i, i + rows) for i in range(0, total, rows)]


class ChunkedHeadLogProb(torch.autograd.Function):
    """``log softmax(hidden @ weight.T / temperature)`` at ``tokens``, never holding [M, V] logits.

    Forward: hidden [M, H], weight [V, H], tokens [M] long -> (logp [M], entropy [M] (no
    grad) or None), float32 (float64 for float64 inputs). Per chunk of rows, ``z = h W^T / T``,
    ``logp = z[tok] - logsumexp(z)``. Backward: ``d logp / d z = onehot(tok) - softmax(z)``; with
    ``g`` the incoming gradient, ``dz = g (onehot - p) / T``, ``d h = dz W`` and ``d W = dz^T h``. ``onednn``: the
    products by oneDNN where the process routes float32 CPU products so (the head is a marked layer,
    :func:`grpoplus.models.cpu_matmul.routes`).
    The whole softmax is kept for the backward where it takes at most :data:`SAVED_SOFTMAX_BYTES` (a fourth of
    the head's matmuls saved: the logits are not computed again; the backward's two products then run once over
    all rows, faster than per chunk), else only the [M] logsumexp is and each chunk's ``z`` is recomputed. A tied
    head (``weight`` is the embedding) gets its gradient added to the embedding's by autograd, as the parameter is
    the same tensor.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor, temperature: float,
                with_entropy: bool, onednn: bool = False):
        work = float_work_dtype(hidden.dtype)
        logp = hidden.new_empty(hidden.shape[0], dtype=work)  # [M]
        lse = torch.empty_like(logp)  # [M]
        entropy = torch.empty_like(logp) if with_entropy else None
        keep = hidden.shape[0] * weight.shape[0] * lse.element_size() <= SAVED_SOFTMAX_BYTES
        # the whole softmax [M, V] for the backward, filled chunk by chunk: its products then run once over all rows
        ctx.probs = hidden.new_empty(hidden.shape[0], weight.shape[0], dtype=work) if keep else None
        for rows in row_slices(hidden.shape[0], weight.shape[0]):
            z = mm(hidden[rows], weight.T, onednn).to(work).div_(temperature)  # [c, V]
            lse[rows] = z.logsumexp(-1)
            logp[rows] = z.gather(-1, tokens[rows, None]).squeeze(-1) - lse[rows]
            if with_entropy or keep:  # softmax(z)
                p = torch.sub(z, lse[rows, None], out=ctx.probs[rows] if keep else None).exp_()
            if with_entropy:  # H = logsumexp(z) - sum_v p_v z_v (a batched dot: no [c, V] product)
                entropy[rows] = lse[rows] - torch.bmm(p[:, None], z[:, :, None]).view(-1)
        ctx.save_for_backward(hidden, weight, tokens, lse)
        ctx.temperature, ctx.onednn = temperature, onednn
        ctx.autocast = _autocast_state(hidden.device.type)
        if with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: torch.Tensor, grad_entropy: torch.Tensor | None):
        hidden, weight, tokens, lse = ctx.saved_tensors
        probs, ctx.probs = ctx.probs, None  # consumed in place; a second backward recomputes them
        need_h, need_w = ctx.needs_input_grad[:2]
        d_hidden = torch.empty_like(hidden) if need_h else None  # [M, H]
        d_weight = None  # [V, H], accumulated in float32 whatever the forward's precision
        for rows in [slice(None)] if probs is not None else row_slices(hidden.shape[0], weight.shape[0]):
            h = hidden[rows]  # [c, H]
            if probs is not None:
                dz = probs.neg_()  # -softmax(z), every row
            else:
                with autocast_to(ctx.autocast, hidden.device):  # the forward's precision: the same z
                    z = mm(h, weight.T, ctx.onednn).to(lse.dtype).div_(ctx.temperature)  # [c, V], recomputed
                dz = z.sub_(lse[rows, None]).exp_().neg_()
            dz.scatter_add_(-1, tokens[rows, None], torch.ones_like(dz[:, :1]))  # onehot(tok) - softmax(z)
            dz.mul_(grad_logp[rows, None] / ctx.temperature)
            if need_h:
                with autocast_to(ctx.autocast, hidden.device):
                    d_hidden[rows] = mm(dz.to(weight.dtype), weight, ctx.onednn).to(hidden.dtype)
            if need_w:
                part = head_weight_grad(dz, h, ctx.autocast, ctx.onednn)  # [V, H]
                d_weight = part if d_weight is None else d_weight.add_(part)
        return d_hidden, None if d_weight is None else d_weight.to(weight.dtype), None, None, None, None


def head_weight_grad(dz: torch.Tensor, h: torch.Tensor, autocast: torch.dtype | None, onednn: bool) -> torch.Tensor:
    """``dz^T h`` ([V, H], float32): the head's weight gradient from a chunk. On a GPU under bf16 autocast its
    operands are rounded to bf16 and the product accumulates in float32 (``mm``'s ``out_dtype``): the tensor cores'
    rate, and the rounding autocast gives every other layer's weight gradient; elsewhere float32 operands."""
    if autocast == torch.bfloat16 and dz.is_cuda:
        return torch.mm(dz.T.to(autocast), h.to(autocast), out_dtype=torch.float32)
    return mm(dz.T, h.to(dz.dtype), onednn)


def _autocast_state(device_type: str) -> torch.dtype | None:
    """The autocast dtype in force for ``device_type`` (None: autocast off), to replay in a backward (a custom
    Function's backward runs outside the forward's autocast)."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


class TokenLogProb(torch.autograd.Function):
    """``log softmax(logits / temperature)`` gathered at ``tokens``, computed over row chunks (logits path).

    Forward: logits [N, T, V], tokens [N, T] long -> [N, T] float32 (float64 for float64 logits).
    Backward: d logp / d z = onehot(tok) - softmax(z), times 1 / temperature.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
        out = logits.new_empty(tokens.shape, dtype=float_work_dtype(logits.dtype))  # [N, T]
        for rows in row_slices(logits.shape[0], logits.shape[1] * logits.shape[2]):
            z = logits[rows].to(out.dtype) / temperature  # [n, T, V]
            out[rows] = z.gather(-1, tokens[rows, :, None]).squeeze(-1) - z.logsumexp(-1)
        ctx.save_for_backward(logits, tokens)
        ctx.temperature = temperature
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, tokens = ctx.saved_tensors
        grad = torch.empty_like(logits)  # [N, T, V]
        for rows in row_slices(logits.shape[0], logits.shape[1] * logits.shape[2]):
            p = (logits[rows].to(grad_out.dtype) / ctx.temperature).softmax(-1)  # [n, T, V]
            onehot_minus_p = p.neg_().scatter_add_(-1, tokens[rows, :, None], torch.ones_like(p[..., :1]))
            grad[rows] = (onehot_minus_p * (grad_out[rows, :, None] / ctx.temperature)).to(grad.dtype)
        return grad, None, None


@torch.no_grad()
def token_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` per position: [N, T, V] -> [N, T] float32 or float64 (no grad)."""
    out = logits.new_empty(logits.shape[:2], dtype=float_work_dtype(logits.dtype))
    for rows in row_slices(logits.shape[0], logits.shape[1] * logits.shape[2]):
        logp = (logits[rows].to(out.dtype) / temperature).log_softmax(-1)  # [n, T, V]
        out[rows] = -(logp.exp() * logp).sum(-1)
    return out


def chunked_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's LM head when :class:`ChunkedHeadLogProb` computes its logits exactly, else None.

    Exact when the architecture is in :data:`HEAD_MODEL_TYPES` and the head is a plain
    bias-free ``nn.Linear`` with no hooks (a hook may change the logits, e.g. in tests).
    """
    head = getattr(model, "lm_head", None)
    supported = (getattr(getattr(model, "config", None), "model_type", None) in HEAD_MODEL_TYPES
                 and isinstance(getattr(model, "model", None), torch.nn.Module)
                 and type(head) is torch.nn.Linear and head.bias is None
                 and not (head._forward_hooks or head._forward_pre_hooks))
    return head if supported else None


def body_hidden_states(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       position_ids: torch.Tensor, extra: dict | None = None) -> torch.Tensor:
    """The transformer body without the LM head: [n, L] ids -> [n, L, H] last hidden states (``extra``: a
    vision-language model's inputs beyond the ids, :func:`grpoplus.models.vision.forward_inputs`).

    The one place the learner runs the body, so a context that must surround every
    learner forward (e.g. routing replay of a mixture-of-experts model) wraps this call.
    """
    return model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=False, **(extra or {})).last_hidden_state


def _head_path(model, head, input_ids, attention_mask, position_ids, tokens, mask, temperature, with_entropy,
               share_prompts=False, packed: PackedRows | None = None, extra: dict | None = None, prompt_inputs=None):
    """logp (and entropy) [n, t1] through the body and the chunked head, response tokens only (``packed``: the
    rows' real tokens as one sequence, :mod:`~grpoplus.learner.packing`; ``extra``: a vision-language model's
    inputs beyond the ids, padded forwards only; ``prompt_inputs``: theirs for a shared prompt's pass,
    :func:`~grpoplus.learner.shared_prompt.shared_prompt_hidden`)."""
    t1 = tokens.shape[1]
    where = mask.bool().nonzero(as_tuple=True)  # the M response tokens present
    if packed is not None:
        hidden = body_hidden_states(model, packed.input_ids, None, packed.position_ids)[0, packed.predict]  # [M, H]
    else:
        hidden = shared_prompt_hidden(model, input_ids, attention_mask, position_ids, input_ids.shape[1] - t1, t1,
                                      always=share_prompts == "always", prompt_inputs=prompt_inputs) \
            if share_prompts else None
        if hidden is None:
            hidden = body_hidden_states(model, input_ids, attention_mask, position_ids, extra)[:, -t1 - 1:-1]  # [n, t1, H]
        hidden = hidden[where]  # [M, H]
    logp_m, entropy_m = ChunkedHeadLogProb.apply(hidden, head.weight, tokens[where], temperature, with_entropy,
                                                 routes(head))  # [M]
    return _scattered(logp_m, where, tokens.shape), _scattered(entropy_m, where, tokens.shape) if with_entropy else None


def _scattered(values: torch.Tensor, where: tuple[torch.Tensor, torch.Tensor], shape) -> torch.Tensor:
    """[M] values at ``where`` of a zero [n, t1] tensor, differentiable in ``values``."""
    return values.new_zeros(shape).index_put(where, values)


def _logits_path(model, input_ids, attention_mask, position_ids, tokens, mask, temperature, with_entropy,
                 packed: PackedRows | None = None, extra: dict | None = None):
    """logp (and entropy) [n, t1] from the model's own logits (architectures the head path does not cover);
    ``extra``: a vision-language model's inputs beyond the ids (padded forwards only)."""
    if packed is not None:  # the logits of the M outputs that predict response tokens: [1, M, V]
        where = mask.bool().nonzero(as_tuple=True)
        logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
                       logits_to_keep=packed.predict).logits
        logp_m = TokenLogProb.apply(logits, tokens[where][None], temperature)[0]
        entropy_m = token_entropy(logits.detach(), temperature)[0] if with_entropy else None
        return _scattered(logp_m, where, tokens.shape), _scattered(entropy_m, where, tokens.shape) if with_entropy else None
    t1 = tokens.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False, logits_to_keep=t1 + 1, **(extra or {})).logits[:, :-1]  # [n, t1, V]
    logp = TokenLogProb.apply(logits, tokens, temperature)
    mask = mask.to(logp.dtype)
    return logp * mask, token_entropy(logits.detach(), temperature) * mask if with_entropy else None


def trimmed_inputs(prompt_ids, prompt_mask, response_ids, response_mask, min_response: int = 0):
    """``(input_ids, attention_mask, position_ids, p0, t1)`` of one forward over ``cat(prompt, response)``: the
    left prompt columns and right response columns that are padding in every row trimmed (prompt columns from
    ``p0``, the first ``t1`` response columns, at least ``min_response`` where the batch has them; ``t1 = 0``: no
    response token at all), positions counted as the engine counts them. The outputs at positions
    ``P'-1 .. P'+t1-2`` predict the response tokens ``0 .. t1-1``."""
    keep_p = prompt_mask.bool().any(0).nonzero()
    p0 = int(keep_p[0]) if len(keep_p) else prompt_ids.shape[1]
    keep_t = response_mask.bool().any(0).nonzero()
    t1 = int(keep_t[-1]) + 1 if len(keep_t) else 0
    if t1:
        t1 = max(t1, min(min_response, response_ids.shape[1]))
    input_ids = torch.cat([prompt_ids[:, p0:], response_ids[:, :t1]], 1)  # [n, P' + t1]
    attention_mask = torch.cat([prompt_mask[:, p0:], response_mask[:, :t1].to(prompt_mask.dtype)], 1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)  # same convention as the engine
    return input_ids, attention_mask, position_ids, p0, t1


def _forward_rows(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature, with_entropy,
                  routing=None, share_prompts=False, packing=False, vision=None, packed_attention=None):
    """Log-probs (and entropy) of one micro-batch; left/right columns that are padding in every row are trimmed,
    or (``packing``: True, or "auto" where it computes less) every padding token left out. ``vision``: a
    vision-language model's rows (one :class:`~grpoplus.models.vision.VisionInputs` each): a padded forward of the
    model's own logits with their images; ``packed_attention``: the attention implementation of a packed forward
    (:func:`~grpoplus.learner.packing.packed_attention`; None: the model's own)."""
    n, T = response_ids.shape
    if vision is not None:  # padded (no packing with images yet); a response with images does not share its prompt
        packing = False
        # every row whole where a response shows an image (an observation's), and on sharded ranks ("always"), whose
        # forwards must run the body as often whatever their rows
        shown = torch.tensor(placeholder_ids(model.config), device=response_ids.device)
        share_prompts = False if share_prompts == "always" or torch.isin(response_ids, shown).any() else share_prompts
    if packing == "auto":  # packed where that computes less (grpoplus.learner.packing.packing_pays)
        packing = packing_pays(model, prompt_ids, prompt_mask, response_mask, share_prompts if routing is None else False,
                               attention=packed_attention)
    # share_prompts="always": two body passes whatever the rows (see response_logprobs)
    input_ids, attention_mask, position_ids, p0, t1 = trimmed_inputs(
        prompt_ids, prompt_mask, response_ids, response_mask,
        min_response=2 if share_prompts == "always" and not packing else 0)
    if t1 == 0:  # no response token at all: nothing to score
        zeros = response_mask.new_zeros(n, T, dtype=float_work_dtype(next(model.parameters()).dtype))
        return zeros, zeros.clone() if with_entropy else None
    head, extra, prompt_inputs = chunked_head(model), None, None
    if vision is not None:  # with the rows' images and their positions (Qwen's three rows)
        extra = forward_inputs(vision, prompt_mask[:, p0:], t1)
        position_ids = vision_positions(model, input_ids, attention_mask, extra)

        def prompt_inputs(rows: torch.Tensor) -> dict:  # a shared prompt pass's: those rows' images and prompt columns
            return forward_inputs([vision[i] for i in rows.tolist()], prompt_mask[rows, p0:], 0)
    tokens, mask = response_ids[:, :t1], response_mask[:, :t1]
    packed = pack_rows(input_ids, attention_mask, position_ids, mask.bool().nonzero(as_tuple=True),
                       input_ids.shape[1] - t1, packed_attention) if packing else None
    args = (input_ids, attention_mask, position_ids, tokens, mask, temperature, with_entropy)
    cols = slice(p0, prompt_ids.shape[1] + t1)
    # MoE routing replay/recording (grpoplus.learner.replay) of the input columns p0 .. P + t1 - 1 (packed: their
    # real tokens).
    def forward():
        with nullcontext() if routing is None else routing(cols, None if packed is None else packed.keep):
            if head is None:
                return _logits_path(model, *args, packed=packed, extra=extra)
            return _head_path(model, head, *args, share_prompts=share_prompts if routing is None else False,
                              packed=packed, extra=extra, prompt_inputs=prompt_inputs)

    logp, entropy = forward() if packed is None else packed_forward(model, packed.attention, forward)
    pad = (0, T - t1)
    return (torch.nn.functional.pad(logp, pad),
            torch.nn.functional.pad(entropy, pad) if with_entropy else None)


LEARNER_FORWARD = "grpoplus_logprobs"
"""A method of that name on the model is its learner forward (a sharded model's FSDP forward method, which
gathers its parameters around the call): :func:`response_logprobs` goes through it."""


def response_logprobs(model: torch.nn.Module, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`logprobs_of`, through the model's :data:`LEARNER_FORWARD` method when it has one."""
    method = getattr(model, LEARNER_FORWARD, None)
    return method(*args, **kwargs) if method is not None else logprobs_of(model, *args, **kwargs)


def logprobs_of(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                response_ids: torch.Tensor, response_mask: torch.Tensor, *, temperature: float = 1.0,
                with_entropy: bool = False, micro_batch_size: int | None = None, routing=None,
                share_prompts: bool | str = True, packing: bool | str = False, vision: list | None = None,
                packed_attention: str | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of every response token under ``softmax(model logits / temperature)``.

    Differentiable (the learner calls it with grad for ``logp``; without grad for
    ``logp_old`` / ``logp_ref``). Zero where ``response_mask`` is 0.

    Args:
        prompt_ids, prompt_mask: [N, P] left-padded prompts (mask 1 on real tokens).
        response_ids, response_mask: [N, T] right-padded responses (mask 1 on sampled tokens).
        temperature: the sampling temperature, so ``logp`` is comparable with ``logp_roll``.
        with_entropy: also return the per-token entropy of the same distribution (no grad;
            zero where ``response_mask`` is 0).
        micro_batch_size: forward at most this many rows at a time (bounds activation
            memory for no-grad scoring; under grad all activations are kept anyway).
        routing: MoE routing of the forwards (a ``grpoplus.learner.replay.LearnerRouting``, called
            with each forward's row slice and input-column slice); None: the router's own choice.
        share_prompts: compute each distinct prompt of a forward once (:mod:`grpoplus.learner.shared_prompt`)
            where the model allows it (head path, no routing replay); False: every row's full sequence;
            "always": the prompt pass and the response pass even when no two rows share a prompt (and over at
            least two response columns where the batch has them), so every forward runs the body as often
            whatever its rows: a sharded learner's ranks must (grpoplus.distributed.sharding).
        packing: each forward's rows as one sequence of their real tokens (:mod:`grpoplus.learner.packing`);
            "auto": each forward packed where that computes less (:func:`grpoplus.learner.packing.packing_pays`).
        packed_attention: the attention implementation a packed forward runs under (None: the model's own;
            ``flex_attention``: :func:`grpoplus.learner.packing.packed_attention`).
        vision: a vision-language model's rows: [N] :class:`~grpoplus.models.vision.VisionInputs` (``Rollouts.vision``),
            their images in every forward (padded, no packing yet; a group's prompt and images computed once where
            ``share_prompts`` applies, except where a response shows an image).

    Returns:
        ``(logp [N, T], entropy [N, T] or None)``, float32 (float64 for a float64 model).
    """
    if prompt_ids.shape != prompt_mask.shape or response_ids.shape != response_mask.shape:
        raise ValueError(f"ids and masks must have equal shapes: prompt {tuple(prompt_ids.shape)} vs "
                         f"{tuple(prompt_mask.shape)}, response {tuple(response_ids.shape)} vs "
                         f"{tuple(response_mask.shape)}")
    if prompt_ids.shape[0] != response_ids.shape[0]:
        raise ValueError(f"{prompt_ids.shape[0]} prompt rows but {response_ids.shape[0]} response rows")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    model = compute_module(model)  # a LoRA policy: the base model whose layers carry the adapters
    step = micro_batch_size or prompt_ids.shape[0]
    parts = [_forward_rows(model, prompt_ids[i:i + step], prompt_mask[i:i + step], response_ids[i:i + step],
                           response_mask[i:i + step], temperature, with_entropy,
                           None if routing is None else partial(routing, slice(i, i + step)), share_prompts, packing,
                           None if vision is None else vision[i:i + step], packed_attention)
             for i in range(0, prompt_ids.shape[0], step)]
    logp = torch.cat([p[0] for p in parts])
    return logp, torch.cat([p[1] for p in parts]) if with_entropy else None


def response_logprobs_from_rollouts(model: torch.nn.Module, rollouts: Rollouts, **kwargs
                                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`response_logprobs` on the tensors of a :class:`Rollouts` (with their images, a vision-language
    policy's); ``kwargs`` are passed through."""
    if rollouts.vision is not None:
        kwargs.setdefault("vision", rollouts.vision)
    return response_logprobs(model, rollouts.prompt_ids, rollouts.prompt_mask, rollouts.response_ids,
                             rollouts.response_mask, **kwargs)
