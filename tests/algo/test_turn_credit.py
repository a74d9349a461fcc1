"""Turn-level credit (ALGORITHMS.md sections 1 and 12): the return-to-go estimator worked by hand, the length bias
of the process estimator when the policy decides when to stop (verl RFC #7244), and the learner's use of both."""

import pytest
import torch

from grpoplus import algo as A
from grpoplus.config import build_config
from grpoplus.containers import ScoredGroups
from grpoplus.envs.trajectory import Trajectory, Turn, to_rollouts
from grpoplus.learner.prepare import turn_advantages


def test_return_to_go_by_hand():
    # one group: trajectory 0 has turns ending at tokens 1 and 3 with rewards -0.1 and 1.0 (return 0.9);
    # trajectory 1 one turn ending at token 0 with reward 0.1. Group mean whole return = (0.9 + 0.1) / 2 = 0.5
    adv = A.return_to_go_advantages([[-0.1, 1.0], [0.1]], [[1, 3], [0]], torch.tensor([0, 0]), T=4)
    # row 0: G = 0.9 on tokens 0-1, 1.0 on tokens 2-3 -> minus 0.5; row 1: G = 0.1 on token 0, 0 after -> minus 0.5
    assert torch.allclose(adv, torch.tensor([[0.4, 0.4, 0.5, 0.5], [-0.4, -0.5, -0.5, -0.5]]))


def test_an_extra_turn_costs_nothing_under_return_to_go_but_shifts_process_advantages():
    # the same outcome (return 1) in two turns or three: the first token should get the same credit
    steps, ends, groups = [[0.0, 1.0], [0.0, 0.0, 1.0]], [[0, 1], [0, 1, 2]], torch.tensor([0, 0])
    rtg = A.return_to_go_advantages(steps, ends, groups, T=3)
    assert rtg[0, 0] == rtg[1, 0] == 0.0
    process = A.process_advantages(steps, ends, groups, T=3)
    # pooled steps {0, 1, 0, 0, 1}: mean 0.4, so the three-turn trajectory subtracts one more mean than the two-turn
    # one: its first token is pushed down (a mean step reward > 0 punishes a turn; < 0 would reward one)
    assert process[1, 0] < process[0, 0]
    std = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0]).std()
    assert torch.isclose(process[0, 0] - process[1, 0], 0.4 / (std + 1e-6))


def _scored():
    t = [Trajectory([1], [Turn([5, 6], [-0.1, -0.1], [9, 9], reward=-0.1), Turn([7], [-0.2], reward=0.0)], True),
         Trajectory([1], [Turn([5], [-0.3], reward=0.5)], True)]
    r = to_rollouts(t, [0, 0], [0], pad_id=0)
    # rewards = env return + the reward functions' 1.0 on trajectory 0, 0.0 on 1
    return ScoredGroups(r, r.env_returns + torch.tensor([1.0, 0.0]), torch.tensor([True, False]), {})


@pytest.mark.parametrize("credit", ["process", "return_to_go"])
def test_the_learner_gives_the_transcripts_reward_to_the_last_turn(credit):
    scored = _scored()
    algo = A.AlgoConfig(turn_credit=credit)
    adv = turn_advantages(scored.rollouts, scored.rewards, None, algo)
    steps, ends = [[-0.1, 1.0], [0.5]], [[1, 4], [0]]  # trajectory 0: turn 2 ends at response index 4 (after 2 obs)
    fn = A.process_advantages if credit == "process" else A.return_to_go_advantages
    assert torch.allclose(adv, fn(steps, ends, scored.rollouts.group_ids, 5))


def test_turn_credit_needs_a_multi_turn_run():
    with pytest.raises(ValueError, match="turn_credit=process gives credit turn by turn, but this run is single-turn"):
        build_config(overrides=["turn_credit=process"])
    assert build_config(overrides=["task=guess", "turn_credit=return_to_go"]).algo.turn_credit == "return_to_go"
