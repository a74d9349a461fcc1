"""The no-grad passes that prepare a batch (logp_old, logp_ref) build no autograd graph."""

import copy

import torch

from grpoplus.algo import AlgoConfig
from grpoplus.containers import Rollouts, ScoredGroups
from grpoplus.learner.prepare import LearnerPlan, prepare
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer


def test_the_recomputed_and_reference_logprobs_carry_no_graph(grouped_rows):
    prompt_ids, prompt_mask, response_ids, response_mask = grouped_rows(0)
    n = len(prompt_ids)
    rollouts = Rollouts(prompt_ids, prompt_mask, response_ids, response_mask.float(), -response_mask.float(),
                        torch.ones(n, dtype=torch.bool), torch.arange(n) // 4, ["x"] * n, [0, 1, 2])
    scored = ScoredGroups(rollouts, torch.randn(n), torch.zeros(n, dtype=torch.bool), {})
    model = tiny_model(char_tokenizer(), size="nano", seed=0)
    reference = copy.deepcopy(model).requires_grad_(False)
    algo = AlgoConfig.preset("grpo", beta=0.05)
    batch, entropy, _ = prepare(scored, model, reference, algo, LearnerPlan(1.0, 4, 1.0, "recompute"))  # both passes
    for t in (batch.logp_old, batch.logp_ref, entropy):
        assert t is not None and t.grad_fn is None and not t.requires_grad
    assert batch.logp_old.abs().sum() > 0 and batch.logp_ref.abs().sum() > 0
