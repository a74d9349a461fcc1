"""Aggregations against loops, Dr. GRPO's constant denominator, and gradient accumulation."""

import pytest
import torch

from grpoplus.algo import AlgoConfig, LossNorm, prepare_loss, policy_loss

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
    adv = torch.randn(n, generator=g, dtype=D)
    lengths = torch.tensor([6, 3, 0, 1, 5, 6, 2])
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(D)
    return logp, logp_old, logp_roll, logp_ref, adv, mask


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("loss_name", ["clip", "gmpo", "gspo", "cispo"])
def test_micro_batches_sum_to_whole_batch(agg, loss_name):
    logp, logp_old, logp_roll, logp_ref, adv, mask = _grad_batch(seed=2)
    cfg = AlgoConfig(loss=loss_name, aggregation=agg, beta=0.1, kl_estimator="k3_is",
                     corrections=("mis_token", "tis_seq", "geo_mask"), correction_low=0.7, correction_high=1.4, max_len=9)
    whole = logp.clone().requires_grad_()
    loss_whole, _ = policy_loss(whole, logp_old, adv, mask, cfg, logp_roll=logp_roll, logp_ref=logp_ref)
    loss_whole.backward()

    final_mask, norm = prepare_loss(mask, logp_old, logp_roll, adv, cfg)
    assert norm.tokens < mask.sum()  # the masks did remove tokens, so the test means something
    split = logp.clone().requires_grad_()
    total = 0.0
    for rows in (slice(0, 2), slice(2, 3), slice(3, 7)):
        part, metrics = policy_loss(split[rows], logp_old[rows], adv[rows], final_mask[rows], cfg,
                                    logp_roll=logp_roll[rows], logp_ref=logp_ref[rows], norm=norm)
        part.backward()
        total += part.item()
        assert "correction/geo_mask/masked_frac" in metrics
    assert total == pytest.approx(loss_whole.item(), rel=1e-12, abs=1e-12)
    torch.testing.assert_close(split.grad, whole.grad, rtol=1e-12, atol=1e-12)


def test_loss_norm_counts():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    norm = LossNorm.from_mask(mask, max_len=10)
    assert (norm.tokens, norm.seqs, norm.active_seqs, norm.max_len) == (3, 3, 2, 10)
    assert norm.all_reduce() is norm  # no process group: a no-op
