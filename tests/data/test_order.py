"""The data order: every training prompt once per epoch, in an order its seed fixes, resumed from two ints."""

import torch

from grpoplus.data.order import PromptSampler


def test_prompt_sampler_visits_every_prompt_each_epoch_and_resumes():
    sampler = PromptSampler(5, seed=3)
    first = sampler.next(5)
    assert sorted(first) == [0, 1, 2, 3, 4]
    state = sampler.state()
    ahead = sampler.next(7)
    again = PromptSampler(5, seed=3)
    again.load(state)
    assert again.next(7) == ahead
    assert torch.tensor(ahead[:5]).sort().values.tolist() == [0, 1, 2, 3, 4]
