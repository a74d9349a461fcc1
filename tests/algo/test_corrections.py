"""Rollout corrections (section 5): weights, masks, metrics, and the property each exists for."""

import math

import pytest
import torch

from grpoplus.algo import AlgoConfig, policy_loss, prepare_loss

D = torch.float64


def _reinforce(corrections, **kw):
    return AlgoConfig(loss="reinforce", aggregation="token_mean", corrections=corrections, **kw)


def _batch():
    # w_{i,t} = exp(logp_old - logp_roll) chosen by hand.
    logp_old = torch.full((2, 3), -1.0, dtype=D)
    log_w = torch.tensor([[0.1, 1.0, -0.2], [0.3, -2.0, 0.0]], dtype=D)
    logp_roll = logp_old - log_w
    adv = torch.tensor([1.0, -1.0], dtype=D)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=D)
    return logp_old, logp_roll, log_w, adv, mask


def test_tis_token_weights_policy_term():
    logp_old, logp_roll, log_w, adv, mask = _batch()
    loss, m = policy_loss(logp_old, logp_old, adv, mask, _reinforce(("tis_token",), correction_cap=2.0), logp_roll=logp_roll)
    expected = 0.0
    for i in range(2):
        for t in range(3):
            if mask[i, t]:
                expected += min(math.exp(log_w[i, t]), 2.0) * (-adv[i].item() * logp_old[i, t].item())
    assert loss.item() == pytest.approx(expected / 5)
    assert m["correction/tis_token/clipped_frac"] == pytest.approx(1 / 5)  # only e^1.0 > 2


def test_tis_seq_weights_whole_response_by_product():
    logp_old, logp_roll, log_w, adv, mask = _batch()
    loss, m = policy_loss(logp_old, logp_old, adv, mask, _reinforce(("tis_seq",), correction_cap=2.0), logp_roll=logp_roll)
    w0 = min(math.exp(0.1 + 1.0 - 0.2), 2.0)  # e^0.9 = 2.46 -> 2
    w1 = min(math.exp(0.3 - 2.0), 2.0)
    expected = (w0 * 3 * (-1.0 * -1.0) + w1 * 2 * (1.0 * -1.0)) / 5
    assert loss.item() == pytest.approx(expected)
    assert m["correction/tis_seq/clipped_frac"] == pytest.approx(3 / 5)
    assert m["correction/tis_seq/clipped_seq_frac"] == pytest.approx(1 / 2)


def test_mis_token_removes_tokens_from_every_denominator():
    logp_old, logp_roll, log_w, adv, mask = _batch()
    cfg = _reinforce(("mis_token",), correction_low=0.5, correction_high=2.0)
    # outside [0.5, 2]: w = e^1.0 (row 0) and e^-2 (row 1) -> 3 tokens remain
    loss, m = policy_loss(logp_old, logp_old, adv, mask, cfg, logp_roll=logp_roll)
    expected = (2 * (-1.0 * -1.0) + 1 * (1.0 * -1.0)) / 3
    assert loss.item() == pytest.approx(expected)
    assert m["correction/mis_token/masked_frac"] == pytest.approx(2 / 5)
    assert m["loss/active_tokens"] == 3
    seq = policy_loss(logp_old, logp_old, adv, mask, cfg.replace(aggregation="seq_mean_token_mean"), logp_roll=logp_roll)[0]
    assert seq.item() == pytest.approx(((2 * 1.0) / 2 + (1 * -1.0) / 1) / 2)


def test_geo_mask_is_length_neutral_and_mis_seq_is_not():
    # Same per-token mismatch log w = 0.01 in a 20-token and a 400-token response.
    n_long, n_short = 400, 20
    logp_old = torch.full((2, n_long), -1.0, dtype=D)
    logp_roll = logp_old - 0.01
    mask = torch.zeros(2, n_long, dtype=D)
    mask[0, :n_short] = 1
    mask[1, :] = 1
    adv = torch.tensor([1.0, 1.0], dtype=D)
    bounds = dict(correction_low=0.5, correction_high=2.0)
    _, m_seq = policy_loss(logp_old, logp_old, adv, mask, _reinforce(("mis_seq",), **bounds), logp_roll=logp_roll)
    _, m_geo = policy_loss(logp_old, logp_old, adv, mask, _reinforce(("geo_mask",), **bounds), logp_roll=logp_roll)
    # mis_seq: w_short = e^0.2 kept, w_long = e^4 rejected
    assert m_seq["correction/mis_seq/masked_seq_frac"] == 0.5 and m_seq["loss/active_tokens"] == n_short
    # geo_mask: g = e^0.01 for both, kept alike; with tight bounds both are rejected alike
    assert m_geo["correction/geo_mask/masked_seq_frac"] == 0.0
    _, tight = policy_loss(logp_old, logp_old, adv, mask, _reinforce(("geo_mask",), correction_low=0.999,
                                                                     correction_high=1.005), logp_roll=logp_roll)
    assert tight["correction/geo_mask/masked_seq_frac"] == 1.0 and tight["loss/masked_all"] == 1.0


def test_geo_mask_open_bound():
    logp_old = torch.full((2, 2), -1.0, dtype=D)
    logp_roll = logp_old - torch.tensor([[3.0, 3.0], [-3.0, -3.0]], dtype=D)  # g = e^3 and e^-3
    adv, mask = torch.ones(2, dtype=D), torch.ones(2, 2, dtype=D)
    _, m = policy_loss(logp_old, logp_old, adv, mask, _reinforce(("geo_mask",), correction_low=None, correction_high=2.0),
                       logp_roll=logp_roll)
    assert m["correction/geo_mask/masked_seq_frac"] == 0.5  # only the high one; no lower bound


def test_deepseek_v32_mask_drops_negative_far_off_policy_responses():
    # drift_i = mean_t (logp_roll - sg[logp]); row 0 A<0 drift 0.5 -> dropped; row 1 A>0 drift 0.5 -> kept;
    # row 2 A<0 drift 0.05 -> kept (delta = 0.1).
    logp = torch.full((3, 2), -1.0, dtype=D)
    logp_roll = logp + torch.tensor([[0.5], [0.5], [0.05]], dtype=D)
    adv = torch.tensor([-1.0, 1.0, -1.0], dtype=D)
    mask = torch.ones(3, 2, dtype=D)
    cfg = _reinforce(("deepseek_v32_mask",), v32_mask_delta=0.1)
    _, m = policy_loss(logp, logp, adv, mask, cfg, logp_roll=logp_roll)
    assert m["correction/deepseek_v32_mask/masked_seq_frac"] == pytest.approx(1 / 3)
    assert m["loss/active_tokens"] == 4
    final, norm = prepare_loss(mask, logp, logp_roll, adv, cfg)  # uses logp_old for sg[logp]
    assert final[0].sum() == 0 and final[1:].all() and norm.tokens == 4 and norm.active_seqs == 2


def test_masks_compose_with_tis():
    logp_old, logp_roll, log_w, adv, mask = _batch()
    cfg = _reinforce(("mis_token", "tis_token"), correction_low=0.5, correction_high=3.0, correction_cap=1.2)
    # mis_token drops w = e^-2 only; tis caps e^1.0 -> 1.2 and e^0.3 -> 1.2
    loss, m = policy_loss(logp_old, logp_old, adv, mask, cfg, logp_roll=logp_roll)
    w = [math.exp(0.1), 1.2, math.exp(-0.2)]
    expected = (sum(w) * 1.0 + 1.2 * -1.0) / 4
    assert loss.item() == pytest.approx(expected)
    assert m["correction/tis_token/clipped_frac"] == pytest.approx(2 / 4)


def test_gmpo_uses_geometric_mean_of_token_weights():
    logp_old, logp_roll, log_w, adv, mask = _batch()
    cfg = AlgoConfig(loss="gmpo", eps_low=0.4, eps_high=0.4, corrections=("tis_token",), correction_cap=10.0)
    loss, _ = policy_loss(logp_old, logp_old, adv, mask, cfg, logp_roll=logp_roll)
    g0 = math.exp((0.1 + 1.0 - 0.2) / 3)
    g1 = math.exp((0.3 - 2.0) / 2)
    assert loss.item() == pytest.approx((-1.0 * g0 + 1.0 * g1) / 2)


def test_mismatch_metrics_always_measured():
    logp_old, logp_roll, log_w, adv, mask = _batch()
    _, m = policy_loss(logp_old, logp_old, adv, mask, AlgoConfig(), logp_roll=logp_roll)
    toks = [(i, t) for i in range(2) for t in range(3) if mask[i, t]]
    k1 = [-log_w[i, t].item() for i, t in toks]  # logp_roll - logp_old
    p = [abs(math.exp(logp_old[i, t].item()) - math.exp(logp_roll[i, t].item())) for i, t in toks]
    assert m["mismatch/k1"] == pytest.approx(sum(k1) / 5)
    assert m["mismatch/k2"] == pytest.approx(sum(x * x / 2 for x in k1) / 5)
    assert m["mismatch/k3"] == pytest.approx(sum(math.exp(-x) - 1 + x for x in k1) / 5)
    assert m["mismatch/abs_p_diff_mean"] == pytest.approx(sum(p) / 5)
    assert m["mismatch/abs_p_diff_max"] == pytest.approx(max(p))
    assert m["mismatch/is_weight_max"] == pytest.approx(math.e)
    assert m["mismatch/is_weight_min"] == pytest.approx(math.exp(-2.0))
    assert m["mismatch/is_weight_mean"] == pytest.approx(sum(math.exp(-x) for x in k1) / 5)


def test_corrections_without_logp_roll_fail_clearly():
    x = torch.zeros(1, 2, dtype=D)
    with pytest.raises(ValueError, match="need logp_roll"):
        policy_loss(x, x, torch.ones(1, dtype=D), torch.ones(1, 2), _reinforce(("tis_token",)))


@pytest.mark.parametrize("name", ["tis_token", "tis_seq"])
def test_tis_lower_truncation_clamps_weights_into_the_band(name):
    logp_old, logp_roll, log_w, adv, mask = _batch()
    cfg = _reinforce((name,), correction_cap=1.5, correction_cap_low=0.9)
    loss, m = policy_loss(logp_old, logp_old, adv, mask, cfg, logp_roll=logp_roll)
    expected, low = 0.0, 0
    for i in range(2):
        seq_w = math.exp(sum(log_w[i, t].item() for t in range(3) if mask[i, t]))
        for t in range(3):
            if mask[i, t]:
                w = math.exp(log_w[i, t].item()) if name == "tis_token" else seq_w
                expected += min(max(w, 0.9), 1.5) * (-adv[i].item() * logp_old[i, t].item())
                low += w < 0.9
    assert loss.item() == pytest.approx(expected / 5)
    assert m[f"correction/{name}/clipped_low_frac"] == pytest.approx(low / 5)
    assert low > 0  # the lower bound did act
    # without the lower bound, a tiny weight stays tiny
    loss_open, _ = policy_loss(logp_old, logp_old, adv, mask, cfg.replace(correction_cap_low=None), logp_roll=logp_roll)
    assert loss_open.item() != pytest.approx(loss.item())


def _k(log_w, kind):
    """k2 = (log w)^2 / 2, k3 = w - 1 - log w: estimators of KL(mu || pi_old) from samples of mu."""
    return 0.5 * log_w**2 if kind == "k2" else math.exp(log_w) - 1 - log_w


@pytest.mark.parametrize("kind", ["k2", "k3"])
@pytest.mark.parametrize("level", ["token", "seq_sum", "seq_mean", "seq_max"])
def test_rejection_masks_match_loop(level, kind):
    g = torch.Generator().manual_seed(3)
    logp_old = -torch.rand(5, 6, generator=g, dtype=D) * 2
    log_w = 0.4 * torch.randn(5, 6, generator=g, dtype=D)
    logp_roll = logp_old - log_w
    mask = (torch.arange(6)[None, :] < torch.tensor([6, 2, 4, 1, 5])[:, None]).to(D)
    adv = torch.ones(5, dtype=D)
    cfg = _reinforce((f"rs_{level}_{kind}",), rs_threshold=0.03, rs_sum_threshold=0.15)
    final, _ = prepare_loss(mask, logp_old, logp_roll, adv, cfg)
    for i in range(5):
        ks = [_k(log_w[i, t].item(), kind) for t in range(6) if mask[i, t]]
        stat = {"seq_sum": sum(ks), "seq_mean": sum(ks) / len(ks), "seq_max": max(ks)}.get(level)
        for t in range(len(ks)):
            keep = ks[t] <= 0.03 if level == "token" else stat <= (0.15 if level == "seq_sum" else 0.03)
            assert bool(final[i, t]) == keep, (i, t)
    assert 0 < final.sum() < mask.sum()  # something kept, something rejected


def test_rejection_divergences_differ_in_what_they_forgive():
    # One token 2 nats off (w = e^2) among 49 exact ones. k3 = e^2 - 3 = 4.39, k2 = 2.
    # seq_max rejects the response on that token; seq_mean (4.39 / 50 = 0.088) keeps it at 0.1;
    # seq_sum (4.39) rejects it at 1.0: a mean judges the typical token, a max the worst, a sum the total.
    logp_old = torch.full((1, 50), -1.0, dtype=D)
    log_w = torch.zeros(1, 50, dtype=D)
    log_w[0, 7] = 2.0
    mask, adv = torch.ones(1, 50, dtype=D), torch.ones(1, dtype=D)
    kept = {}
    for name in ("rs_seq_max_k3", "rs_seq_mean_k3", "rs_seq_sum_k3"):
        cfg = _reinforce((name,), rs_threshold=0.1, rs_sum_threshold=1.0)
        kept[name] = int(prepare_loss(mask, logp_old, logp_old - log_w, adv, cfg)[0].sum())
    assert kept == {"rs_seq_max_k3": 0, "rs_seq_mean_k3": 50, "rs_seq_sum_k3": 0}
    # k3 is asymmetric (a token the sampler under-rated, w > 1, costs more), k2 is symmetric.
    assert _k(1.0, "k3") == pytest.approx(math.e - 2) and _k(-1.0, "k3") == pytest.approx(math.exp(-1))
    assert _k(1.0, "k2") == _k(-1.0, "k2") == 0.5


def test_sum_rejection_needs_its_threshold():
    with pytest.raises(ValueError, match="'rs_seq_sum_k2' needs rs_sum_threshold"):
        AlgoConfig(corrections=("rs_seq_sum_k2",))
    AlgoConfig(corrections=("rs_seq_mean_k2",))  # the per-token threshold has a default
