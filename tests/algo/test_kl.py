"""KL estimators, placement, in-reward KL and reference reset."""

import math

import pytest
import torch

from grpoplus.algo import KL_ESTIMATORS, AlgoConfig, kl_in_reward, policy_loss, reset_reference, should_reset_reference

D = torch.float64


def test_estimator_values_match_formulas():
    logp = torch.tensor([[-0.5, -2.0, -1.0]], dtype=D)
    ref = torch.tensor([[-1.0, -1.5, -1.0]], dtype=D)
    old = torch.tensor([[-0.7, -2.2, -0.9]], dtype=D)
    for t in range(3):
        x = logp[0, t].item() - ref[0, t].item()
        r = math.exp(logp[0, t].item() - old[0, t].item())
        assert KL_ESTIMATORS.get("k1")(logp, ref, old)[0, t].item() == pytest.approx(x)
        assert KL_ESTIMATORS.get("k2")(logp, ref, old)[0, t].item() == pytest.approx(x * x / 2)
        assert KL_ESTIMATORS.get("k3")(logp, ref, old)[0, t].item() == pytest.approx(math.exp(-x) - 1 + x)
        assert KL_ESTIMATORS.get("k3_is")(logp, ref, old)[0, t].item() == pytest.approx(r * (math.exp(-x) - 1 + x))


def test_k3_is_equals_k3_on_policy():
    g = torch.Generator().manual_seed(0)
    base = -torch.rand(2, 4, generator=g, dtype=D)
    ref = base + 0.3 * torch.randn(2, 4, generator=g, dtype=D)
    torch.testing.assert_close(KL_ESTIMATORS.get("k3_is")(base, ref, base), KL_ESTIMATORS.get("k3")(base, ref, base))


@pytest.mark.parametrize("on_policy", [False, True])
def test_k3_is_has_gradient_of_true_kl(on_policy):
    # Over a 5-token vocabulary, the exact expectation under samples from pi_old of k3_is is
    # sum_x pi_old (pi/pi_old) k3 = E_pi[k3] = KL(pi || ref); its gradient must equal that of the true KL
    # sum_x pi (log pi - log ref). Plain k3 (samples treated as on-policy) has a different gradient.
    theta = torch.tensor([0.3, -1.0, 0.5, 2.0, 0.0], dtype=D, requires_grad=True)
    theta_old = theta.detach().clone() if on_policy else torch.tensor([0.0, -0.5, 1.0, 1.5, 0.2], dtype=D)
    theta_ref = torch.tensor([1.0, 0.0, 0.0, 0.5, -1.0], dtype=D)
    logp_old = torch.log_softmax(theta_old, -1)[None]
    logp_ref = torch.log_softmax(theta_ref, -1)[None]
    p_old = logp_old.exp()

    def grad_of(f):
        theta.grad = None
        f().backward()
        return theta.grad.clone()

    logp = lambda: torch.log_softmax(theta, -1)[None]  # noqa: E731
    true = grad_of(lambda: (logp().exp() * (logp() - logp_ref)).sum())
    k3_is = grad_of(lambda: (p_old * KL_ESTIMATORS.get("k3_is")(logp(), logp_ref, logp_old)).sum())
    k3 = grad_of(lambda: (p_old * KL_ESTIMATORS.get("k3")(logp(), logp_ref, logp_old)).sum())
    torch.testing.assert_close(k3_is, true)
    assert (k3 - true).abs().max() > 1e-3
    # and the value is unbiased too
    value = (p_old * KL_ESTIMATORS.get("k3_is")(logp(), logp_ref, logp_old)).sum()
    torch.testing.assert_close(value, (logp().exp() * (logp() - logp_ref)).sum())


def test_kl_in_loss_is_added_after_aggregation_and_not_weighted_by_corrections():
    g = torch.Generator().manual_seed(5)
    logp_old = -torch.rand(2, 3, generator=g, dtype=D)
    logp = logp_old + 0.1 * torch.randn(2, 3, generator=g, dtype=D)
    ref = logp_old + 0.2 * torch.randn(2, 3, generator=g, dtype=D)
    roll = logp_old - 0.5  # w = e^0.5 ~ 1.65 < C = 2: TIS weights every policy token by 1.65
    adv = torch.tensor([1.0, -1.0], dtype=D)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=D)
    beta = 0.3
    cfg = AlgoConfig(beta=beta, kl_estimator="k3", corrections=("tis_token",), aggregation="token_mean")
    total, m = policy_loss(logp, logp_old, adv, mask, cfg, logp_roll=roll, logp_ref=ref)
    k3 = [math.exp(-(logp[i, t] - ref[i, t]).item()) - 1 + (logp[i, t] - ref[i, t]).item()
          for i in range(2) for t in range(3) if mask[i, t]]
    kl = sum(k3) / 5
    assert total.item() == pytest.approx(m["loss/policy"] + beta * kl)
    assert m["loss/kl_ref"] == pytest.approx(kl)
    no_tis, _ = policy_loss(logp, logp_old, adv, mask, cfg.replace(corrections=()), logp_ref=ref)
    assert (total.item() - beta * kl) == pytest.approx((no_tis.item() - beta * kl) * math.exp(0.5))


def test_beta_zero_needs_no_reference_and_beta_positive_does():
    logp = torch.zeros(1, 2, dtype=D)
    adv, mask = torch.ones(1, dtype=D), torch.ones(1, 2, dtype=D)
    _, m = policy_loss(logp, logp, adv, mask, AlgoConfig(beta=0.0))
    assert "loss/kl_ref" not in m
    with pytest.raises(ValueError, match="needs logp_ref"):
        policy_loss(logp, logp, adv, mask, AlgoConfig(beta=0.1))


def test_kl_in_reward_subtracts_beta_sum_k1():
    rewards = torch.tensor([1.0, 0.0])
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]])
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    out = kl_in_reward(rewards, logp, ref, mask, beta=0.5)
    # row 0: k1 = 0.5 - 1.0 = -0.5 -> 1 + 0.25; row 1: k1 = 3 * 0.5 = 1.5 -> -0.75
    torch.testing.assert_close(out, torch.tensor([1.25, -0.75]))


def test_reset_reference_copies_weights_and_clears_optimizer():
    torch.manual_seed(0)
    policy, ref = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(policy.parameters())
    policy(torch.ones(1, 3)).sum().backward()
    opt.step()
    assert len(opt.state) > 0
    reset_reference(ref, policy, opt, reset_optimizer=True)
    for a, b in zip(ref.parameters(), policy.parameters()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    assert len(opt.state) == 0
    with pytest.raises(ValueError, match="needs the optimizer"):
        reset_reference(ref, policy, None, reset_optimizer=True)
    assert [s for s in range(1, 8) if should_reset_reference(s, 3)] == [3, 6]
    assert not any(should_reset_reference(s, 0) for s in range(5))


def test_soft_update_mixes_parameters_and_composes_with_hard_reset():
    from grpoplus.algo import soft_update_reference, update_reference

    torch.manual_seed(1)
    policy, ref = torch.nn.Linear(3, 2).double(), torch.nn.Linear(3, 2).double()
    before = {k: v.clone() for k, v in ref.state_dict().items()}
    soft_update_reference(ref, policy, 0.6)
    for name, p in policy.state_dict().items():
        # pi_ref <- 0.6 pi + 0.4 pi_ref, element by element
        torch.testing.assert_close(ref.state_dict()[name], 0.6 * p + 0.4 * before[name], rtol=1e-15, atol=1e-15)
    # two soft updates with a fixed policy close the gap geometrically: (1 - a)^2 of it is left
    gap = {k: before[k] - v for k, v in policy.state_dict().items()}
    soft_update_reference(ref, policy, 0.6)
    for name, p in policy.state_dict().items():
        torch.testing.assert_close(ref.state_dict()[name] - p, 0.16 * gap[name], rtol=1e-12, atol=1e-15)
    # alpha = 1 is the hard reset (optionally with the optimizer), alpha < 1 never resets the optimizer
    opt = torch.optim.SGD(policy.parameters(), lr=0.1, momentum=0.9)
    policy(torch.ones(1, 3, dtype=torch.float64)).sum().backward()
    opt.step()
    update_reference(ref, policy, 1.0, opt, reset_optimizer=True)
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), policy.parameters())) and not opt.state
    with pytest.raises(ValueError, match="goes with the hard reset"):
        update_reference(ref, policy, 0.5, opt, reset_optimizer=True)
    with pytest.raises(ValueError, match="0 < alpha <= 1"):
        soft_update_reference(ref, policy, 0.0)
    with pytest.raises(ValueError, match="differ in their parameters"):
        soft_update_reference(torch.nn.Linear(3, 2), torch.nn.Sequential(torch.nn.Linear(3, 2)), 0.5)


def test_soft_update_mixes_tied_weights_once():
    from grpoplus.algo import soft_update_reference

    def tied():
        m = torch.nn.ModuleDict({"emb": torch.nn.Embedding(4, 2), "head": torch.nn.Linear(2, 4, bias=False)})
        m["head"].weight = m["emb"].weight
        return m.double()

    torch.manual_seed(0)
    policy, ref = tied(), tied()
    before = ref["emb"].weight.detach().clone()
    soft_update_reference(ref, policy, 0.5)
    torch.testing.assert_close(ref["emb"].weight, 0.5 * policy["emb"].weight + 0.5 * before)
    assert ref["head"].weight is ref["emb"].weight
