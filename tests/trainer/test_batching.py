"""Per-step bookkeeping of collection: data order and the combination of sampling rounds."""

import torch

from grpoplus.data.order import PromptSampler
from grpoplus.metrics.step import reduce_metrics
from grpoplus.tasks.base import Example, is_correct, reward_fields


def test_reward_metrics_of_all_sampling_rounds_count():
    # Two dynamic-sampling rounds: 2 + 1 errors and 0 + 3 timeouts happened in the step;
    # a fraction averages, (0.25 + 0.75) / 2 = 0.5.
    rounds = [{"reward/errors": 2.0, "reward/timeouts": 0.0, "reward/math/none_frac": 0.25},
              {"reward/errors": 1.0, "reward/timeouts": 3.0, "reward/math/none_frac": 0.75}]
    assert reduce_metrics((r, 32.0) for r in rounds) == {"reward/errors": 3.0, "reward/timeouts": 3.0,
                                                         "reward/math/none_frac": 0.5}


def test_reward_fields_and_verdict():
    examples = [Example("1+1=", "2", {"numbers": [1]}), Example("2+2=", "4", {"numbers": [2]})]
    assert reward_fields(examples) == {"answer": ["2", "4"], "numbers": [[1], [2]]}
    assert [is_correct(s) for s in (1.0, 0.99, None, 0.0)] == [True, False, False, False]


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
