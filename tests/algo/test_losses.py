"""Per-token losses: value and gradient against hand-written per-element formulas (float64).

Each test builds a small batch, runs ``policy_loss`` and compares with the formula of
ALGORITHMS.md section 2 written out element by element here.
"""

import math

import pytest
import torch

from grpoplus.algo import AlgoConfig, policy_loss

D = torch.float64


def _run(cfg, logp0, logp_old, adv, mask):
    logp = logp0.clone().requires_grad_()
    loss, metrics = policy_loss(logp, logp_old, adv, mask, cfg)
    loss.backward()
    return loss.detach(), logp.grad, metrics


def _batch(seed=0, n=3, t=4):
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(n, t, generator=g, dtype=D) * 2
    logp = logp_old + 0.4 * torch.randn(n, t, generator=g, dtype=D)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=D)[:n]
    mask = torch.ones(n, t, dtype=D)
    mask[1, 3] = 0
    return logp, logp_old, adv, mask


def test_clip_value_and_gradient_match_loop():
    logp, logp_old, adv, mask = _batch()
    eps_lo, eps_hi = 0.2, 0.28
    cfg = AlgoConfig(loss="clip", eps_low=eps_lo, eps_high=eps_hi, aggregation="token_mean")
    loss, grad, metrics = _run(cfg, logp, logp_old, adv, mask)
    n_tok = mask.sum().item()
    exp_loss, exp_grad = 0.0, torch.zeros_like(logp)
    low = high = 0
    for i in range(3):
        for t in range(4):
            if not mask[i, t]:
                continue
            a, r = adv[i].item(), math.exp(logp[i, t] - logp_old[i, t])
            unclipped, clipped = -r * a, -min(max(r, 1 - eps_lo), 1 + eps_hi) * a
            exp_loss += max(unclipped, clipped) / n_tok
            # d(-r a)/dlogp = -r a while the unclipped branch is the max; the clipped branch is flat.
            if 1 - eps_lo <= r <= 1 + eps_hi or unclipped > clipped:
                exp_grad[i, t] = -r * a / n_tok
            low += a < 0 and r < 1 - eps_lo
            high += a > 0 and r > 1 + eps_hi
    torch.testing.assert_close(loss, torch.tensor(exp_loss, dtype=D))
    torch.testing.assert_close(grad, exp_grad)
    assert metrics["loss/clip_frac_low"] == pytest.approx(low / n_tok)
    assert metrics["loss/clip_frac_high"] == pytest.approx(high / n_tok)


def _one_token(r, a):
    logp_old = torch.full((1, 1), -1.0, dtype=D)
    return logp_old + math.log(r), logp_old, torch.tensor([a], dtype=D), torch.ones(1, 1, dtype=D)


def test_clip_higher_lets_low_probability_positive_token_grow():
    # r = 1.25 is past 1 + eps_low = 1.2: symmetric clip stops it, clip-higher (1.28) does not.
    logp, logp_old, adv, mask = _one_token(1.25, 1.0)
    _, g_sym, m_sym = _run(AlgoConfig(eps_low=0.2, eps_high=0.2), logp, logp_old, adv, mask)
    _, g_high, _ = _run(AlgoConfig(eps_low=0.2, eps_high=0.28), logp, logp_old, adv, mask)
    assert g_sym.item() == 0 and m_sym["loss/clip_frac_high"] == 1.0
    assert g_high.item() == pytest.approx(-1.25)  # descent raises logp


def test_dual_clip_caps_negative_advantage_loss():
    # A = -1, r = 5: plain clip loss = -r A = 5 with gradient -r A = 5; dual clip c = 3 caps it at -c A = 3, flat.
    logp, logp_old, adv, mask = _one_token(5.0, -1.0)
    l_plain, g_plain, _ = _run(AlgoConfig(), logp, logp_old, adv, mask)
    l_dual, g_dual, _ = _run(AlgoConfig(dual_clip_c=3.0), logp, logp_old, adv, mask)
    assert l_plain.item() == pytest.approx(5.0) and g_plain.item() == pytest.approx(5.0)
    assert l_dual.item() == pytest.approx(3.0) and g_dual.item() == 0
    # A > 0 is untouched by the dual clip
    logp, logp_old, adv, mask = _one_token(0.5, 1.0)
    assert _run(AlgoConfig(dual_clip_c=3.0), logp, logp_old, adv, mask)[0].item() == pytest.approx(-0.5)


@pytest.mark.parametrize("r,a", [(1.5, 1.0), (0.5, -1.0)])
def test_cispo_and_tis_pg_keep_gradient_that_clip_zeroes(r, a):
    logp, logp_old, adv, mask = _one_token(r, a)
    _, g_clip, _ = _run(AlgoConfig(loss="clip"), logp, logp_old, adv, mask)
    l_cispo, g_cispo, _ = _run(AlgoConfig(loss="cispo", eps_low=0.2, eps_high=0.2), logp, logp_old, adv, mask)
    l_tis, g_tis, _ = _run(AlgoConfig(loss="tis_pg", pg_cap=1.3), logp, logp_old, adv, mask)
    assert g_clip.item() == 0
    w_cispo = min(max(r, 0.8), 1.2)  # sg[clip(r)]
    assert g_cispo.item() == pytest.approx(-w_cispo * a) and l_cispo.item() == pytest.approx(-w_cispo * a * logp.item())
    w_tis = min(r, 1.3)  # sg[min(r, C)]
    assert g_tis.item() == pytest.approx(-w_tis * a) and l_tis.item() == pytest.approx(-w_tis * a * logp.item())


def test_gspo_value_gradient_and_whole_sequence_clipping():
    # Row 0: token log-ratios 0.3, -0.1, 0.0 -> s_0 = exp(0.2/3) ~ 1.069 > 1+4e-4, A > 0: the WHOLE row is clipped,
    # including the token whose own ratio is exactly 1. Row 1: ratios exactly 1 (on-policy), A < 0: unclipped.
    logp_old = torch.full((2, 3), -1.0, dtype=D)
    logp = logp_old + torch.tensor([[0.3, -0.1, 0.0], [0.0, 0.0, 0.0]], dtype=D)
    adv = torch.tensor([1.0, -2.0], dtype=D)
    mask = torch.ones(2, 3, dtype=D)
    cfg = AlgoConfig.preset("gspo")
    loss, grad, metrics = _run(cfg, logp, logp_old, adv, mask)
    s0 = math.exp(0.2 / 3)
    # seq_mean_token_mean over N' = 2: row 0 loss per token = -clip(s0) A = -(1+4e-4); row 1 = -1 * (-2) = 2
    assert loss.item() == pytest.approx((-(1 + 4e-4) * 1.0 + 2.0) / 2)
    assert torch.all(grad[0] == 0)
    # d/dlogp_{1,t} of (1/2)(1/3) sum_t -sg[s_1] exp(logp - sg logp) A = -(1/6) s_1 A, with s_1 = 1
    torch.testing.assert_close(grad[1], torch.full((3,), 2.0 / 6, dtype=D))
    assert metrics["loss/clip_frac_high"] == pytest.approx(0.5)
    assert s0 > 1 + 4e-4


def test_gspo_token_uses_per_token_advantage():
    logp_old = torch.full((1, 2), -1.0, dtype=D)
    logp = logp_old.clone()
    adv = torch.tensor([[1.0, -3.0]], dtype=D)
    cfg = AlgoConfig(loss="gspo_token", eps_low=3e-4, eps_high=4e-4, aggregation="token_mean")
    loss, grad, _ = _run(cfg, logp, logp_old, adv, torch.ones(1, 2, dtype=D))
    assert loss.item() == pytest.approx((-1.0 + 3.0) / 2)
    torch.testing.assert_close(grad, torch.tensor([[-0.5, 1.5]], dtype=D))
    # plain gspo reduces the advantage to the row mean (-1): both tokens get the same gradient
    _, grad_seq, _ = _run(cfg.replace(loss="gspo"), logp, logp_old, adv, torch.ones(1, 2, dtype=D))
    torch.testing.assert_close(grad_seq, torch.tensor([[0.5, 0.5]], dtype=D))


def test_gmpo_sign_dependent_log_space_clip():
    d = torch.tensor([[0.6, -0.6, 0.1], [0.6, -0.6, 0.1]], dtype=D)
    logp_old = torch.full((2, 3), -2.0, dtype=D)
    logp = logp_old + d
    adv = torch.tensor([1.0, -1.0], dtype=D)
    mask = torch.ones(2, 3, dtype=D)
    loss, grad, metrics = _run(AlgoConfig.preset("gmpo"), logp, logp_old, adv, mask)
    # A > 0: only d > eps is clipped (0.6 -> 0.4); A < 0: only d < -eps is clipped (-0.6 -> -0.4).
    dt0 = [0.4, -0.6, 0.1]
    dt1 = [0.6, -0.4, 0.1]
    rho0, rho1 = math.exp(sum(dt0) / 3), math.exp(sum(dt1) / 3)
    assert loss.item() == pytest.approx((-1.0 * rho0 + 1.0 * rho1) / 2)
    # gradient of (1/N') * -A_i rho_i wrt an unclipped token: -A_i rho_i / (3 N'); clipped tokens: 0
    exp = torch.tensor([[0.0, -rho0 / 6, -rho0 / 6], [rho1 / 6, 0.0, rho1 / 6]], dtype=D)
    torch.testing.assert_close(grad, exp)
    assert metrics["loss/clip_frac_high"] == pytest.approx(1 / 6)
    assert metrics["loss/clip_frac_low"] == pytest.approx(1 / 6)


def test_one_iteration_one_minibatch_clip_is_policy_gradient():
    # logp_old == logp (first pass): r = 1 exactly, so clip's gradient is REINFORCE's -A grad(logp).
    logp, _, adv, mask = _batch(seed=3)
    logp_old = logp.clone()
    for agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "seq_mean_token_sum"):
        _, g_clip, m = _run(AlgoConfig(aggregation=agg), logp, logp_old, adv, mask)
        _, g_pg, _ = _run(AlgoConfig(loss="reinforce", aggregation=agg), logp, logp_old, adv, mask)
        torch.testing.assert_close(g_clip, g_pg)
        assert m["loss/ratio_mean"] == 1.0 and m["loss/clip_frac_low"] == m["loss/clip_frac_high"] == 0
    _, g_tok, _ = _run(AlgoConfig(), logp, logp_old, adv, mask)
    torch.testing.assert_close(g_tok, -adv[:, None] * mask / mask.sum())


def test_reinforce_value():
    logp, logp_old, adv, mask = _batch(seed=4)
    loss, _, _ = _run(AlgoConfig(loss="reinforce"), logp, logp_old, adv, mask)
    expected = sum(-adv[i].item() * logp[i, t].item() for i in range(3) for t in range(4) if mask[i, t]) / mask.sum().item()
    assert loss.item() == pytest.approx(expected)
