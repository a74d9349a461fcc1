"""Length-based reward components: DAPO soft overlong punishment and length penalties.

All take ``completion_length`` (tokens, per sample) from the batch fields.
"""

from __future__ import annotations

from collections import defaultdict

from grpoplus.rewards.registry import REWARDS


def soft_overlong_penalty(length: int, max_len: int, cache: int) -> float:
    """DAPO soft overlong punishment (Yu et al. 2025, eq. 13), ``L`` = response length.

    ``0`` if ``L <= max_len - cache``; ``((max_len - cache) - L) / cache`` inside the
    cache window; ``-1`` beyond ``max_len``.

    >>> [soft_overlong_penalty(n, max_len=100, cache=20) for n in (80, 90, 100, 101)]
    [0.0, -0.5, -1.0, -1.0]
    """
    if not 0 < cache <= max_len:
        raise ValueError(f"soft_overlong needs 0 < cache <= max_len, got cache={cache}, max_len={max_len}")
    threshold = max_len - cache
    if length <= threshold:
        return 0.0
    if length <= max_len:
        return (threshold - length) / cache
    return -1.0


def _lengths(fields: dict, name: str) -> list[int]:
    if "completion_length" not in fields:
        raise TypeError(f"reward {name!r} needs the per-sample field 'completion_length' (tokens)")
    return [int(n) for n in fields["completion_length"]]


@REWARDS.register("soft_overlong")
def soft_overlong(prompts: list[str], completions: list[str], *, max_len: int, cache: int, **fields) -> list[float]:
    """Registered DAPO soft overlong punishment; spec kwargs ``max_len`` and ``cache`` (tokens)."""
    return [soft_overlong_penalty(n, max_len, cache) for n in _lengths(fields, "soft_overlong")]


def _check_soft_overlong(max_len: int | None = None, cache: int | None = None, **_) -> None:
    """``soft_overlong``'s parameters, refused as the specs are parsed (the config rule ``rewards``): both given, in the
    penalty's own range (:func:`soft_overlong_penalty`)."""
    if max_len is None or cache is None:
        raise ValueError("reward 'soft_overlong' needs max_len= and cache= (tokens), e.g. "
                         "soft_overlong:max_len=512,cache=128 (algo.overlong_shaping adds it with both itself)")
    soft_overlong_penalty(0, max_len, cache)


soft_overlong.check_options = _check_soft_overlong


@REWARDS.register("length_penalty")
def length_penalty(prompts: list[str], completions: list[str], *, max_len: int, coef: float = 1.0, **fields) -> list[float]:
    """Linear penalty ``-coef * min(L, max_len) / max_len``: shorter answers score higher.

    >>> length_penalty(["q", "q"], ["a", "b"], max_len=100, coef=0.5, completion_length=[50, 400])
    [-0.25, -0.5]
    """
    return [-coef * min(n, max_len) / max_len for n in _lengths(fields, "length_penalty")]


@REWARDS.register("kimi_length")
def kimi_length(prompts: list[str], completions: list[str], *, correct: list[bool], **fields) -> list[float]:
    """Group-relative length reward of Kimi k1.5 (Kimi Team 2025, sec. 2.3.3).

    Within the responses to one prompt (equal prompt strings), ``lam = 0.5 - (L -
    min_L) / (max_L - min_L)``; reward ``lam`` for a correct response and ``min(0, lam)``
    for a wrong one; 0 when all lengths are equal. Needs the ``correct`` field.

    >>> kimi_length(["q"] * 3, ["a", "b", "c"], correct=[True, True, False], completion_length=[10, 20, 30])
    [0.5, 0.0, -0.5]
    """
    lengths = _lengths(fields, "kimi_length")
    groups: dict[str, list[int]] = defaultdict(list)
    for i, prompt in enumerate(prompts):
        groups[prompt].append(i)
    out = [0.0] * len(prompts)
    for members in groups.values():
        lo, hi = min(lengths[i] for i in members), max(lengths[i] for i in members)
        if hi == lo:
            continue
        for i in members:
            lam = 0.5 - (lengths[i] - lo) / (hi - lo)
            out[i] = lam if correct[i] else min(0.0, lam)
    return out
