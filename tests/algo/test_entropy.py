"""Entropy bonus (-c * agg(H)) and adaptive entropy control (Skywork-OR1)."""

import math

import pytest
import torch

from grpoplus.algo import AlgoConfig, EntropyControl, policy_loss

D = torch.float64
AGGS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "seq_mean_token_sum"]


def _batch():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 4, generator=g, dtype=D)
    entropy = torch.rand(3, 4, generator=g, dtype=D) * 2
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=D)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=D)
    return logp, entropy, adv, mask


def _agg_weights(agg, mask, max_len):
    """d agg(H) / d H_{i,t} written out: the weight of each token in each aggregation (row 2 is empty)."""
    n_tok, n_seq, n_active = mask.sum().item(), mask.shape[0], int((mask.sum(-1) > 0).sum())
    lens = mask.sum(-1)
    w = torch.zeros_like(mask)
    for i in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if mask[i, t]:
                w[i, t] = {"token_mean": 1 / n_tok, "seq_mean_token_mean": 1 / (lens[i].item() * n_active),
                           "seq_mean_token_sum_norm": 1 / (n_seq * max_len), "seq_mean_token_sum": 1 / n_active}[agg]
    return w


@pytest.mark.parametrize("agg", AGGS)
def test_bonus_is_minus_c_times_the_policy_terms_aggregation_of_entropy(agg):
    logp, entropy, adv, mask = _batch()
    cfg = AlgoConfig(loss="reinforce", aggregation=agg, max_len=6, entropy_coef=0.3)
    h = entropy.clone().requires_grad_()
    with_bonus, m = policy_loss(logp, logp, adv, mask, cfg, entropy=h)
    with_bonus.backward()
    without, _ = policy_loss(logp, logp, adv, mask, cfg.replace(entropy_coef=0.0))
    w = _agg_weights(agg, mask, 6)
    bonus = -0.3 * (w * entropy).sum().item()
    assert with_bonus.item() - without.item() == pytest.approx(bonus, rel=1e-12)
    torch.testing.assert_close(h.grad, -0.3 * w)  # the bonus raises entropy where it lowers the loss
    assert m["loss/entropy_bonus"] == pytest.approx(bonus, rel=1e-12)
    assert m["loss/entropy"] == pytest.approx((entropy * mask).sum().item() / mask.sum().item())
    assert m["loss/entropy_coef"] == 0.3


def test_token_mean_bonus_is_trls_mean_token_entropy():
    # TRL: loss - coef * sum(m H) / sum(m) whatever the loss type; equal here for token_mean.
    logp, entropy, adv, mask = _batch()
    cfg = AlgoConfig(loss="reinforce", entropy_coef=0.1)
    _, m = policy_loss(logp, logp, adv, mask, cfg, entropy=entropy)
    assert m["loss/entropy_bonus"] == pytest.approx(-0.1 * (entropy * mask).sum().item() / mask.sum().item())


def test_missing_entropy_or_adaptive_coefficient_is_an_error():
    logp, entropy, adv, mask = _batch()
    with pytest.raises(ValueError, match="need entropy= the token entropy"):
        policy_loss(logp, logp, adv, mask, AlgoConfig(entropy_coef=0.1))
    with pytest.raises(ValueError, match="EntropyControl.applied_coef"):
        policy_loss(logp, logp, adv, mask, AlgoConfig(entropy_adaptive=True), entropy=entropy)
    # an explicit coefficient wins over the config's
    _, m = policy_loss(logp, logp, adv, mask, AlgoConfig(entropy_adaptive=True), entropy=entropy, entropy_coef=0.02)
    assert m["loss/entropy_coef"] == 0.02


def test_adaptive_control_follows_the_skywork_rule():
    ctl = EntropyControl.from_config(AlgoConfig(entropy_adaptive=True, entropy_coef=0.01, entropy_target=0.2,
                                                entropy_coef_delta=0.005, entropy_coef_max=0.02))
    assert ctl.applied_coef == 0.0  # nothing measured yet: no bonus
    trace = []
    for h in (0.5, 0.15, 0.1, 0.1, 0.1, 0.3, 0.2):
        ctl.update(h)
        trace.append((round(ctl.coef, 6), ctl.applied_coef))
    # c: 0.01 -0.005 (0.5 > 0.2) -> 0.005; +0.005 -> 0.01; -> 0.015; -> 0.02; capped at 0.02;
    # 0.3 > 0.2 -> 0.015; 0.2 <= 0.2 -> 0.02. Applied only while the last entropy <= target.
    assert trace == [(0.005, 0.0), (0.01, 0.01), (0.015, 0.015), (0.02, 0.02), (0.02, 0.02), (0.015, 0.0),
                     (0.02, 0.02)]
    ctl = EntropyControl(coef=0.003, adaptive=True, delta=0.005, coef_min=0.001)
    ctl.update(1.0)
    assert ctl.coef == 0.001  # floored at coef_min
    with pytest.raises(ValueError, match="finite"):
        ctl.update(math.nan)


def test_control_state_round_trips_so_a_resumed_run_continues_exactly():
    cfg = AlgoConfig(entropy_adaptive=True, entropy_coef=0.01)
    a = EntropyControl.from_config(cfg)
    for h in (0.1, 0.3, 0.05):
        a.update(h)
    b = EntropyControl.from_config(cfg)  # a fresh process, then load the checkpoint
    b.load_state_dict(a.state_dict())
    for h in (0.1, 0.4, 0.15):
        a.update(h)
        b.update(h)
        assert (a.coef, a.applied_coef) == (b.coef, b.applied_coef)


def test_constant_control_never_changes():
    ctl = EntropyControl.from_config(AlgoConfig(entropy_coef=0.05))
    ctl.update(0.0)
    assert ctl.applied_coef == ctl.coef == 0.05
    assert ctl.metrics() == {"entropy/coef": 0.05, "entropy/applied_coef": 0.05}
