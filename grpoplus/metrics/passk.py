"""pass@k from n sampled responses per problem: the unbiased estimator of Chen et al. 2021 ("Evaluating Large
Language Models Trained on Code", arXiv:2107.03374, section 2.1), per problem and its mean over problems."""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k responses drawn without replacement from n, c of them correct, is
    correct: ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021, section 2.1), computed as the product
    ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``, which stays exact in floats where the binomials overflow.

    Averaged over problems it is an unbiased estimate of pass@k for any n >= k; with n = k it is the any-of-k
    indicator, unbiased but of the largest variance.

    >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 4), pass_at_k(4, 0, 2)
    (0.25, 1.0, 0.0)
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n (k responses drawn from n sampled), got k={k}, n={n}: "
                         "sample at least k responses per problem")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n correct responses, got c={c} of n={n}")
    if n - c < k:  # every k-subset holds a correct response
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(n: int, correct: Sequence[int], k: int) -> float:
    """The mean of :func:`pass_at_k` over problems, each with n responses of which ``correct[p]`` are correct."""
    if not correct:
        raise ValueError("pass@k needs at least one problem, got none")
    return sum(pass_at_k(n, int(c), k) for c in correct) / len(correct)
