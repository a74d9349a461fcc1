"""Micro-batches by token budget: rows of similar length together, so padding columns are few.

A learner forward costs about (rows x padded width) tokens of work and activation memory,
so a budget of tokens bounds both better than a number of rows: many short responses fit
in one forward, a few long ones in another. The aggregation normaliser of the loss is
global (ALGORITHMS.md section 3), so how the rows are split and in which order the
micro-batches run changes the accumulated gradient only by float summation order.
"""

from __future__ import annotations

import torch


def padded_width(lengths: torch.Tensor) -> int:
    """Width of a micro-batch of rows whose segments are padded separately.

    Args:
        lengths: [n, S] long, per row the length of each of S segments (e.g. a left-padded
            prompt and a right-padded response: the forward's width is the longest prompt
            plus the longest response, not the longest sum).
    """
    return int(lengths.max(0).values.sum()) if len(lengths) else 0


def split_micro_batches(lengths: torch.Tensor, token_budget: int, packed: bool = False) -> list[torch.Tensor]:
    """Split rows into micro-batches of at most ``token_budget`` (rows x padded width) tokens, or (``packed``:
    the rows as one sequence without padding, :mod:`grpoplus.learner.packing`) real tokens.

    Rows are sorted longest first (ties by row index, so the plan is deterministic) and
    cut into consecutive runs: the fewest micro-batches that respect the budget and, among
    those, the fewest padding tokens (exact over cuts of the sorted order, by dynamic
    programming). Fewer forwards use the hardware better; sorted rows share a width, so
    little padding is computed. A row longer than the budget on its own gets a
    micro-batch alone (a row is never split).

    Args:
        lengths: [N] long real tokens per row, or [N, S] long per segment padded
            separately (see :func:`padded_width`).
        token_budget: largest ``rows x padded width`` of a micro-batch (> 0), or its real tokens when ``packed``.

    Returns:
        Row indices ([n_k] long, ascending) of each micro-batch; every row appears in
        exactly one, longest micro-batches first.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    lengths = torch.as_tensor(lengths)
    segments = lengths[:, None] if lengths.dim() == 1 else lengths  # [N, S]
    if segments.dim() != 2 or (len(segments) and segments.min() < 0):
        raise ValueError(f"lengths must be [N] or [N, S] non-negative counts, got shape {tuple(lengths.shape)}")
    # Longest first; a stable sort on the negated length keeps equal rows in index order.
    order = torch.sort(-segments.sum(1), stable=True).indices  # [N]
    rows = segments[order]
    cuts = _best_cuts((rows.sum(1, keepdim=True) if packed else rows).tolist(), token_budget, packed)
    return [order[a:b].sort().values for a, b in zip(cuts[:-1], cuts[1:])]


def _best_cuts(rows: list[list[int]], budget: int, packed: bool = False) -> list[int]:
    """Boundaries ``0 = c_0 < ... < c_k = n`` of consecutive runs of ``rows`` (segment lengths):
    fewest runs within ``budget``, then fewest padded tokens (``packed``: a run's tokens are the sum of its
    rows'). ``best[j]`` is the best (runs, tokens) for the first j rows; a run's tokens only grow as it gets
    longer, so the inner loop stops at the first run over the budget."""
    n = len(rows)
    best: list[tuple[int, int] | None] = [(0, 0)] + [None] * n
    start_of = [0] * (n + 1)
    for i in range(n):
        width, total = [0] * (len(rows[0]) if rows else 0), 0
        for j in range(i, n):
            width = [max(w, x) for w, x in zip(width, rows[j])]
            total += sum(rows[j])
            tokens = total if packed else (j - i + 1) * sum(width)
            if j > i and tokens > budget:
                break
            candidate = (best[i][0] + 1, best[i][1] + tokens)
            if best[j + 1] is None or candidate <= best[j + 1]:  # ties: the later start, so earlier runs are fuller
                best[j + 1], start_of[j + 1] = candidate, i
    cuts = [n]
    while cuts[-1] > 0:
        cuts.append(start_of[cuts[-1]])
    return cuts[::-1]
