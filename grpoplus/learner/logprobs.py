"""The learner's log-probs of sampled response tokens (``logp``, ``logp_old``, ``logp_ref``).

One forward over ``cat(prompt, response)`` with the same attention mask and position-id
convention as the rollout engine, so that with equal weights and fp32 the learner's
numbers equal the sampler's ``logp_roll`` (tests/rollout checks this to 1e-5).

Memory: the vocabulary is large (49k for SmolLM2), so the full [N, T, V] float32
log-softmax is never materialised next to the logits. :class:`TokenLogProb` computes
``logp = z[tok] - logsumexp(z)`` (``z = logits / temperature``) over row chunks and, in
backward, recomputes the softmax chunk by chunk; it saves only the logits, which the
model produced anyway.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial

import torch

from grpoplus.rollout.base import Rollouts

CHUNK_ELEMENTS = 1 << 24  # float32 elements per chunk of the [rows, T, V] softmax work (64 MiB)


def _row_chunks(logits: torch.Tensor) -> list[slice]:
    rows = max(1, CHUNK_ELEMENTS // max(1, logits.shape[1] * logits.shape[2]))
    return [slice(i, i + rows) for i in range(0, logits.shape[0], rows)]


class TokenLogProb(torch.autograd.Function):
    """``log softmax(logits / temperature)`` gathered at ``tokens``, computed over row chunks.

    Forward: logits [N, T, V], tokens [N, T] long -> [N, T] float32.
    Backward: d logp / d z = onehot(tok) - softmax(z), times 1 / temperature.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
        out = logits.new_empty(tokens.shape, dtype=torch.float32)  # [N, T]
        for rows in _row_chunks(logits):
            z = logits[rows].float() / temperature  # [n, T, V]
            out[rows] = z.gather(-1, tokens[rows, :, None]).squeeze(-1) - z.logsumexp(-1)
        ctx.save_for_backward(logits, tokens)
        ctx.temperature = temperature
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, tokens = ctx.saved_tensors
        grad = torch.empty_like(logits)  # [N, T, V]
        for rows in _row_chunks(logits):
            p = (logits[rows].float() / ctx.temperature).softmax(-1)  # [n, T, V]
            onehot_minus_p = p.neg_().scatter_add_(-1, tokens[rows, :, None], torch.ones_like(p[..., :1]))
            grad[rows] = (onehot_minus_p * (grad_out[rows, :, None] / ctx.temperature)).to(grad.dtype)
        return grad, None, None


@torch.no_grad()
def token_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` per position: [N, T, V] -> [N, T] float32 (no grad)."""
    out = logits.new_empty(logits.shape[:2], dtype=torch.float32)
    for rows in _row_chunks(logits):
        logp = (logits[rows].float() / temperature).log_softmax(-1)  # [n, T, V]
        out[rows] = -(logp.exp() * logp).sum(-1)
    return out


def _forward_rows(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature, with_entropy,
                  routing=None):
    """Log-probs (and entropy) of one micro-batch; left/right columns that are padding in every row are trimmed."""
    keep_p = prompt_mask.bool().any(0).nonzero()
    p0 = int(keep_p[0]) if len(keep_p) else prompt_ids.shape[1]
    keep_t = response_mask.bool().any(0).nonzero()
    t1 = int(keep_t[-1]) + 1 if len(keep_t) else 0
    n, T = response_ids.shape
    logp = response_mask.new_zeros(n, T, dtype=torch.float32)
    entropy = response_mask.new_zeros(n, T, dtype=torch.float32) if with_entropy else None
    if t1 == 0:  # no response token at all: nothing to score
        return logp, entropy
    input_ids = torch.cat([prompt_ids[:, p0:], response_ids[:, :t1]], 1)  # [n, P' + t1]
    attention_mask = torch.cat([prompt_mask[:, p0:], response_mask[:, :t1].to(prompt_mask.dtype)], 1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)  # same convention as the engine
    # The logits at positions P'-1 .. P'+t1-2 predict the response tokens 0 .. t1-1.
    # MoE routing replay/recording (grpoplus.learner.replay) of the input columns p0 .. P + t1 - 1.
    with nullcontext() if routing is None else routing(slice(p0, prompt_ids.shape[1] + t1)):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       logits_to_keep=t1 + 1).logits[:, :-1]  # [n, t1, V]
    tokens = response_ids[:, :t1]
    logp = torch.cat([TokenLogProb.apply(logits, tokens, temperature), logp[:, t1:]], 1)
    if with_entropy:
        entropy[:, :t1] = token_entropy(logits.detach(), temperature)
    return logp * response_mask.to(logp.dtype), entropy


def response_logprobs(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      response_ids: torch.Tensor, response_mask: torch.Tensor, *, temperature: float = 1.0,
                      with_entropy: bool = False, micro_batch_size: int | None = None, routing=None
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of every response token under ``softmax(model logits / temperature)``.

    Differentiable (the learner calls it with grad for ``logp``; without grad for
    ``logp_old`` / ``logp_ref``). Zero where ``response_mask`` is 0.

    Args:
        prompt_ids, prompt_mask: [N, P] left-padded prompts (mask 1 on real tokens).
        response_ids, response_mask: [N, T] right-padded responses (mask 1 on sampled tokens).
        temperature: the sampling temperature, so ``logp`` is comparable with ``logp_roll``.
        with_entropy: also return the per-token entropy of the same distribution (no grad).
        micro_batch_size: forward at most this many rows at a time (bounds activation
            memory for no-grad scoring; under grad all activations are kept anyway).
        routing: MoE routing of the forwards (a ``grpoplus.learner.replay.LearnerRouting``, called
            with each forward's row slice and input-column slice); None: the router's own choice.

    Returns:
        ``(logp [N, T] float32, entropy [N, T] float32 or None)``.
    """
    if prompt_ids.shape != prompt_mask.shape or response_ids.shape != response_mask.shape:
        raise ValueError(f"ids and masks must have equal shapes: prompt {tuple(prompt_ids.shape)} vs "
                         f"{tuple(prompt_mask.shape)}, response {tuple(response_ids.shape)} vs "
                         f"{tuple(response_mask.shape)}")
    if prompt_ids.shape[0] != response_ids.shape[0]:
        raise ValueError(f"{prompt_ids.shape[0]} prompt rows but {response_ids.shape[0]} response rows")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    step = micro_batch_size or prompt_ids.shape[0]
    parts = [_forward_rows(model, prompt_ids[i:i + step], prompt_mask[i:i + step], response_ids[i:i + step],
                           response_mask[i:i + step], temperature, with_entropy,
                           None if routing is None else partial(routing, slice(i, i + step)))
             for i in range(0, prompt_ids.shape[0], step)]
    logp = torch.cat([p[0] for p in parts])
    return logp, torch.cat([p[1] for p in parts]) if with_entropy else None


def response_logprobs_from_rollouts(model: torch.nn.Module, rollouts: Rollouts, **kwargs
                                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`response_logprobs` on the tensors of a :class:`Rollouts`; ``kwargs`` are passed through."""
    return response_logprobs(model, rollouts.prompt_ids, rollouts.prompt_mask, rollouts.response_ids,
                             rollouts.response_mask, **kwargs)
