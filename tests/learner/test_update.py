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


def _grads_after_step(model, batch, algo, micro, tokens=0, **step_kwargs):
    return _step(model, batch, algo, micro, tokens, **step_kwargs)[0]


def _step(model, batch, algo, micro, tokens=0, **step_kwargs):
    """(gradients of one optimizer step, its metrics) on a copy of ``model``."""
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the step leaves weights, we read grads
    captured = {}
    hooks = [p.register_post_accumulate_grad_hook(lambda p: captured.__setitem__(p, p.grad.clone()))
             for p in model.parameters()]
    mode = "forward" if batch.logp_old is None else "recompute"
    plan = LearnerPlan(temperature=1.0, micro_batch_size=micro, max_grad_norm=1e9, logp_old=mode, micro_batch_tokens=tokens)
    metrics, _, _ = optimizer_step(model, opt, batch, algo, plan, **step_kwargs)
    for h in hooks:
        h.remove()
    return [captured[p] for p in model.parameters() if p in captured], metrics


def _double(batch: TrainBatch) -> TrainBatch:
    return TrainBatch(*(x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                        for x in (getattr(batch, f) for f in batch.__dataclass_fields__)))


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


def _assert_same(a_grads, b_grads):
    assert len(a_grads) == len(b_grads) > 0
    for a, b in zip(a_grads, b_grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def _differ(a_grads, b_grads) -> bool:
    return any(not torch.allclose(a, b, rtol=1e-6, atol=1e-9) for a, b in zip(a_grads, b_grads))


def test_clip_cov_and_kl_cov_accumulate_exactly_with_the_step_s_token_selection():
    """Clip-Cov / KL-Cov select tokens over the whole optimizer step (prepare_loss); each
    micro-batch gets its rows of the selection (norm.rows), so 3 + 3 + 2 rows give the
    gradient of the 8 rows at once - and the selection really changes the gradient."""
    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=0).double()
    batch = _double(_batch(tok))
    # Wide covariance band and a large ratio so that many tokens are selected on this tiny batch.
    cases = {"clip_cov": dict(loss="clip_cov", cov_ratio=0.3, cov_lb=-5.0, cov_ub=5.0, eps_low=0.2, eps_high=0.2),
             "kl_cov": dict(loss="kl_cov", cov_ratio=0.3, kl_cov_coef=1.0)}
    for name, overrides in cases.items():
        algo = AlgoConfig.preset(name, max_len=5, **overrides)
        whole, metrics = _step(model, batch, algo, 8, generator=torch.Generator().manual_seed(7))
        split = _grads_after_step(model, batch, algo, 3, generator=torch.Generator().manual_seed(7))
        _assert_same(whole, split)
        by_tokens = _grads_after_step(model, batch, algo, 8, tokens=20, generator=torch.Generator().manual_seed(7))
        _assert_same(whole, by_tokens)  # rows regrouped by length: the selection follows them (norm.rows)
        assert metrics["loss/cov_selected_frac"] > 0, name
        plain = _grads_after_step(model, batch, AlgoConfig.preset("grpo", beta=0.0, max_len=5,
                                                                  aggregation="token_mean"), 8)
        assert _differ(whole, plain), name


def test_clip_cov_subset_follows_the_generator():
    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=0).double()
    batch = _double(_batch(tok))
    algo = AlgoConfig.preset("clip_cov", max_len=5, cov_ratio=0.1, cov_lb=-5.0, cov_ub=5.0, eps_low=0.2, eps_high=0.2)
    a = _grads_after_step(model, batch, algo, 8, generator=torch.Generator().manual_seed(1))
    b = _grads_after_step(model, batch, algo, 8, generator=torch.Generator().manual_seed(1))
    c = _grads_after_step(model, batch, algo, 8, generator=torch.Generator().manual_seed(2))
    _assert_same(a, b)
    assert _differ(a, c)  # another seed restrains another random subset


def test_entropy_bonus_accumulates_exactly_and_pushes_the_gradient():
    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=0).double()
    batch = _double(_batch(tok))
    for aggregation in ("token_mean", "seq_mean_token_mean"):
        algo = AlgoConfig.preset("grpo", beta=0.0, max_len=5, aggregation=aggregation, entropy_coef=0.5)
        whole, metrics = _step(model, batch, algo, 8)
        _assert_same(whole, _grads_after_step(model, batch, algo, 3))
        _assert_same(whole, _grads_after_step(model, batch, algo, 8, tokens=20))
        assert metrics["loss/entropy"] > 0 and metrics["loss/entropy_bonus"] < 0
        assert _differ(whole, _grads_after_step(model, batch, algo.replace(entropy_coef=0.0), 8))
    fused = _double(_batch(tok))
    fused.logp_old = None  # pi_old from the training forward, which now also takes the entropy with grad
    algo = AlgoConfig.preset("dapo", max_len=5, entropy_coef=0.5)
    _assert_same(_grads_after_step(model, fused, algo, 8), _grads_after_step(model, fused, algo, 3))


def test_adaptive_entropy_control_steps_after_every_optimizer_step():
    """Skywork-OR1: c rises by delta after each step whose measured entropy is at or below the
    target (a target far above the nano model's entropy here): 2 mini-batches -> 2 steps -> 2 deltas,
    and the first step applies c = 0 (no measurement yet), the second c = delta."""
    from grpoplus.algo import EntropyControl
    from grpoplus.learner.update import update_policy

    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=0)
    algo = AlgoConfig.preset("skywork_or1", max_len=5, entropy_target=100.0, num_minibatches=2)
    control = EntropyControl.from_config(algo)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    result = update_policy(model, opt, sched, _batch(tok), algo, LearnerPlan(temperature=1.0, micro_batch_size=8,
                                                                             max_grad_norm=1.0,
                                                                             logp_old="recompute"), control)
    assert control.coef == 2 * algo.entropy_coef_delta
    assert 0 < control.last_entropy < 100
    assert result.metrics["entropy/coef"] == control.coef
    # mean over the two steps of the applied coefficient: (0 + delta) / 2
    assert abs(result.metrics["loss/entropy_coef"] - algo.entropy_coef_delta / 2) < 1e-12
