"""Sampling-side helpers (section 6)."""

import pytest
import torch

from grpoplus.algo import (
    AlgoConfig,
    compute_advantages,
    dynamic_sampling_keep,
    gfpo_select,
    high_entropy_mask,
    overlong_filter_mask,
    soft_overlong_penalty,
    zero_variance_groups,
)


def test_dynamic_sampling_drops_exactly_the_all_equal_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.3, 0.3, 1.0])
    g = torch.tensor([4, 4, 2, 2, 9, 9, 7, 1, 1, 1])
    # group 4 all 1, group 9 all 0, group 7 size 1: dropped; groups 2 and 1 have spread: kept
    flat = zero_variance_groups(r, g)
    assert flat.tolist() == [True, True, False, False, True, True, True, False, False, False]
    assert dynamic_sampling_keep(r, g).tolist() == (~flat).tolist()
    # max_groups keeps the first groups with spread, in order of appearance (group 2 before group 1)
    assert dynamic_sampling_keep(r, g, max_groups=1).tolist() == [False, False, True, True] + [False] * 6


def test_overlong_filter_zeroes_unfinished_rows():
    mask = torch.ones(3, 4)
    out = overlong_filter_mask(mask, torch.tensor([True, False, True]))
    assert out.tolist() == [[1] * 4, [0] * 4, [1] * 4]
    assert overlong_filter_mask(mask.bool(), torch.tensor([False, True, True]))[0].sum() == 0
    with pytest.raises(ValueError, match="finished"):
        overlong_filter_mask(mask, torch.tensor([True]))


def test_soft_overlong_penalty_piecewise():
    # L_max = 20, L_cache = 4: zero up to 16, linear ramp to -1 at 20, -1 beyond
    lengths = torch.tensor([10, 16, 17, 18, 20, 21])
    out = soft_overlong_penalty(lengths, max_len=20, cache=4)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))


def test_gfpo_keeps_k_shortest_and_advantages_use_kept_rows():
    r = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    lengths = torch.tensor([50, 10, 30, 20, 5, 100, 7])
    g = torch.tensor([0, 0, 0, 0, 3, 3, 8])
    kept = gfpo_select(r, lengths, g, k=2, metric="length")
    assert kept.tolist() == [False, True, False, True, True, True, True]
    # reward per token: group 0 -> 1/50, 0, 1/30, 0: keeps rows 2 then 0
    kept_rpt = gfpo_select(r, lengths, g, k=2, metric="reward_per_token")
    assert kept_rpt.tolist() == [True, False, True, False, True, True, True]
    adv = compute_advantages(r, g, "dr_grpo", keep=kept)
    # group 0 keeps rewards (0, 0): advantage 0; group 3 keeps (1, 0): +-0.5
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5, -0.5, 0.0]))
    with pytest.raises(ValueError, match="metric"):
        gfpo_select(r, lengths, g, k=2, metric="speed")


def test_high_entropy_mask_keeps_top_fraction():
    entropy = torch.arange(10.0).reshape(2, 5)
    mask = torch.ones(2, 5)
    mask[1, 4] = 0  # entropy 9 is padding and must not count
    out = high_entropy_mask(entropy, mask, rho=0.2)  # 9 active tokens -> ceil(1.8) = 2 kept: entropies 8 and 7
    assert out.tolist() == [[0] * 5, [0, 0, 1, 1, 0]]
    assert torch.equal(high_entropy_mask(entropy, mask, 1.0), mask)


def test_soft_overlong_default_cache_is_quarter_of_max_len():
    # L_max = 16 -> L_cache = 4, the ramp starts after 12
    out = soft_overlong_penalty(torch.tensor([12, 13, 16, 17]), max_len=16, cache=None)
    torch.testing.assert_close(out, torch.tensor([0.0, -0.25, -1.0, -1.0]))
    assert AlgoConfig(max_len=16).cache_len == 4 and AlgoConfig(max_len=2).cache_len == 1


def test_prepare_loss_still_takes_the_filters_it_took_before_with_a_deprecation_warning():
    # a training loop written against the earlier signature keeps working: the same mask as filtering first
    from grpoplus.algo import prepare_loss

    cfg = AlgoConfig(overlong_filter=True, entropy_mask_rho=0.5)
    g = torch.Generator().manual_seed(0)
    mask, entropy = torch.ones(4, 6), torch.rand(4, 6, generator=g)
    finished = torch.tensor([True, False, True, True])
    logp_old, adv = -torch.rand(4, 6, generator=g), torch.randn(4, generator=g)
    with pytest.warns(DeprecationWarning, match="apply grpoplus.algo.overlong_filter_mask"):
        old_style, _ = prepare_loss(mask, logp_old, None, adv, cfg, finished=finished, entropy=entropy)
    filtered = high_entropy_mask(entropy, overlong_filter_mask(mask, finished), 0.5)
    new_style, _ = prepare_loss(filtered, logp_old, None, adv, cfg)
    assert torch.equal(old_style, new_style) and 0 < int(new_style.sum()) < 18
