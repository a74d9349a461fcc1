"""Shared fixtures: the built-in character tokenizer and a randomly initialised nano Llama."""

import pytest
import torch

from grpoplus.models.tiny import tiny_model


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test of this directory on one thread."""


@pytest.fixture
def model(tok):
    """The nano tiny model with sharpened attention.

    At the default init scale attention is almost uniform, so wrong positions or an
    unmasked pad token would change log-probs by less than the tests' 1e-5 tolerance;
    larger query/key weights make both visible.
    """
    model = tiny_model(tok, size="nano", seed=0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(6.0)
            layer.self_attn.k_proj.weight.mul_(6.0)
    return model


@pytest.fixture
def prompts():
    # Different lengths, so left padding is exercised in every batch.
    return ["12+3=", "7*8=", "100-1=", "9="]


@pytest.fixture
def favour_eos(tok):
    """``favour_eos(model, bonus)``: add ``bonus`` to the EOS logit of every forward of ``model``.

    A forward hook, so the sampler and the learner both see the same distribution.
    """

    def add_hook(model, bonus: float):
        bias = torch.zeros(len(tok))
        bias[tok.eos_token_id] = bonus
        return model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)

    return add_hook
