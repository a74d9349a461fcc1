"""pass@k's unbiased estimator (Chen et al. 2021, section 2.1): the closed form, its expectation, its refusals."""

import itertools
import math

import pytest

from grpoplus.metrics.passk import mean_pass_at_k, pass_at_k

GRID = [(n, c, k) for n in range(1, 13) for c in range(n + 1) for k in range(1, n + 1)]


@pytest.mark.parametrize("n, c, k", GRID)
def test_the_product_form_equals_the_binomial_closed_form(n, c, k):
    # 1 - C(n-c, k) / C(n, k); math.comb(n-c, k) is 0 when n-c < k (every k-subset holds a correct response)
    closed = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12)


def test_edge_cases_worked_by_hand():
    assert pass_at_k(5, 0, 3) == 0.0  # nothing correct: no subset passes
    assert pass_at_k(5, 5, 1) == 1.0  # everything correct
    assert pass_at_k(5, 3, 3) == 1.0  # n-c = 2 < k = 3: any 3 of 5 hold a correct one
    assert pass_at_k(4, 1, 1) == 0.25  # pass@1 is c/n
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(3, 1, 3) == 1.0  # n = k: the any-of-k indicator
    assert pass_at_k(3, 0, 3) == 0.0
    # large n: the binomials are ~1e299 and their ratio would lose its digits; the product does not
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001)
    assert pass_at_k(1000, 10, 100) == pytest.approx(1 - math.comb(990, 100) / math.comb(1000, 100), rel=1e-9)


@pytest.mark.parametrize("n, c, k", [(n, c, k) for n in range(1, 8) for c in range(n + 1) for k in range(1, n + 1)])
def test_it_is_the_any_of_k_frequency_over_every_k_subset(n, c, k):
    # the estimator's expectation over which k of the n responses are drawn: enumerate every k-subset
    responses = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(responses, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets), abs=1e-12)


def test_it_is_unbiased_for_the_true_pass_at_k_of_a_problem():
    # a problem solved with probability p: true pass@k = 1 - (1-p)^k; the estimator's mean over c ~ Binomial(n, p)
    n, k, p = 6, 3, 0.3
    mean = sum(math.comb(n, c) * p**c * (1 - p) ** (n - c) * pass_at_k(n, c, k) for c in range(n + 1))
    assert mean == pytest.approx(1 - (1 - p) ** k, abs=1e-12)


def test_the_mean_over_problems():
    assert mean_pass_at_k(4, [0, 1, 4], 2) == pytest.approx((0.0 + 0.5 + 1.0) / 3)
    assert mean_pass_at_k(4, [0, 1, 4], 1) == pytest.approx((0 + 1 + 4) / 12)  # pass@1: the mean accuracy


@pytest.mark.parametrize("n, c, k, message", [
    (4, 1, 5, r"^pass@k needs 1 <= k <= n .* got k=5, n=4: sample at least k responses per problem$"),
    (4, 1, 0, "got k=0, n=4"),
    (4, 5, 2, r"^pass@k needs 0 <= c <= n correct responses, got c=5 of n=4$"),
    (4, -1, 2, "got c=-1"),
])
def test_impossible_counts_are_refused(n, c, k, message):
    with pytest.raises(ValueError, match=message):
        pass_at_k(n, c, k)


def test_no_problems_is_refused():
    with pytest.raises(ValueError, match="^pass@k needs at least one problem, got none$"):
        mean_pass_at_k(4, [], 1)
