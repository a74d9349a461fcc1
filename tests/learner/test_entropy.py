"""The token entropy with its gradient (the entropy bonus's forward)."""

import math

import torch

from grpoplus.learner.entropy import response_logprobs_and_entropy, token_entropy_with_grad
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer


def test_entropy_and_its_gradient_equal_the_plain_autograd_formula():
    # Reference: H = -sum_v p_v log p_v with autograd through log_softmax, in float64.
    logits = torch.randn(3, 4, 11, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(3, 4, dtype=torch.float64)
    for temperature in (1.0, 0.7):
        ours = token_entropy_with_grad(logits, temperature)
        (g_ours,) = torch.autograd.grad((ours * weights).sum(), logits)
        logp = (logits / temperature).log_softmax(-1)
        ref = -(logp.exp() * logp).sum(-1)
        (g_ref,) = torch.autograd.grad((ref * weights).sum(), logits)
        torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-10, atol=1e-12)


def test_uniform_distribution_has_entropy_log_v_and_zero_gradient():
    # H is maximal (log V) at the uniform distribution, so dH/dz = -p (log p + H) = -(1/V)(-log V + log V) = 0.
    logits = torch.zeros(1, 1, 8, dtype=torch.float64, requires_grad=True)
    h = token_entropy_with_grad(logits)
    h.sum().backward()
    assert abs(float(h.detach()) - math.log(8)) < 1e-12
    assert logits.grad.abs().max() < 1e-15


def test_forward_with_entropy_matches_the_log_prob_forward():
    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=0).double()
    gen = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(5, len(tok), (4, 3), generator=gen)
    prompt_mask = torch.ones(4, 3, dtype=torch.long)
    prompt_mask[0, 0] = 0  # left padding
    response_ids = torch.randint(5, len(tok), (4, 6), generator=gen)
    response_mask = torch.ones(4, 6)
    response_mask[1, 4:] = 0  # right padding
    logp, entropy = response_logprobs_and_entropy(model, prompt_ids, prompt_mask, response_ids, response_mask,
                                                  temperature=0.9)
    ref_logp, ref_entropy = response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask,
                                              temperature=0.9, with_entropy=True)
    torch.testing.assert_close(logp.double(), ref_logp.double(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(entropy.double(), (ref_entropy * response_mask).double(), rtol=1e-6, atol=1e-6)
    assert entropy.requires_grad and float(entropy.detach()[1, 4:].abs().sum()) == 0.0
    entropy.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
