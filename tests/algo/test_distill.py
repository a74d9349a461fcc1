"""On-policy distillation's formulas (ALGORITHMS.md section 11) against independent computations: the opd token
advantage written out element by element (prime-rl's / verl's reverse-KL advantage on the student's samples),
and the full-vocabulary divergences against TRL's generalized_jsd_loss convention written with ``F.kl_div``."""

import math

import pytest
import torch
import torch.nn.functional as F

from grpoplus.algo import AlgoConfig, generalized_jsd, opd_advantages, opd_metrics, reverse_kl

D = torch.float64


def _tokens(seed=0, n=3, t=5):
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(n, t, generator=g, dtype=D) * 3
    logp_teacher = -torch.rand(n, t, generator=g, dtype=D) * 3
    mask = torch.ones(n, t, dtype=D)
    mask[0, 3:] = 0
    mask[2, 1] = 0
    return logp_old, logp_teacher, mask


@pytest.mark.parametrize("outcome", [True, False])
def test_opd_advantage_is_the_outcome_plus_the_teachers_log_ratio_token_by_token(outcome):
    logp_old, logp_teacher, mask = _tokens()
    adv = torch.tensor([0.5, -1.0, 2.0], dtype=D)
    lam = 0.7
    got = opd_advantages(adv, logp_old, logp_teacher, mask, lam, outcome=outcome)
    for i in range(3):
        for t in range(5):
            reward_t = logp_teacher[i, t].item() - logp_old[i, t].item()  # -kl: the reverse-KL reward of a token
            want = (adv[i].item() if outcome else 0.0) + lam * reward_t if mask[i, t] else 0.0
            assert got[i, t].item() == pytest.approx(want, abs=1e-12)


def test_opd_advantage_takes_token_level_outcome_advantages_and_no_gradient():
    logp_old, logp_teacher, mask = _tokens(1)
    logp_old.requires_grad_()
    token_adv = torch.randn(3, 5, dtype=D)
    got = opd_advantages(token_adv, logp_old, logp_teacher, mask, 1.0)
    assert not got.requires_grad
    assert torch.allclose(got, (token_adv + logp_teacher - logp_old.detach()) * mask)


def test_opd_metrics_are_masked_means():
    logp_old, logp_teacher, mask = _tokens(2)
    top1 = torch.zeros(3, 5, dtype=torch.bool)
    top1[1, :2] = True
    top1[0, 4] = True  # masked out: not counted
    m = opd_metrics(logp_old, logp_teacher, mask, top1)
    n = mask.sum().item()
    assert m["opd/reverse_kl"] == pytest.approx(((logp_old - logp_teacher) * mask).sum().item() / n)
    assert m["opd/teacher_logp"] == pytest.approx((logp_teacher * mask).sum().item() / n)
    assert m["opd/top1_agreement"] == pytest.approx(2 / n)


def _trl_style_gjsd(student_logits, teacher_logits, beta):
    """TRL's generalized_jsd_loss convention, written with F.kl_div (KL(target || input) with log_target), per token."""
    s, t = F.log_softmax(student_logits, -1), F.log_softmax(teacher_logits, -1)
    if beta == 0:
        return F.kl_div(s, t, reduction="none", log_target=True).sum(-1)
    if beta == 1:
        return F.kl_div(t, s, reduction="none", log_target=True).sum(-1)
    mix = torch.logsumexp(torch.stack([s + math.log(1 - beta), t + math.log(beta)]), 0)
    return (beta * F.kl_div(mix, t, reduction="none", log_target=True).sum(-1)
            + (1 - beta) * F.kl_div(mix, s, reduction="none", log_target=True).sum(-1))


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_gjsd_value_and_gradient_match_the_trl_convention(beta):
    g = torch.Generator().manual_seed(3)
    student = torch.randn(2, 4, 11, generator=g, dtype=D, requires_grad=True)
    teacher = torch.randn(2, 4, 11, generator=g, dtype=D) * 2
    ours = generalized_jsd(student, teacher, beta=beta)
    grad, = torch.autograd.grad(ours.sum(), student)
    ref_student = student.detach().clone().requires_grad_()
    theirs = _trl_style_gjsd(ref_student, teacher, beta)
    ref_grad, = torch.autograd.grad(theirs.sum(), ref_student)
    assert torch.allclose(ours, theirs, atol=1e-12)
    assert torch.allclose(grad, ref_grad, atol=1e-12)


def test_reverse_kl_is_gjsd_at_beta_one_and_zero_at_the_teacher():
    g = torch.Generator().manual_seed(4)
    student, teacher = torch.randn(3, 7, generator=g, dtype=D), torch.randn(3, 7, generator=g, dtype=D)
    assert torch.allclose(reverse_kl(student, teacher), generalized_jsd(student, teacher, beta=1.0))
    assert torch.allclose(reverse_kl(teacher + 5.0, teacher), torch.zeros(3, dtype=D), atol=1e-12)  # same softmax
    assert (reverse_kl(student, teacher) > 0).all()


def test_full_vocabulary_loss_refuses_two_vocabularies():
    with pytest.raises(ValueError, match="one vocabulary"):
        reverse_kl(torch.zeros(2, 5), torch.zeros(2, 6))


@pytest.mark.parametrize("overrides,match", [
    (dict(lambda_opd=-0.1), "lambda_opd must be >= 0"),
    (dict(distill_loss="forward_kl"), "distill_loss='forward_kl' is not valid"),
    (dict(gjsd_beta=1.5), "gjsd_beta must be in"),
    (dict(opd_outcome=False), "set lambda_opd > 0"),
])
def test_bad_distillation_settings_are_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        AlgoConfig(**overrides)
