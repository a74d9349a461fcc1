"""One sampling step: logits in, sampled token and its log-prob under the sampling distribution out.

Pure functions, shared by every in-process engine. The log-prob returned is the one of
the distribution the token was actually drawn from (temperature-scaled, nucleus-truncated
and renormalised): that is ``mu`` in the rollout-correction formulas (ALGORITHMS.md §5).
"""

from __future__ import annotations

import torch


def top_p_filter(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus truncation (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", eq. 2-3).

    Keeps the smallest set of tokens whose cumulative probability is >= ``top_p`` (the
    most likely token is always kept) and renormalises over it.

    Args:
        logp: [n, V] float32 log-probabilities (already temperature-scaled).
        top_p: in (0, 1]; 1 returns ``logp`` unchanged.

    Returns:
        [n, V] renormalised log-probabilities, ``-inf`` outside the nucleus.
    """
    if top_p >= 1.0:
        return logp
    sorted_logp, order = logp.sort(-1, descending=True)  # [n, V]
    cum = sorted_logp.exp().cumsum(-1)  # [n, V]
    # A token is in the nucleus when the mass strictly before it is still < top_p.
    drop_sorted = (cum - sorted_logp.exp()) >= top_p  # [n, V]
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
    return logp.masked_fill(drop, float("-inf")).log_softmax(-1)


def draw_from(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row with probability ``probs[row, i]`` (inverse-CDF sampling): [n, V] -> [n] long.

    One uniform number per row, located in the row's cumulative sum (float64, so rounding
    does not bias the tail); an index of probability 0 has an empty interval and is never
    drawn. ``torch.multinomial`` draws one exponential variate per vocabulary entry
    instead, ~20x slower for a 49k vocabulary on a CPU.

    The uniforms are drawn on ``generator``'s own device and then moved to ``probs``'s: a
    CPU generator (the collector's, whose state a checkpoint keeps) draws the same stream
    whether the model runs on the CPU or a GPU.
    """
    cdf = probs.double().cumsum(-1)  # [n, V]
    total = cdf[:, -1:]  # [n, 1]
    device = probs.device if generator is None else generator.device
    u = torch.rand(total.shape, generator=generator, dtype=torch.float64, device=device).to(probs.device) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # u < total even after rounding
    return torch.searchsorted(cdf, u, right=True).squeeze(1)  # the first i with cdf[i] > u


def sample_next(logits: torch.Tensor, *, temperature: float, top_p: float, greedy: bool,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and return ``(tokens [n] long, logp [n] float32)``.

    ``greedy``: argmax; its log-prob is taken under the unscaled (temperature 1) softmax.
    Otherwise the token is drawn from ``top_p_filter(log_softmax(logits / temperature))``
    and ``logp`` is its log-prob under exactly that distribution.

    Args:
        logits: [n, V] next-token logits (any float dtype; computed in float32).
    """
    logits = logits.float()
    if greedy:
        logp_all = logits.log_softmax(-1)  # [n, V]
        tokens = logits.argmax(-1)  # [n]
    else:
        logp_all = top_p_filter((logits / temperature).log_softmax(-1), top_p)  # [n, V]
        tokens = draw_from(logp_all.exp(), generator)  # [n]
    return tokens, logp_all.gather(-1, tokens[:, None]).squeeze(-1)
