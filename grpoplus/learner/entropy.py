"""The token entropy WITH its gradient, for the entropy bonus (``AlgoConfig.entropy_bonus``).

``grpoplus.learner.logprobs`` measures the entropy without gradient (a metric, the
high-entropy mask). The bonus ``-c * agg(H)`` of ``policy_loss`` needs ``dH/dz``: with
``z = logits / temperature``, ``p = softmax(z)`` and ``H = logsumexp(z) - sum_v p_v z_v``,

    dH/dz_v = -p_v (log p_v + H)

(differentiate ``H = -sum_v p_v log p_v`` with ``dp_u/dz_v = p_u (1[u = v] - p_v)``:
``-p_v (log p_v + 1) + p_v sum_u p_u (log p_u + 1) = -p_v (log p_v + H)``). As
:class:`~grpoplus.learner.logprobs.TokenLogProb`, :class:`TokenEntropy` works over row chunks,
saves only the logits (the model produced them anyway; ``TokenLogProb`` saves the same
tensor) and recomputes the softmax chunk by chunk in backward, so no [N, T, V] softmax is
kept for backward.

:func:`response_logprobs_and_entropy` is the update's forward when the bonus is on: one
model forward, ``logp`` and ``H`` both differentiable.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from grpoplus.learner.logprobs import TokenLogProb, float_work_dtype, row_slices, trimmed_inputs
from grpoplus.learner.packing import pack_rows, packed_forward


def _row_chunks(logits: torch.Tensor) -> list[slice]:
    """Row slices of ``logits`` [N, T, V] within the shared chunk budget of the log-prob path."""
    return row_slices(logits.shape[0], logits.shape[1] * logits.shape[2])


class TokenEntropy(torch.autograd.Function):
    """Entropy of ``softmax(logits / temperature)`` per position, differentiable.

    Forward: logits [N, T, V] -> [N, T] (float32, float64 for float64 logits).
    Backward: ``d H / d logits = -p (log p + H) / temperature``.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, temperature: float) -> torch.Tensor:
        out = logits.new_empty(logits.shape[:2], dtype=float_work_dtype(logits.dtype))  # [N, T]
        for rows in _row_chunks(logits):
            logp = (logits[rows].to(out.dtype) / temperature).log_softmax(-1)  # [n, T, V]
            out[rows] = -(logp.exp() * logp).sum(-1)
        ctx.save_for_backward(logits, out)
        ctx.temperature = temperature
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, entropy = ctx.saved_tensors
        grad = torch.empty_like(logits)  # [N, T, V]
        for rows in _row_chunks(logits):
            logp = (logits[rows].to(entropy.dtype) / ctx.temperature).log_softmax(-1)  # [n, T, V]
            d_z = -logp.exp() * (logp + entropy[rows, :, None])  # dH/dz
            grad[rows] = (d_z * (grad_out[rows, :, None] / ctx.temperature)).to(grad.dtype)
        return grad, None


def token_entropy_with_grad(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``H`` of ``softmax(logits / temperature)``: [N, T, V] -> [N, T], with autograd through ``logits``."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return TokenEntropy.apply(logits, temperature)


def response_logprobs_and_entropy(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                                  response_ids: torch.Tensor, response_mask: torch.Tensor, *,
                                  temperature: float = 1.0, routing=None, packing: bool = False,
                                  packed_attention: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One micro-batch's ``(logp [N, T], H [N, T])``, both differentiable, zero where ``response_mask`` is 0.

    The same forward as the logits path of :func:`grpoplus.learner.logprobs.response_logprobs`
    (left prompt and right response columns that are padding in every row trimmed, the engine's
    position ids; ``packing``: the rows' real tokens as one sequence, :mod:`grpoplus.learner.packing`), with the
    entropy taken by :class:`TokenEntropy` from the same logits. It materialises the logits of the response
    tokens, which the chunked-head path of ``response_logprobs`` avoids: to be folded into that module (an
    ``entropy_grad`` option of its chunked head). ``routing``: MoE routing of the forward, as in
    ``response_logprobs`` (called with the row and input-column slices, and a packed forward's real tokens);
    ``packed_attention``: a packed forward's attention implementation (None: the model's own).
    """
    n, T = response_ids.shape
    input_ids, attention_mask, position_ids, p0, t1 = trimmed_inputs(prompt_ids, prompt_mask, response_ids,
                                                                     response_mask)
    if t1 == 0:  # no response token at all: nothing to score
        zeros = response_mask.new_zeros(n, T, dtype=torch.promote_types(next(model.parameters()).dtype, torch.float32))
        return zeros, zeros.clone()
    tokens, mask = response_ids[:, :t1], response_mask[:, :t1]
    where = mask.bool().nonzero(as_tuple=True)
    packed = pack_rows(input_ids, attention_mask, position_ids, where, input_ids.shape[1] - t1,
                       packed_attention) if packing else None
    cols = slice(p0, prompt_ids.shape[1] + t1)

    def forward():
        with nullcontext() if routing is None else routing(slice(0, n), cols, None if packed is None else packed.keep):
            if packed is None:  # [n, t1, V]: P'-1+t predicts t
                return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=False, logits_to_keep=t1 + 1).logits[:, :-1]
            return model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
                         logits_to_keep=packed.predict).logits  # [1, M, V]

    logits = forward() if packed is None else packed_forward(model, packed.attention, forward)
    if packed is not None:
        tokens = tokens[where][None]  # [1, M]
    logp = TokenLogProb.apply(logits, tokens, temperature)
    entropy = TokenEntropy.apply(logits, temperature)
    if packed is not None:  # [1, M] -> [n, t1]
        logp, entropy = (logp.new_zeros(mask.shape).index_put(where, x[0]) for x in (logp, entropy))
    else:
        logp, entropy = logp * mask.to(logp.dtype), entropy * mask.to(entropy.dtype)
    pad = (0, T - t1)
    return torch.nn.functional.pad(logp, pad), torch.nn.functional.pad(entropy, pad)
