"""The no-grad passes that prepare a batch (logp_old, logp_ref) build no autograd graph."""

import copy
import unittest.mock

import pytest
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
    plan = LearnerPlan(temperature=1.0, micro_batch_size=4, max_grad_norm=1.0, logp_old="recompute")
    batch, entropy, _ = prepare(scored, model, reference, algo, plan)  # both passes
    for t in (batch.logp_old, batch.logp_ref, entropy):
        assert t is not None and t.grad_fn is None and not t.requires_grad
    assert batch.logp_old.abs().sum() > 0 and batch.logp_ref.abs().sum() > 0


def test_the_overlong_filter_and_the_entropy_mask_shape_the_loss_mask():
    # 3 rows of 4 tokens; row 2 did not finish: cut; of the 8 tokens left the 4 of highest entropy (row 1) are kept
    n, t = 3, 4
    ids, ones = torch.randint(5, 40, (n, t)), torch.ones(n, t)
    rollouts = Rollouts(ids, ones.long(), ids, ones, -ones, torch.tensor([True, True, False]), torch.zeros(n).long(),
                        ["x"] * n, [0])
    scored = ScoredGroups(rollouts, torch.tensor([0.0, 1.0, 2.0]), torch.zeros(n, dtype=torch.bool), {})
    algo = AlgoConfig.preset("grpo", overlong_filter=True, entropy_mask_rho=0.5, max_len=t)
    model = tiny_model(char_tokenizer(), size="nano", seed=0)
    entropy = torch.arange(12.0).reshape(n, t)
    with torch.no_grad(), unittest.mock.patch("grpoplus.learner.prepare.learner_logprobs",
                                              lambda *a, **k: (-ones, entropy)):
        batch, _, metrics = prepare(scored, model, None, algo, LearnerPlan(temperature=1.0, micro_batch_size=4,
                                                                           max_grad_norm=1.0, logp_old="recompute"))
    assert batch.loss_mask.bool().tolist() == [[False] * 4, [True] * 4, [False] * 4]
    assert metrics["filter/overlong_frac"] == pytest.approx(1 / 3)
    assert metrics["filter/active_token_frac"] == pytest.approx(4 / 12)
