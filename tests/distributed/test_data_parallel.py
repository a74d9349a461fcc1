"""Data-parallel learner on 2 gloo ranks: the update equals the single-process one, for every
aggregation, without and with corrections and KL; LossNorm.all_reduce sums the shares; a rank
that dies or stops answering is a one-line error naming the rank, within the time limit."""

import pytest
import ranks
import torch


@pytest.fixture(scope="module")
def single():
    """The single-process reference: 2 micro-batches of 8 rows and 4 of 4, no group."""
    return {micro: ranks.every_case(None, micro) for micro in (8, 4)}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Both arrangements on 2 ranks, in one spawn: {micro: [rank 0 result, rank 1 result]}."""
    out = {}
    for micro in (8, 4):
        path = tmp_path_factory.mktemp(f"dp{micro}")
        out[micro] = ranks.spawn(ranks.every_case, 2, path, micro)
    return out


def _assert_weights(a: dict, b: dict, exact: bool, dtype: torch.dtype) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if exact:
            assert torch.equal(a[key], b[key]), key
        else:  # only the summation order of the micro-batch gradients differs
            tol = 1e-5 if dtype == torch.float32 else 1e-12
            torch.testing.assert_close(a[key], b[key], rtol=tol, atol=tol)


@pytest.mark.slow
@pytest.mark.parametrize("case", ranks.CASES, ids=lambda c: f"{c[0]}-{'corr' if c[1] else 'nocorr'}-beta{c[2]}")
def test_two_ranks_make_the_single_process_update(single, two_ranks, case):
    for dtype in (torch.float32, torch.float64):
        # One micro-batch per rank: the all-reduce adds the same two gradients one process adds
        # (a + b, commutative), so weights, metrics and entropy are bit-for-bit those of one process.
        rank0, rank1 = (r[(case, dtype)] for r in two_ranks[8])
        reference = single[8][(case, dtype)]
        _assert_weights(rank0["weights"], reference["weights"], exact=True, dtype=dtype)
        _assert_weights(rank1["weights"], rank0["weights"], exact=True, dtype=dtype)  # ranks never drift apart
        assert rank0["metrics"] == reference["metrics"]
        if reference["entropy"] is not None:  # pi_old from the training forward: entropy gathered from both ranks
            assert torch.equal(rank0["entropy"], reference["entropy"])
        # Two micro-batches per rank: one process sums ((g0 + g1) + g2) + g3, the ranks (g0 + g1) + (g2 + g3).
        rank0, rank1 = (r[(case, dtype)] for r in two_ranks[4])
        _assert_weights(rank0["weights"], single[4][(case, dtype)]["weights"], exact=False, dtype=dtype)
        _assert_weights(rank1["weights"], rank0["weights"], exact=True, dtype=dtype)


def test_two_ranks_reproduce_entropy_control_clip_cov_and_token_budgets(tmp_path):
    """The entropy bonus's adaptive coefficient, Clip-Cov's random subset and token-budget
    micro-batches (one per rank, rows out of order; or one for two ranks, rank 1 running a stand-in) come out
    bit-for-bit as in one process."""
    reference = ranks.every_extra(None)
    rank0, rank1 = ranks.spawn(ranks.every_extra, 2, tmp_path)
    for name in ranks.EXTRA_CASES:
        _assert_weights(rank0[name]["weights"], reference[name]["weights"], exact=True, dtype=torch.float64)
        _assert_weights(rank1[name]["weights"], rank0[name]["weights"], exact=True, dtype=torch.float64)
        assert rank0[name]["metrics"] == reference[name]["metrics"], name
    coefs = [m["entropy/coef"] for m in reference["entropy_adaptive"]["metrics"]]
    assert len(set(coefs)) == 3, coefs  # the coefficient moved every step: its state was carried
    assert all(m["loss/cov_selected_frac"] > 0 for m in reference["clip_cov"]["metrics"])  # a random subset


def test_the_cases_move_the_weights_and_mask_tokens(single):
    """The equality above is not vacuous: every case changes the weights, and the corrections mask rows."""
    start = ranks.tiny_model(ranks.char_tokenizer(), size="nano", seed=0).state_dict()
    for case in ranks.CASES:
        trained = single[8][(case, torch.float32)]
        assert any(not torch.equal(start[k], v) for k, v in trained["weights"].items()), case
        if case[1]:
            assert trained["metrics"][0]["correction/geo_mask/masked_frac"] > 0, case


@pytest.mark.slow
@pytest.mark.parametrize("how", ["dies", "hangs"])
def test_a_failed_rank_is_a_named_error_within_the_time_limit(tmp_path, how):
    message, elapsed = ranks.spawn(ranks.peer_fails, 2, tmp_path, how, timeout_s=10.0)[0]
    assert message.startswith("learner rank 0 of 2: ") and "failed" in message
    assert "another learner rank died or stopped answering" in message and "grpoplus train --resume" in message
    assert elapsed < (5.0 if how == "dies" else 25.0)  # a dead peer at once; a silent one at the 10 s limit
