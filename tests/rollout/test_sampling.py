"""draw_from: the inverse-CDF draw follows the given probabilities and never picks a zero."""

import torch

from grpoplus.rollout.sampling import draw_from


def test_frequencies_match_probabilities_and_zeros_are_never_drawn():
    probs = torch.tensor([[0.5, 0.0, 0.2, 0.3, 0.0],
                          [0.0, 0.0, 0.0, 0.0, 1.0]])
    draws = 40_000
    gen = torch.Generator().manual_seed(0)
    picks = draw_from(probs.repeat(draws, 1), gen).view(draws, 2)  # [draws, 2]
    freq = torch.stack([torch.bincount(picks[:, r], minlength=5) for r in range(2)]).double() / draws
    # Standard error of a frequency p is sqrt(p (1 - p) / draws) <= 0.0025; 5 of them is 0.0125.
    torch.testing.assert_close(freq, probs.double(), atol=0.0125, rtol=0)
    assert freq[0, 1] == 0 and freq[0, 4] == 0 and (picks[:, 1] == 4).all()


def test_unnormalised_rows_and_the_generator():
    # Rows need not sum to 1 (the cumulative sum's last entry scales the uniform draw), and
    # the same generator state gives the same draws.
    probs = torch.tensor([[2.0, 0.0, 6.0]]).repeat(20_000, 1)
    picks = draw_from(probs, torch.Generator().manual_seed(1))
    assert abs((picks == 2).double().mean().item() - 0.75) < 0.015 and not (picks == 1).any()
    assert torch.equal(picks, draw_from(probs, torch.Generator().manual_seed(1)))
