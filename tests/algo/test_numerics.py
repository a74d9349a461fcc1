"""No NaN/inf at extreme log-ratios, empty responses, size-1 groups, all-masked batches, low precision."""

import itertools

import pytest
import torch

from grpoplus.algo import AlgoConfig, compute_advantages, compute_advantages_multi, policy_loss

LOSSES = ["clip", "gspo", "gspo_token", "gmpo", "cispo", "tis_pg", "reinforce", "tis_pg_seq", "sapo", "dppo_tv",
          "dppo_kl", "clip_cov", "kl_cov"]
AGGS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "seq_mean_token_sum"]
KLS = ["k1", "k2", "k3", "k3_is"]
ALL_CORRECTIONS = ("mis_token", "tis_token", "tis_seq", "geo_mask", "mis_seq", "deepseek_v32_mask", "rs_token_k3",
                   "rs_seq_mean_k2", "rs_seq_max_k3")


def _extreme(dtype):
    # log-ratios of +-50 against logp_old, logp_roll and logp_ref; an empty response (row 3).
    n, t = 4, 6
    base = torch.full((n, t), -3.0)
    sign = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    logp = (base + 0 * sign).to(dtype)
    logp_old = (base - 50 * sign).to(dtype)
    logp_roll = (base + 50 * sign).to(dtype)
    logp_ref = (base - 50 * sign.flip(0)).to(dtype)
    mask = torch.ones(n, t)
    mask[3] = 0
    mask[2, 3:] = 0
    logp[3] = float("nan")  # garbage in padding must not leak
    adv = torch.tensor([1.0, -1.0, 2.0, 0.0], dtype=dtype)
    return logp, logp_old, logp_roll, logp_ref, adv, mask


@pytest.mark.parametrize("loss_name,agg", list(itertools.product(LOSSES, AGGS)))
def test_extreme_log_ratios_stay_finite(loss_name, agg):
    logp, logp_old, logp_roll, logp_ref, adv, mask = _extreme(torch.float32)
    for kl in KLS:
        cfg = AlgoConfig(loss=loss_name, aggregation=agg, beta=0.1, kl_estimator=kl, eps_low=0.2,
                         corrections=("tis_token", "tis_seq"), correction_cap_low=0.5, entropy_coef=0.01)
        x = logp.clone().requires_grad_()
        loss, metrics = policy_loss(x, logp_old, adv, mask, cfg, logp_roll=logp_roll, logp_ref=logp_ref,
                                    entropy=torch.full_like(logp, 2.0))
        loss.backward()
        assert torch.isfinite(loss), (loss_name, agg, kl)
        assert torch.isfinite(x.grad).all(), (loss_name, agg, kl)
        assert all(v == v and abs(v) != float("inf") for v in metrics.values()), metrics


def test_masking_corrections_at_extremes_are_finite():
    logp, logp_old, logp_roll, logp_ref, adv, mask = _extreme(torch.float32)
    cfg = AlgoConfig(corrections=ALL_CORRECTIONS)
    x = logp.clone().requires_grad_()
    loss, metrics = policy_loss(x, logp_old, adv, mask, cfg, logp_roll=logp_roll)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    assert metrics["loss/masked_all"] == 1.0  # every token is +-50 off: all masked


@pytest.mark.parametrize("loss_name", LOSSES)
@pytest.mark.parametrize("agg", AGGS)
def test_all_masked_batch_gives_zero_loss_and_says_so(loss_name, agg):
    logp = torch.randn(2, 3, requires_grad=True)
    cfg = AlgoConfig(loss=loss_name, aggregation=agg, beta=0.1, eps_low=0.2)
    loss, m = policy_loss(logp, logp.detach(), torch.ones(2), torch.zeros(2, 3), cfg,
                          logp_roll=logp.detach(), logp_ref=logp.detach() - 1)
    loss.backward()
    assert loss.item() == 0 and torch.all(logp.grad == 0)
    assert m["loss/masked_all"] == 1.0 and m["loss/active_tokens"] == 0
    assert all(v == v for v in m.values())


def test_size1_groups_and_integer_rewards():
    adv = compute_advantages(torch.tensor([1, 0, 1]), torch.tensor([0, 1, 2]), "grpo")
    assert adv.dtype == torch.float32 and torch.all(adv == 0)
    for name in ("dr_grpo", "rloo", "batch_std", "reinforce_pp"):
        assert torch.isfinite(compute_advantages(torch.tensor([3.0]), torch.tensor([0]), name)).all()
        one_token = compute_advantages(torch.tensor([3.0]), torch.tensor([0]), name, token_mask=torch.ones(1, 1))
        assert torch.isfinite(one_token).all()
    assert torch.isfinite(compute_advantages_multi(torch.tensor([[1.0, 0.0]]), torch.tensor([0]))).all()


@pytest.mark.parametrize("loss_name", LOSSES)
def test_bfloat16_matches_float32(loss_name):
    g = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(4, 8, generator=g) * 2
    logp = logp_old + 0.1 * torch.randn(4, 8, generator=g)
    roll = logp_old + 0.1 * torch.randn(4, 8, generator=g)
    adv, mask = torch.tensor([1.0, -1.0, 0.5, -0.5]), torch.ones(4, 8)
    cfg = AlgoConfig(loss=loss_name, eps_low=0.2, corrections=("tis_token",), beta=0.05)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        x = logp.to(dtype).detach().clone().requires_grad_()
        loss, _ = policy_loss(x, logp_old.to(dtype), adv.to(dtype), mask, cfg, logp_roll=roll.to(dtype),
                              logp_ref=logp_old.to(dtype))
        loss.backward()
        assert loss.dtype == torch.float32 and x.grad.dtype == dtype
        out[dtype] = (loss.item(), x.grad.float())
    assert out[torch.bfloat16][0] == pytest.approx(out[torch.float32][0], abs=0.05)
    torch.testing.assert_close(out[torch.bfloat16][1], out[torch.float32][1], atol=0.02, rtol=0.1)


def test_shape_errors_are_clear():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"advantages must have shape \[N\]=2 or \[N, T\]=\(2, 3\)"):
        policy_loss(x, x, torch.ones(3), torch.ones(2, 3), AlgoConfig())
    with pytest.raises(ValueError, match="logp_old must have the shape of mask"):
        policy_loss(x, torch.zeros(2, 4), torch.ones(2), torch.ones(2, 3), AlgoConfig())
