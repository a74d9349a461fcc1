"""Advantage estimators checked against per-group loops written out here (float64)."""

import math

import pytest
import torch

from grpoplus.algo import ADVANTAGES, compute_advantages, group_stats, process_advantages

REWARDS = [1.0, 0.0, 0.5, 2.0, 3.0, 1.0, 7.0, 4.0, 4.0]
GROUPS = [5, 9, 5, 9, 5, 9, -2, 11, 11]  # non-contiguous ids, unequal sizes, a size-1 group, an all-equal group


def _groups():
    out = {}
    for i, g in enumerate(GROUPS):
        out.setdefault(g, []).append(i)
    return out


def _mean(xs):
    return sum(xs) / len(xs)


def _std(xs):  # Bessel
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _expected(name, eps=1e-6):
    r = REWARDS
    out = [0.0] * len(r)
    centred = [0.0] * len(r)
    for rows in _groups().values():
        vals = [r[i] for i in rows]
        for i in rows:
            centred[i] = r[i] - _mean(vals)
            if name == "grpo":
                out[i] = centred[i] / (_std(vals) + eps)
            elif name == "dr_grpo":
                out[i] = centred[i]
            elif name == "rloo":
                others = [r[j] for j in rows if j != i]
                out[i] = r[i] - _mean(others) if others else 0.0
            elif name == "batch_std":
                out[i] = centred[i] / (_std(r) + eps)
    if name == "reinforce_pp":
        m, s = _mean(centred), _std(centred)
        out = [(c - m) / (s + eps) for c in centred]
    return out


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "batch_std", "reinforce_pp"])
def test_estimator_matches_loop(name):
    adv = compute_advantages(torch.tensor(REWARDS, dtype=torch.float64), torch.tensor(GROUPS), estimator=name)
    assert adv.dtype == torch.float64
    torch.testing.assert_close(adv, torch.tensor(_expected(name), dtype=torch.float64))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "batch_std", "reinforce_pp"])
def test_size1_and_equal_groups_get_zero(name):
    adv = compute_advantages(torch.tensor(REWARDS), torch.tensor(GROUPS), estimator=name)
    assert adv[6] == 0  # group -2 has one response
    if name != "reinforce_pp":  # whitening shifts by the batch mean, which is 0 here anyway
        assert adv[7] == 0 and adv[8] == 0  # group 11 is all-equal
    assert torch.isfinite(adv).all()


def test_keep_excludes_rows_from_statistics():
    r = torch.tensor([1.0, 0.0, 0.0, 100.0])
    g = torch.tensor([0, 0, 0, 0])
    keep = torch.tensor([True, True, True, False])
    adv = compute_advantages(r, g, "dr_grpo", keep=keep)
    # mean of kept rows = 1/3; the dropped row gets 0
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.0]))


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'; choose one of: .*grpo"):
        compute_advantages(torch.ones(2), torch.zeros(2, dtype=torch.long), "nope")
    with pytest.raises(ValueError, match="integer"):
        compute_advantages(torch.ones(2), torch.zeros(2), "grpo")
    with pytest.raises(ValueError, match="shape"):
        compute_advantages(torch.ones(2), torch.zeros(3, dtype=torch.long))


def test_group_stats_counts_degenerate_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    g = torch.tensor([0, 0, 1, 1, 2, 2, 3])
    stats = group_stats(r, g)
    assert stats == {"groups": 4, "size1_groups": 1, "zero_spread_groups": 3,
                     "all_correct_groups": 2, "all_wrong_groups": 1}


def test_process_advantages_sum_of_future_step_rewards():
    # Two responses in one group, T = 6. Steps: resp0 ends at 1 and 4, resp1 ends at 2.
    step_rewards = [[1.0, 0.0], [0.5]]
    ends = [[1, 4], [2]]
    adv = process_advantages(step_rewards, ends, torch.tensor([3, 3]), T=6, eps=1e-6)
    allr = [1.0, 0.0, 0.5]
    m, s = _mean(allr), _std(allr)
    n = [(x - m) / (s + 1e-6) for x in allr]
    exp0 = [n[0] + n[1], n[0] + n[1], n[1], n[1], n[1], 0.0]
    exp1 = [n[2], n[2], n[2], 0.0, 0.0, 0.0]
    torch.testing.assert_close(adv, torch.tensor([exp0, exp1]))


def test_process_advantages_rejects_out_of_range_index():
    with pytest.raises(ValueError, match=r"step end indices must lie in \[0, 3\]"):
        process_advantages([[1.0]], [[4]], torch.tensor([0]), T=4)


def test_user_estimator_via_registry():
    @ADVANTAGES.register("test_sign_only")
    def sign_only(rewards, group_index, num_groups, eps):
        return torch.sign(rewards - 0.5)

    adv = compute_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), "test_sign_only")
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0]))
