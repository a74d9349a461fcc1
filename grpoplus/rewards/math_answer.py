"""Verifiable math reward: extract the final answer, check equivalence with math-verify."""

from __future__ import annotations

from grpoplus.rewards.events import Unscored
from grpoplus.rewards.extract import extract_answer
from grpoplus.rewards.registry import REWARDS
from grpoplus.rewards.verifier import default_verifier


def _normalise(answer: str) -> str:
    return answer.strip().strip("$").replace(",", "").replace(" ", "").rstrip(".")


def math_reward(
    completion: str,
    answer: str,
    *,
    timeout_s: float = 5.0,
    fallback_last_number: bool = False,
) -> float:
    r"""1.0 when the completion's final answer equals the reference ``answer``, else 0.0.

    The final answer is the last ``<answer>`` block, ``\boxed{}`` (nested braces allowed)
    or GSM8K ``#### x``; with ``fallback_last_number`` the last number in the text. The
    check (math-verify: fractions, decimals, percentages, thousands separators, algebraic
    equality) runs in a killable worker process under ``timeout_s``; a hang, a crash or an
    error inside math-verify is counted (``verifier/timeouts``, ``verifier/crashes``,
    ``verifier/errors``) and returns :class:`~grpoplus.rewards.events.Unscored` (a NaN): the
    reward pipeline leaves that sample out of its group rather than score it 0.

    >>> math_reward(r"... so the total is \boxed{\frac{1}{2}}", "0.5")
    1.0
    >>> math_reward("48/2 = 24\n#### 1,024", "1024")
    1.0
    >>> math_reward(r"<answer>(x+1)^2</answer>", "x^2+2x+1")
    1.0
    >>> math_reward("the answer is 7", "7"), math_reward("the answer is 7", "7", fallback_last_number=True)
    (0.0, 1.0)
    """
    predicted = extract_answer(completion, fallback_last_number=fallback_last_number)
    if predicted is None:
        return 0.0
    if _normalise(predicted) == _normalise(answer):
        return 1.0  # fast path, and the only path for answers math-verify cannot parse
    equal = default_verifier().verify(answer, predicted, timeout_s)
    return equal if isinstance(equal, Unscored) else float(equal)


@REWARDS.register("math")
def math_batch(
    prompts: list[str],
    completions: list[str],
    *,
    answer: list[str],
    timeout_s: float = 5.0,
    fallback_last_number: bool = False,
    **fields,
) -> list[float]:
    """Registered form of :func:`math_reward`: needs the per-sample ``answer`` field."""
    return [
        math_reward(c, str(a), timeout_s=timeout_s, fallback_last_number=fallback_last_number)
        for c, a in zip(completions, answer, strict=True)
    ]
