"""Trajectories token in, token out: the sampled ids exactly as sampled, observations appended after them,
and the masks the learner trains with (ALGORITHMS.md section 12)."""

import pytest
import torch

from grpoplus.envs import Trajectory, Turn, to_rollouts

PAD = 0


def _two_turns() -> Trajectory:
    # prompt [5 6]; turn 1 samples [7 8] and the environment answers [20 21 22]; turn 2 samples [9] and ends
    return Trajectory([5, 6], [Turn([7, 8], [-0.5, -0.25], [20, 21, 22], reward=0.0), Turn([9], [-1.0], reward=1.0)],
                      finished=True, text="x")


def test_a_trajectory_is_its_turns_ids_in_order_with_the_sampled_ones_marked():
    ids, sampled, logp = _two_turns().response()
    assert ids == [7, 8, 20, 21, 22, 9]  # nothing re-tokenized: the engine's ids, then the observation's
    assert sampled == [1, 1, 0, 0, 0, 1]
    assert logp == [-0.5, -0.25, 0.0, 0.0, 0.0, -1.0]
    assert _two_turns().turn_ends() == [1, 5]  # the last sampled id of each turn: the process estimator's step ends


def test_stacked_trajectories_pad_like_rollouts_and_keep_observations_out_of_the_loss():
    short = Trajectory([3], [Turn([4], [-0.1])], finished=False)  # cut by a limit after one turn
    r = to_rollouts([_two_turns(), short], group_ids=[0, 0], prompt_index=[11], pad_id=PAD, policy_version=2)
    assert r.prompt_ids.tolist() == [[5, 6], [PAD, 3]] and r.prompt_mask.tolist() == [[1, 1], [0, 1]]
    assert r.response_ids.tolist() == [[7, 8, 20, 21, 22, 9], [4, PAD, PAD, PAD, PAD, PAD]]
    assert r.response_mask.tolist() == [[1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]]  # observations are attended to
    assert r.model_mask.tolist() == [[1, 1, 0, 0, 0, 1], [1, 0, 0, 0, 0, 0]]
    assert torch.equal(r.sampled_mask, r.model_mask) and r.lengths.tolist() == [3, 1]  # |o_i|: sampled ids only
    assert r.logp_roll[0].tolist() == [-0.5, -0.25, 0.0, 0.0, 0.0, -1.0] and r.finished.tolist() == [True, False]
    assert r.prompt_index == [11] and r.policy_version == 2 and r.texts == ["x", ""]


def test_malformed_turns_are_refused_in_one_line():
    with pytest.raises(ValueError, match="2 sampled ids but 1 log-probs"):
        Turn([1, 2], [-0.1])
    with pytest.raises(ValueError, match="2 trajectories but 1 group ids"):
        to_rollouts([_two_turns(), _two_turns()], group_ids=[0], prompt_index=[0], pad_id=PAD)
