"""Clip-Cov and KL-Cov (Cui et al. 2025): the token selection against loops over the covariance,
the losses against per-element formulas, and determinism of Clip-Cov's random subset."""

import math

import pytest
import torch

from grpoplus.algo import AlgoConfig, policy_loss, prepare_loss, token_covariance

D = torch.float64


def _batch(seed=0, n=6, t=8):
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(n, t, generator=g, dtype=D) * 3
    logp = logp_old + 0.3 * torch.randn(n, t, generator=g, dtype=D)
    adv = 2 * torch.randn(n, generator=g, dtype=D)
    lengths = torch.tensor([8, 5, 0, 3, 8, 6])[:n]
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(D)
    return logp, logp_old, adv, mask


def _cov_loop(adv, logp, mask):
    """Centred product per token: (A - mean A)(logp - mean logp), means over the unmasked tokens."""
    toks = [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]
    mean_a = sum(adv[i].item() for i, _ in toks) / len(toks)
    mean_l = sum(logp[i, t].item() for i, t in toks) / len(toks)
    return {(i, t): (adv[i].item() - mean_a) * (logp[i, t].item() - mean_l) for i, t in toks}


def test_token_covariance_matches_loop():
    logp, _, adv, mask = _batch()
    cov = token_covariance(adv[:, None].expand_as(logp), logp, mask.bool())
    for (i, t), c in _cov_loop(adv, logp, mask).items():
        assert cov[i, t].item() == pytest.approx(c, rel=1e-12)


def test_kl_cov_penalises_the_top_covariance_tokens():
    logp, logp_old, adv, mask = _batch(seed=1)
    ratio, coef = 0.1, 0.7
    x = logp.clone().requires_grad_()
    loss, m = policy_loss(x, logp_old, adv, mask, AlgoConfig(loss="kl_cov", cov_ratio=ratio, kl_cov_coef=coef))
    loss.backward()
    cov = _cov_loop(adv, logp, mask)
    k = max(1, int(len(cov) * ratio))  # 36 tokens -> 3
    top = set(sorted(cov, key=cov.get, reverse=True)[:k])
    exp_loss, exp_grad = 0.0, torch.zeros_like(logp)
    for (i, t) in cov:
        a, d = adv[i].item(), logp[i, t].item() - logp_old[i, t].item()
        # L = -r A (+ coef |d| on the selected tokens); dL/dlogp = -r A (+ coef sign(d))
        exp_loss += (-math.exp(d) * a + ((i, t) in top) * coef * abs(d)) / len(cov)
        exp_grad[i, t] = (-math.exp(d) * a + ((i, t) in top) * coef * math.copysign(1.0, d)) / len(cov)
    assert loss.item() == pytest.approx(exp_loss, rel=1e-12)
    torch.testing.assert_close(x.grad, exp_grad, rtol=1e-12, atol=1e-15)
    assert m["loss/cov_selected_frac"] == pytest.approx(k / len(cov))
    assert m["loss/clip_frac_low"] == m["loss/clip_frac_high"] == 0  # KL-Cov does not clip


def _clip_cov_candidates(logp, logp_old, adv, mask, eps, lb, ub):
    """Tokens with lb < cov < ub whose PPO clip does not bind, in row-major order."""
    cov = _cov_loop(adv, logp, mask)
    out = []
    for (i, t), c in sorted(cov.items()):
        a, r = adv[i].item(), math.exp(logp[i, t].item() - logp_old[i, t].item())
        clipped = -a * min(max(r, 1 - eps), 1 + eps) > -a * r
        if lb < c < ub and not clipped:
            out.append((i, t))
    return out


def test_clip_cov_detaches_a_random_subset_of_the_candidates():
    logp, logp_old, adv, mask = _batch(seed=2)
    cfg = AlgoConfig(loss="clip_cov", eps_low=0.2, eps_high=0.2, cov_ratio=0.1, cov_lb=-0.5, cov_ub=5.0,
                     aggregation="token_mean")
    cands = _clip_cov_candidates(logp, logp_old, adv, mask, 0.2, -0.5, 5.0)
    n_tok = int(mask.sum())
    k = min(max(int(0.1 * n_tok), 1), len(cands))
    assert 0 < k < len(cands)  # a real subset
    # the subset: the first k of randperm(#candidates) with the given generator
    perm = torch.randperm(len(cands), generator=torch.Generator().manual_seed(7))[:k].tolist()
    chosen = {cands[j] for j in perm}
    x = logp.clone().requires_grad_()
    loss, m = policy_loss(x, logp_old, adv, mask, cfg, generator=torch.Generator().manual_seed(7))
    loss.backward()
    exp_loss, exp_grad = 0.0, torch.zeros_like(logp)
    for (i, t) in _cov_loop(adv, logp, mask):
        if (i, t) in chosen:
            continue  # loss and gradient 0, still counted in n_tok
        a, r = adv[i].item(), math.exp(logp[i, t].item() - logp_old[i, t].item())
        unclipped, clipped = -r * a, -min(max(r, 0.8), 1.2) * a
        exp_loss += max(unclipped, clipped) / n_tok
        exp_grad[i, t] = -r * a / n_tok if unclipped >= clipped else 0.0
    assert loss.item() == pytest.approx(exp_loss, rel=1e-12)
    torch.testing.assert_close(x.grad, exp_grad, rtol=1e-12, atol=1e-15)
    assert m["loss/cov_selected_frac"] == pytest.approx(k / n_tok)


def test_clip_cov_subset_is_deterministic_given_the_generator_seed():
    logp, logp_old, adv, mask = _batch(seed=2)
    cfg = AlgoConfig(loss="clip_cov", cov_ratio=0.1, cov_lb=-0.5, cov_ub=5.0)

    def selected(seed):
        return prepare_loss(mask, logp_old, None, adv, cfg, generator=torch.Generator().manual_seed(seed))[1].selected

    assert torch.equal(selected(3), selected(3))
    assert not torch.equal(selected(3), selected(4))
    assert torch.equal(selected(0), prepare_loss(mask, logp_old, None, adv, cfg)[1].selected)  # None = seed 0


def test_clip_cov_acts_on_policy_and_kl_cov_does_not():
    # r = 1 everywhere: Clip-Cov still zeroes the selected tokens' gradient (selection is by covariance);
    # KL-Cov's |log r| has zero gradient at r = 1, so it is the plain policy gradient -A.
    _, logp_old, adv, mask = _batch(seed=3)
    cfgs = {"clip_cov": AlgoConfig(loss="clip_cov", cov_ratio=0.1, cov_lb=-1e9, cov_ub=1e9, aggregation="token_mean"),
            "kl_cov": AlgoConfig(loss="kl_cov", cov_ratio=0.1, aggregation="token_mean")}
    grads = {}
    for name, cfg in cfgs.items():
        x = logp_old.clone().requires_grad_()
        policy_loss(x, logp_old, adv, mask, cfg)[0].backward()
        grads[name] = x.grad
    reinforce = -adv[:, None] * mask / mask.sum()
    torch.testing.assert_close(grads["kl_cov"], reinforce)
    zeroed = (grads["clip_cov"] == 0) & (reinforce != 0)
    assert int(zeroed.sum()) == max(1, int(0.1 * mask.sum()))
    assert cfgs["kl_cov"].inert_switches() == ["kl_cov_coef=1.0", "cov_ratio=0.1"]
    assert "cov_ratio=0.1" not in cfgs["clip_cov"].inert_switches()


def test_selection_needs_prepare_loss_and_rows_for_micro_batches():
    logp, logp_old, adv, mask = _batch(seed=4)
    cfg = AlgoConfig(loss="kl_cov")
    final, norm = prepare_loss(mask, logp_old, None, adv, cfg)
    with pytest.raises(ValueError, match=r"pass norm.rows\(idx\)"):
        policy_loss(logp[:2], logp_old[:2], adv[:2], final[:2], cfg, norm=norm)
    a, _ = policy_loss(logp[:2], logp_old[:2], adv[:2], final[:2], cfg, norm=norm.rows(torch.arange(2)))
    b, _ = policy_loss(logp[:2], logp_old[:2], adv[:2], final[:2], cfg, norm=norm.rows(slice(0, 2)))
    assert a.item() == b.item()
    norm.selected = None
    with pytest.raises(ValueError, match="build norm with prepare_loss"):
        policy_loss(logp, logp_old, adv, final, cfg, norm=norm)
