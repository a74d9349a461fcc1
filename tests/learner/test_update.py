"""The learner's optimizer step: exact gradient accumulation and safe skipping."""

import copy

import torch

from grpoplus.algo import AlgoConfig
from grpoplus.containers import TrainBatch
from grpoplus.learner.prepare import LearnerPlan
from grpoplus.learner.update import minibatch_rows, optimizer_step
from grpoplus.metrics.step import reduce_metrics
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer


def _batch(tokenizer, n=8, t=5, seed=0) -> TrainBatch:
    gen = torch.Generator().manual_seed(seed)
    vocab = len(tokenizer)
    prompt_ids = torch.randint(5, vocab, (n, 4), generator=gen)
    response_ids = torch.randint(5, vocab, (n, t), generator=gen)
    response_mask = torch.ones(n, t)
    response_mask[::3, 3:] = 0  # some shorter responses
    logp_roll = -torch.rand(n, t, generator=gen) * response_mask
    return TrainBatch(prompt_ids, torch.ones(n, 4, dtype=torch.long), response_ids, response_mask,
                      response_mask.clone(), torch.randn(n, generator=gen), logp_roll,
                      logp_roll + 0.01 * torch.randn(n, t, generator=gen) * response_mask, None,
                      torch.arange(n) // 4)


def _grads_after_step(model, batch, algo, micro, tokens=0):
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the step leaves weights, we read grads
    captured = {}
    hooks = [p.register_post_accumulate_grad_hook(lambda p: captured.__setitem__(p, p.grad.clone()))
             for p in model.parameters()]
    mode = "forward" if batch.logp_old is None else "recompute"
    optimizer_step(model, opt, batch, algo, LearnerPlan(1.0, micro, 1e9, mode, micro_batch_tokens=tokens))
    for h in hooks:
        h.remove()
    return [captured[p] for p in model.parameters() if p in captured]


def test_micro_batches_give_the_whole_batch_gradient_for_every_aggregation():
    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=0).double()
    batch = _batch(tok)
    batch = TrainBatch(*(x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                         for x in (getattr(batch, f) for f in batch.__dataclass_fields__)))
    for aggregation in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "seq_mean_token_sum"):
        algo = AlgoConfig.preset("grpo", beta=0.0, aggregation=aggregation, max_len=5,
                                 corrections=("tis_token",))
        whole = _grads_after_step(model, batch, algo, micro=8)
        split = _grads_after_step(model, batch, algo, micro=3)  # 3 + 3 + 2 rows
        by_tokens = _grads_after_step(model, batch, algo, micro=8, tokens=20)  # rows of 4 + 3..5 tokens: 2 a batch
        assert len(whole) == len(split) == len(by_tokens) > 0
        for a, b, c in zip(whole, split, by_tokens):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(a, c, rtol=1e-9, atol=1e-12)


def test_non_finite_loss_skips_the_step_and_keeps_weights():
    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=0)
    before = copy.deepcopy(model.state_dict())
    batch = _batch(tok)
    batch.advantages[0] = float("nan")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plan = LearnerPlan(temperature=1.0, micro_batch_size=4, max_grad_norm=1.0, logp_old="recompute")
    metrics, stepped, _ = optimizer_step(model, opt, batch, AlgoConfig.preset("dapo"), plan)
    assert not stepped
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not opt.state  # AdamW moments untouched too
    batch.advantages[0] = 1.0
    _, stepped, _ = optimizer_step(model, opt, batch, AlgoConfig.preset("dapo"), plan)
    assert stepped and any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_minibatches_keep_groups_whole():
    group_ids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    parts = minibatch_rows(group_ids, 2)
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_metric_accumulator_weights_means_and_keeps_extremes():
    parts = [({"loss/ratio_mean": 1.0, "loss/ratio_max": 2.0, "mismatch/is_weight_min": 0.5}, 1.0),
             ({"loss/ratio_mean": 4.0, "loss/ratio_max": 1.5, "mismatch/is_weight_min": 0.7}, 3.0)]
    # weighted mean (1*1 + 4*3) / 4 = 3.25; max of maxima; min of minima
    assert reduce_metrics(parts) == {"loss/ratio_mean": 3.25, "loss/ratio_max": 2.0, "mismatch/is_weight_min": 0.5}


def test_logp_old_from_the_training_forward_equals_a_recompute_pass():
    """On-policy with one update, pi_old is the current policy: taking logp_old from the training
    forward (detached) must give exactly the gradient of a separate no-grad recompute pass."""
    from grpoplus.learner.logprobs import response_logprobs

    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=0).double()
    batch = _batch(tok)
    batch = TrainBatch(*(x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                         for x in (getattr(batch, f) for f in batch.__dataclass_fields__)))
    with torch.no_grad():
        recomputed, _ = response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                          batch.response_mask)
    algo = AlgoConfig.preset("dapo", max_len=5)
    batch.logp_old = recomputed
    separate = _grads_after_step(model, batch, algo, micro=3)
    batch.logp_old = None
    fused = _grads_after_step(model, batch, algo, micro=3)
    for a, b in zip(separate, fused):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
