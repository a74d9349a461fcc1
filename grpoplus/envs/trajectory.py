"""Multi-turn trajectories, token in and token out (ALGORITHMS.md section 12).

A trajectory is its prompt's ids, then turns: the ids the engine sampled (kept exactly as sampled,
never decoded and re-tokenized) and the ids of what the environment answered, appended after them
(the last turn may have none). :func:`to_rollouts` stacks trajectories into the learner's
:class:`~grpoplus.containers.Rollouts`: the response is every turn's sampled ids and observation ids
in order; ``response_mask`` covers both (the policy attends to the observations), ``model_mask``
only the sampled ids (the only tokens with loss, ``logp_roll`` and entropy; 0 on observations).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grpoplus.containers import Rollouts
from grpoplus.models.vision import VisionInputs


@dataclass
class Turn:
    """One turn: the policy's sampled ids with their sampler log-probs, then the environment's answer."""

    sampled: list[int]
    logp: list[float]  # the sampler's log-prob of each sampled id
    observation: list[int] = field(default_factory=list)  # ids appended after the turn (empty: none)
    reward: float | None = None  # the environment's reward for this turn, if it gives one
    by_tool: bool = False  # the observation is tool results (role "tool"), not the environment's own text
    shown: VisionInputs | None = None  # a vision-language policy's: the observation's processor outputs

    def __post_init__(self):
        if len(self.sampled) != len(self.logp):
            raise ValueError(f"a turn has {len(self.sampled)} sampled ids but {len(self.logp)} log-probs")


@dataclass
class Trajectory:
    """A prompt and its turns; ``finished``: ended by the environment (False: by a turn or token limit)."""

    prompt: list[int]
    turns: list[Turn]
    finished: bool
    text: str = ""  # the transcript the reward functions read
    reason: str | None = None  # why it ended (grpoplus.envs.episodes.REASONS)
    vision: VisionInputs | None = None  # a vision-language policy's: its prompt's and response's processor outputs

    def response(self) -> tuple[list[int], list[int], list[float]]:
        """(ids, 1 where the policy sampled the id else 0, sampler log-prob or 0) of every turn in order."""
        ids, sampled, logp = [], [], []
        for turn in self.turns:
            ids += turn.sampled + turn.observation
            sampled += [1] * len(turn.sampled) + [0] * len(turn.observation)
            logp += turn.logp + [0.0] * len(turn.observation)
        return ids, sampled, logp

    def observation_sources(self) -> list[str]:
        """``"tool"`` or ``"env"`` for each turn's observation, in order (turns without one skipped)."""
        return ["tool" if turn.by_tool else "env" for turn in self.turns if turn.observation]

    def turn_ends(self) -> list[int]:
        """Response index of each turn's last sampled id (the step ends of the ``process`` estimator); a turn
        that sampled nothing has no end."""
        ends, at = [], 0
        for turn in self.turns:
            if turn.sampled:
                ends.append(at + len(turn.sampled) - 1)
            at += len(turn.sampled) + len(turn.observation)
        return ends


def to_rollouts(trajectories: list[Trajectory], group_ids: list[int], prompt_index: list[int], pad_id: int,
                policy_version: int = 0) -> Rollouts:
    """Stack trajectories (groups contiguous, as ``group_ids`` says): prompts left-padded, responses
    right-padded, with the mask of the sampled tokens (``Rollouts.model_mask``)."""
    if len(trajectories) != len(group_ids):
        raise ValueError(f"{len(trajectories)} trajectories but {len(group_ids)} group ids")
    responses = [t.response() for t in trajectories]
    width_p = max(len(t.prompt) for t in trajectories)
    width_t = max(1, max(len(ids) for ids, _, _ in responses))
    n = len(trajectories)
    prompt_ids = torch.full((n, width_p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros(n, width_p, dtype=torch.long)
    response_ids = torch.full((n, width_t), pad_id, dtype=torch.long)
    response_mask, model_mask, logp_roll = (torch.zeros(n, width_t) for _ in range(3))
    for i, (t, (ids, sampled, logp)) in enumerate(zip(trajectories, responses)):
        if t.prompt:
            prompt_ids[i, width_p - len(t.prompt):] = torch.tensor(t.prompt)
            prompt_mask[i, width_p - len(t.prompt):] = 1
        if ids:
            response_ids[i, :len(ids)] = torch.tensor(ids)
            response_mask[i, :len(ids)] = 1.0
            model_mask[i, :len(ids)] = torch.tensor(sampled, dtype=torch.float32)
            logp_roll[i, :len(ids)] = torch.tensor(logp, dtype=torch.float32)
    return Rollouts(prompt_ids, prompt_mask, response_ids, response_mask, logp_roll,
                    torch.tensor([t.finished for t in trajectories]), torch.tensor(group_ids, dtype=torch.long),
                    [t.text for t in trajectories], list(prompt_index), policy_version=policy_version,
                    model_mask=model_mask, turn_rewards=[[t.reward for t in tr.turns if t.sampled] for tr in trajectories],
                    turn_ends=[tr.turn_ends() for tr in trajectories],
                    observation_sources=[tr.observation_sources() for tr in trajectories],
                    end_reasons=None if any(t.reason is None for t in trajectories) else [t.reason for t in trajectories],
                    vision=None if all(t.vision is None for t in trajectories) else
                    [t.vision or VisionInputs() for t in trajectories])
