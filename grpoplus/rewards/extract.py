"""Final-answer extraction from model completions and reference solutions.

Plain string scanning (no backtracking regular expressions), so that extraction itself
can never hang on a pathological completion; only the equivalence check needs the
killable worker of :mod:`grpoplus.rewards.verifier`.
"""

from __future__ import annotations

import re

_GSM8K_MARK = "####"
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"


def last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` (or ``\fbox{...}``), nested braces included.

    >>> last_boxed(r"so \boxed{1} then \boxed{\frac{a}{b}}.")
    '\\frac{a}{b}'
    >>> last_boxed("no box") is None
    True
    """
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    open_at = text.find("{", start)
    if open_at < 0:
        return None
    between = text[start:open_at].removeprefix("\\boxed").removeprefix("\\fbox")
    if between.strip():  # "\boxed 5" style: the token after the space
        token = between.strip().split()[0]
        return token or None
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None  # unbalanced: no answer


def gsm8k_answer(text: str) -> str | None:
    """Text after the last ``####`` marker, thousands separators removed.

    >>> gsm8k_answer("48 + 24 = 72\\n#### 1,072")
    '1072'
    """
    at = text.rfind(_GSM8K_MARK)
    if at < 0:
        return None
    answer = text[at + len(_GSM8K_MARK) :].strip().splitlines()
    if not answer:
        return None
    return answer[0].strip().replace(",", "") or None


def tagged_answer(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` block.

    >>> tagged_answer("<think>hm</think><answer> 7 </answer>")
    '7'
    """
    end = text.rfind(_ANSWER_CLOSE)
    if end < 0:
        return None
    start = text.rfind(_ANSWER_OPEN, 0, end)
    if start < 0:
        return None
    return text[start + len(_ANSWER_OPEN) : end].strip() or None


def last_number(text: str) -> str | None:
    """The last number in the text, thousands separators removed.

    >>> last_number("I think 3, no: 1,250.5 apples")
    '1250.5'
    """
    numbers = _NUMBER.findall(text[-2000:])
    return numbers[-1].replace(",", "") if numbers else None


def extract_answer(text: str, *, fallback_last_number: bool = False) -> str | None:
    r"""The final answer of a completion: ``<answer>`` tags, then ``\boxed{}``, then ``####``.

    The order is the order of specificity: an ``<answer>`` block may itself hold a box,
    whose content is then taken. ``fallback_last_number`` adds the last number in the
    text as a last resort (off by default: it rewards answers the model never marked).

    >>> extract_answer(r"<answer>\boxed{12}</answer>")
    '12'
    >>> extract_answer("so it is 12") is None, extract_answer("so it is 12", fallback_last_number=True)
    (True, '12')
    """
    tagged = tagged_answer(text)
    if tagged is not None:
        return last_boxed(tagged) or tagged
    for extractor in (last_boxed, gsm8k_answer):
        found = extractor(text)
        if found is not None:
            return found
    return last_number(text) if fallback_last_number else None


def reference_answer(solution: str, answer_format: str) -> str | None:
    """Reference answer of a solution text: ``raw`` | ``gsm8k`` (``####``) | ``math`` (last box) | ``auto``."""
    if answer_format == "raw":
        return solution.strip()
    if answer_format == "gsm8k":
        return gsm8k_answer(solution)
    if answer_format == "math":
        return last_boxed(solution)
    if answer_format == "auto":
        return gsm8k_answer(solution) or last_boxed(solution) or solution.strip()
    raise ValueError(f"unknown answer_format {answer_format!r}; choose one of: auto, gsm8k, math, raw")
