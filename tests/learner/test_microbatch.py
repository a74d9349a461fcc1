"""split_micro_batches: every row once, within the token budget, little padding, deterministic."""

import pytest
import torch

from grpoplus.learner.logprobs import response_logprobs
from grpoplus.learner.microbatch import padded_width, split_micro_batches
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer


def _segments(lengths: torch.Tensor) -> torch.Tensor:
    return lengths[:, None] if lengths.dim() == 1 else lengths


def _cost(lengths: torch.Tensor, plan: list[torch.Tensor]) -> int:
    """Tokens computed by the plan: rows x padded width, summed over micro-batches."""
    return sum(len(rows) * padded_width(_segments(lengths)[rows]) for rows in plan)


def _random_lengths(seed: int, n: int, segments: int | None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shape = (n,) if segments is None else (n, segments)
    return torch.randint(1, 60, shape, generator=gen)


@pytest.mark.parametrize("segments", [None, 2])
@pytest.mark.parametrize("budget", [60, 200, 1000])
def test_every_row_once_and_within_budget(segments, budget):
    for seed in range(5):
        lengths = _random_lengths(seed, 37, segments)
        plan = split_micro_batches(lengths, budget)
        assert torch.equal(torch.cat(plan).sort().values, torch.arange(37))
        for rows in plan:
            assert torch.equal(rows, rows.sort().values)
            width = padded_width(_segments(lengths)[rows])
            assert len(rows) * width <= budget or len(rows) == 1  # a row longer than the budget sits alone


def test_hand_worked_plan_has_no_padding():
    # Lengths 4, 8, 4, 8 and budget 16: the two 8s fill one micro-batch (2 x 8 = 16), the two
    # 4s another (2 x 4 = 8; a third row would not fit anyway). No padding column at all,
    # where the in-order split [4, 8], [4, 8] would pad each 4 to 8 (8 wasted tokens).
    lengths = torch.tensor([4, 8, 4, 8])
    plan = split_micro_batches(lengths, 16)
    assert [rows.tolist() for rows in plan] == [[1, 3], [0, 2]]
    assert _cost(lengths, plan) == int(lengths.sum())


def test_segments_are_padded_separately():
    # Row 0: prompt 10, response 1; row 1: prompt 1, response 10. Each has 11 tokens, but
    # together their width is 10 + 10 = 20 (left-padded prompts, right-padded responses):
    # 2 x 20 = 40 > 30, so they go apart.
    lengths = torch.tensor([[10, 1], [1, 10]])
    assert len(split_micro_batches(lengths, 30)) == 2
    assert len(split_micro_batches(lengths, 40)) == 1


@pytest.mark.parametrize("segments", [None, 2])
def test_less_padding_than_in_order_rows(segments):
    # The same number of rows per forward taken in data order (what a rows-only micro-batch
    # size does) computes more padding on mixed lengths.
    lengths = _random_lengths(0, 64, segments)
    plan = split_micro_batches(lengths, 8 * padded_width(_segments(lengths)))
    in_order = list(torch.arange(64).split(8))
    assert len(plan) <= len(in_order)
    assert _cost(lengths, plan) < _cost(lengths, in_order)


def test_deterministic_and_ties_in_row_order():
    # Sorted: 5 5 5 3 3 3 (rows 0 2 4 1 3 5). Budget 10: at most two 5s together, so three
    # micro-batches are needed; [5 5] [5] [3 3 3] computes 10 + 5 + 9 = 24 = every real token,
    # where a greedy fill [5 5] [5 3] [3 3] would pad a 3 to 5.
    lengths = torch.tensor([5, 3, 5, 3, 5, 3])
    first = split_micro_batches(lengths, 10)
    assert [rows.tolist() for rows in first] == [[0, 2], [4], [1, 3, 5]]
    again = split_micro_batches(lengths.clone(), 10)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="token_budget"):
        split_micro_batches(torch.tensor([3, 4]), 0)
    with pytest.raises(ValueError, match="non-negative"):
        split_micro_batches(torch.tensor([3, -1]), 10)
    assert split_micro_batches(torch.zeros(0, dtype=torch.long), 10) == []


def test_planned_micro_batches_give_the_whole_batch_logprobs():
    # Each micro-batch trims its own padding columns; the log-probs must not depend on the
    # neighbours a row is batched with.
    torch.manual_seed(0)
    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=3)
    n, P, T = 10, 7, 9
    prompt_len, response_len = torch.randint(1, P + 1, (n,)), torch.randint(0, T + 1, (n,))
    prompt_mask = (torch.arange(P)[None] >= P - prompt_len[:, None]).long()
    response_mask = (torch.arange(T)[None] < response_len[:, None]).float()
    prompt_ids = torch.randint(5, len(tok), (n, P)) * prompt_mask
    response_ids = torch.randint(5, len(tok), (n, T))
    with torch.no_grad():
        whole, _ = response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask)
        planned = torch.zeros_like(whole)
        for rows in split_micro_batches(torch.stack([prompt_len, response_len], 1), 24):
            planned[rows] = response_logprobs(model, prompt_ids[rows], prompt_mask[rows], response_ids[rows],
                                              response_mask[rows])[0]
    torch.testing.assert_close(planned, whole, atol=1e-5, rtol=0)
