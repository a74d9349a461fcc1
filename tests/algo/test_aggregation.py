"""Aggregations against loops, Dr. GRPO's constant denominator, and gradient accumulation."""

import pytest
import torch

from grpoplus.algo import AlgoConfig, LossNorm, policy_loss, prepare_loss

D = torch.float64
AGGS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "seq_mean_token_sum"]


def _reference(agg, L, mask, max_len):
    """Section 3 of ALGORITHMS.md, one loop per formula."""
    n = L.shape[0]
    lens = [int(mask[i].sum()) for i in range(n)]
    n_active = sum(1 for x in lens if x > 0)
    tok_sums = [sum(L[i, t].item() for t in range(L.shape[1]) if mask[i, t]) for i in range(n)]
    if agg == "token_mean":
        return sum(tok_sums) / sum(lens)
    if agg == "seq_mean_token_mean":
        return sum(s / x for s, x in zip(tok_sums, lens) if x > 0) / n_active
    if agg == "seq_mean_token_sum_norm":
        return sum(tok_sums) / (n * max_len)
    return sum(tok_sums) / n_active


@pytest.mark.parametrize("agg", AGGS)
def test_aggregation_matches_loop(agg):
    # REINFORCE on logp_old == logp: L_{i,t} = -A_i logp_{i,t}; row 2 fully masked (neither adds nor dilutes).
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(4, 5, generator=g, dtype=D)
    adv = torch.tensor([1.0, -2.0, 5.0, 0.5], dtype=D)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=D)
    cfg = AlgoConfig(loss="reinforce", aggregation=agg, max_len=7)
    loss, _ = policy_loss(logp, logp, adv, mask, cfg)
    L = -adv[:, None] * logp
    assert loss.item() == pytest.approx(_reference(agg, L, mask, 7))


def test_dr_grpo_denominator_ignores_length_of_zero_loss_response():
    # Response 1 has A = 0 so its token losses are 0; growing it from 2 to 5 tokens leaves Dr. GRPO's
    # loss unchanged (denominator N * L_max), while token_mean and seq_mean_token_mean move.
    logp = torch.full((2, 5), -1.0, dtype=D)
    adv = torch.tensor([1.0, 0.0], dtype=D)
    short = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=D)
    long = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=D)
    for agg, should_move in [("seq_mean_token_sum_norm", False), ("token_mean", True), ("seq_mean_token_mean", False)]:
        cfg = AlgoConfig(loss="reinforce", aggregation=agg, max_len=8)
        a = policy_loss(logp, logp, adv, short, cfg)[0].item()
        b = policy_loss(logp, logp, adv, long, cfg)[0].item()
        assert (a != pytest.approx(b)) == should_move, agg
    # and Dr. GRPO's value is sum(m L) / (N L_max) = 3 * 1 / (2 * 8)
    cfg = AlgoConfig(loss="reinforce", aggregation="seq_mean_token_sum_norm", max_len=8)
    assert policy_loss(logp, logp, adv, long, cfg)[0].item() == pytest.approx(3 / 16)


def _grad_batch(seed):
    g = torch.Generator().manual_seed(seed)
    n, t = 7, 6
    logp_old = -torch.rand(n, t, generator=g, dtype=D) * 3
    logp = logp_old + 0.3 * torch.randn(n, t, generator=g, dtype=D)
    logp_roll = logp_old + 0.3 * torch.randn(n, t, generator=g, dtype=D)
    logp_ref = logp_old + 0.2 * torch.randn(n, t, generator=g, dtype=D)
    entropy = torch.rand(n, t, generator=g, dtype=D) * 2
    adv = torch.randn(n, generator=g, dtype=D)
    lengths = torch.tensor([6, 3, 0, 1, 5, 6, 2])
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(D)
    return logp, logp_old, logp_roll, logp_ref, entropy, adv, mask


LOSSES = ["clip", "gmpo", "gspo", "cispo", "sapo", "dppo_tv", "dppo_kl", "tis_pg_seq", "clip_cov", "kl_cov"]


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("loss_name", LOSSES)
def test_micro_batches_sum_to_whole_batch(agg, loss_name):
    logp, logp_old, logp_roll, logp_ref, entropy, adv, mask = _grad_batch(seed=2)
    cfg = AlgoConfig(loss=loss_name, aggregation=agg, beta=0.1, kl_estimator="k3_is", entropy_coef=0.05,
                     corrections=("mis_token", "tis_seq", "geo_mask", "rs_seq_max_k2"), correction_low=0.7,
                     correction_high=1.4, rs_threshold=0.1, max_len=9, cov_ratio=0.2, cov_lb=-10.0, cov_ub=10.0)
    final_mask, norm = prepare_loss(mask, logp_old, logp_roll, adv, cfg, generator=torch.Generator().manual_seed(5))
    assert norm.tokens < mask.sum()  # the masks did remove tokens, so the test means something
    whole, h_whole = logp.clone().requires_grad_(), entropy.clone().requires_grad_()
    loss_whole, _ = policy_loss(whole, logp_old, adv, final_mask, cfg, logp_roll=logp_roll, logp_ref=logp_ref,
                                norm=norm, entropy=h_whole)
    loss_whole.backward()

    split, h_split = logp.clone().requires_grad_(), entropy.clone().requires_grad_()
    total = 0.0
    for rows in (torch.arange(0, 2), torch.arange(2, 3), torch.arange(3, 7)):
        part, metrics = policy_loss(split[rows], logp_old[rows], adv[rows], final_mask[rows], cfg,
                                    logp_roll=logp_roll[rows], logp_ref=logp_ref[rows], norm=norm.rows(rows),
                                    entropy=h_split[rows])
        part.backward()
        total += part.item()
        assert "correction/geo_mask/masked_frac" in metrics
    assert total == pytest.approx(loss_whole.item(), rel=1e-12, abs=1e-12)
    torch.testing.assert_close(split.grad, whole.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h_split.grad, h_whole.grad, rtol=1e-12, atol=1e-12)
    assert h_whole.grad.abs().sum() > 0  # the entropy bonus is in the loss


@pytest.mark.parametrize("loss_name", ["clip", "clip_cov", "kl_cov"])
def test_prepared_loss_equals_one_micro_batch_loss_on_the_first_update(loss_name):
    # logp == logp_old (the first update of a batch): prepare_loss's masks and token selection, made
    # with logp_old, are those policy_loss makes with sg[logp] when it is given the whole batch.
    _, logp_old, logp_roll, _, entropy, adv, mask = _grad_batch(seed=3)
    cfg = AlgoConfig(loss=loss_name, corrections=("deepseek_v32_mask", "mis_token"), correction_low=0.7,
                     correction_high=1.4, cov_ratio=0.2, cov_lb=-10.0, cov_ub=10.0)
    direct, _ = policy_loss(logp_old, logp_old, adv, mask, cfg, logp_roll=logp_roll,
                            generator=torch.Generator().manual_seed(1))
    final, norm = prepare_loss(mask, logp_old, logp_roll, adv, cfg, generator=torch.Generator().manual_seed(1))
    prepared, _ = policy_loss(logp_old, logp_old, adv, final, cfg, logp_roll=logp_roll, norm=norm)
    assert prepared.item() == pytest.approx(direct.item(), rel=1e-12, abs=1e-15)


def test_loss_norm_counts():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    norm = LossNorm.from_mask(mask, max_len=10)
    assert (norm.tokens, norm.seqs, norm.active_seqs, norm.max_len) == (3, 3, 2, 10)
