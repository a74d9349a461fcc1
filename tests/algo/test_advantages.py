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


# -- token whitening (REINFORCE++ as its paper and verl) and GDPO ----------------------------------

def _token_whiten_loop(values, lengths, var_eps=1e-8):
    """Each response's value counted once per valid token: token mean, Bessel token variance."""
    toks = [v for v, n in zip(values, lengths) for _ in range(n)]
    mean = sum(toks) / len(toks)
    var = sum((x - mean) ** 2 for x in toks) / (len(toks) - 1)
    return [(v - mean) / math.sqrt(var + var_eps) for v in values]


def test_reinforce_pp_token_whitening_matches_loop():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    lengths = [7, 2, 3, 1, 5, 4]
    mask = (torch.arange(8)[None, :] < torch.tensor(lengths)[:, None]).double()
    adv = compute_advantages(r, g, "reinforce_pp", token_mask=mask)
    assert adv.shape == (6, 8)
    centred = [1 - 1 / 3, -1 / 3, -1 / 3, 1 - 2 / 3, 1 - 2 / 3, -2 / 3]  # R - mean_g R
    expected = _token_whiten_loop(centred, lengths)
    for i, n in enumerate(lengths):
        torch.testing.assert_close(adv[i, :n], torch.full((n,), expected[i], dtype=torch.float64))
        assert torch.all(adv[i, n:] == 0)
    # the defining property: zero mean and unit variance over TOKENS (long responses weigh more)
    tok = adv[mask.bool()]
    assert tok.mean().item() == pytest.approx(0, abs=1e-12)
    assert tok.var().item() == pytest.approx(1, rel=1e-6)


def test_token_whitening_weights_long_responses_more_than_response_whitening():
    # Worked example (docs/concepts/algorithms.md): groups {correct 9 tokens, wrong 1 token} and {correct 1, wrong 1}.
    # Centred A = +0.5 / -0.5 in both groups. Over responses the mean is 0: correct and wrong stay
    # symmetric (+-0.5 / std). Over tokens the 9 tokens of the long correct response pull the mean
    # to (9*0.5 - 0.5 + 0.5 - 0.5)/12 = 1/3: every correct response gets (0.5 - 1/3) = +1/6 and every
    # wrong one (-0.5 - 1/3) = -5/6 (before the common scale): wrong answers weigh 5x more.
    r = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    g = torch.tensor([0, 0, 1, 1])
    lengths = [9, 1, 1, 1]
    mask = (torch.arange(9)[None, :] < torch.tensor(lengths)[:, None]).double()
    per_resp = compute_advantages(r, g, "reinforce_pp")
    per_tok = compute_advantages(r, g, "reinforce_pp", token_mask=mask)[:, 0]
    torch.testing.assert_close(per_resp[0], -per_resp[1])
    expected = _token_whiten_loop([0.5, -0.5, 0.5, -0.5], lengths)
    torch.testing.assert_close(per_tok, torch.tensor(expected, dtype=torch.float64))
    assert (-per_tok[1] / per_tok[0]).item() == pytest.approx(5.0)


def test_token_mask_without_whitening_broadcasts_and_respects_keep():
    r, g = torch.tensor([1.0, 0.0, 3.0]), torch.tensor([0, 0, 0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    adv = compute_advantages(r, g, "dr_grpo", keep=torch.tensor([True, True, False]), token_mask=mask)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.0], [-0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="token_mask must have shape"):
        compute_advantages(r, g, token_mask=torch.ones(2, 3))


COMPONENTS = [[1.0, 0.0, 2.0], [0.0, 1.0, 2.0], [1.0, 1.0, 0.0], [0.0, 0.5, 1.0],
              [1.0, 0.5, 0.0], [1.0, 0.0, 0.0], [0.0, 0.5, 3.0], [1.0, 1.0, 3.0]]
COMP_GROUPS = [0, 0, 0, 0, 1, 1, 1, 1]


def _gdpo_loop(comps, groups, weights, eps):
    """Per component: (r - mean_g) / (std_g + eps); weighted sum; then (x - mean) / (std + eps) over responses."""
    n, k = len(comps), len(weights)
    total = [0.0] * n
    for j in range(k):
        for gid in set(groups):
            rows = [i for i in range(n) if groups[i] == gid]
            vals = [comps[i][j] for i in rows]
            for i in rows:
                total[i] += weights[j] * (comps[i][j] - _mean(vals)) / (_std(vals) + eps)
    m, s = _mean(total), _std(total)
    return [(x - m) / (s + eps) for x in total]


def test_gdpo_matches_loop():
    from grpoplus.algo import compute_advantages_multi

    comps = torch.tensor(COMPONENTS, dtype=torch.float64)
    w = [1.0, 0.5, 2.0]
    adv = compute_advantages_multi(comps, torch.tensor(COMP_GROUPS), w, "grpo", eps=1e-4)
    torch.testing.assert_close(adv, torch.tensor(_gdpo_loop(COMPONENTS, COMP_GROUPS, w, 1e-4), dtype=torch.float64))


def test_gdpo_puts_every_component_on_the_same_scale():
    # Multiplying one component by 100 changes the summed-reward advantages (that component takes
    # over), but not GDPO's: each component is normalised within its group before the sum.
    from grpoplus.algo import compute_advantages_multi

    comps = torch.tensor(COMPONENTS, dtype=torch.float64)
    scaled = comps.clone()
    scaled[:, 2] *= 100
    g = torch.tensor(COMP_GROUPS)
    gdpo = compute_advantages_multi(comps, g, eps=1e-9)
    torch.testing.assert_close(compute_advantages_multi(scaled, g, eps=1e-9), gdpo, rtol=1e-6, atol=1e-6)
    summed = compute_advantages(comps.sum(1), g, "grpo")
    summed_scaled = compute_advantages(scaled.sum(1), g, "grpo")
    assert (summed - summed_scaled).abs().max() > 0.1
    # rows 0 and 1 have equal totals (3.0): the summed reward cannot tell them apart; GDPO sees that
    # component 1 (0, 1, 1, 0.5 in the group) ranks row 0 lower than component 0 (1, 0, 1, 0) ranks row 1
    assert summed[0] == summed[1] and gdpo[0] != gdpo[1]


def test_gdpo_token_whitening_and_bad_weights():
    from grpoplus.algo import compute_advantages_multi, whiten_tokens

    comps = torch.tensor(COMPONENTS, dtype=torch.float64)
    g = torch.tensor(COMP_GROUPS)
    mask = (torch.arange(5)[None, :] < torch.tensor([5, 1, 2, 3, 4, 5, 1, 2])[:, None]).double()
    # the group stage of each component, summed, then whitened over the tokens
    summed = sum(compute_advantages(comps[:, j], g, "grpo") for j in range(3))
    torch.testing.assert_close(compute_advantages_multi(comps, g, token_mask=mask), whiten_tokens(summed, mask))
    with pytest.raises(ValueError, match="one entry per reward component"):
        compute_advantages_multi(comps, g, [1.0, 2.0])
    with pytest.raises(ValueError, match=r"components must have shape \[N=8, K\]"):
        compute_advantages_multi(comps[:, 0], g)
