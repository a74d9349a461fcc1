"""The typed hand-offs of one training step, in the order the data flows:

    prompts -> Rollouts -> ScoredGroups -> Collected -> TrainBatch -> UpdateResult

Every stage imports its input and output types from here and from nowhere else, so a
stage can move to another process (a rollout worker, a learner rank) without dragging
the others along. Tensors live on the CPU; the learner moves what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from grpoplus.models.routing import pad_routing


@dataclass(frozen=True)
class SamplingParams:
    n: int = 8  # responses per prompt (the group size G)
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    greedy: bool = False  # temperature 0: argmax decoding, logp_roll of the argmax token at temperature 1
    seed: int | None = None  # engines without a torch.Generator (vLLM) seed their sampler with this


@dataclass
class Rollouts:
    """G responses for each of B prompts; N = B * G rows, groups contiguous. Tensors on the CPU.

    Prompts are left-padded to P columns, responses right-padded to T columns, so that
    ``torch.cat([prompt_ids, response_ids], 1)`` is the learner's input.
    """

    prompt_ids: torch.Tensor  # [N, P] long, left-padded with the pad id
    prompt_mask: torch.Tensor  # [N, P] long, 1 on real prompt tokens
    response_ids: torch.Tensor  # [N, T] long, right-padded with the pad id
    response_mask: torch.Tensor  # [N, T] float, 1 on sampled tokens (EOS included when sampled)
    logp_roll: torch.Tensor  # [N, T] float32, sampler log-prob of each sampled token (0 on padding)
    finished: torch.Tensor  # [N] bool, True when the response ended with EOS (False: cut by the length limit)
    group_ids: torch.Tensor  # [N] long, index of the prompt in this batch
    texts: list[str]  # [N] decoded responses (special tokens stripped)
    prompt_index: list[int]  # [B] caller-given ids of the prompts (e.g. data positions)
    policy_version: int = 0  # learner version whose weights sampled these rows (optimizer steps so far)
    routing: torch.Tensor | None = None  # [N, P + T, L, k] int16: the sampler's MoE experts (-1 = padding), or None
    # [N, T] float, 1 on the tokens the policy sampled, 0 on environment tokens (observations and tool results of a
    # multi-turn trajectory: in response_mask, so attended to, but with no loss, no logp_roll (0) and no entropy);
    # None: every response token was sampled (single turn)
    model_mask: torch.Tensor | None = None
    # multi-turn trajectories (grpoplus.envs): per row, the environment's reward of each turn (None: it gave none)
    # and the response index of each turn's last sampled token (the process estimator's step ends); None: one turn
    turn_rewards: list[list[float | None]] | None = None
    turn_ends: list[list[int]] | None = None
    # multi-turn trajectories: why each ended (grpoplus.envs.episodes.REASONS: done, max_turns, length, context,
    # error, timeout, malformed); None: single turn (``finished`` says stop or length)
    end_reasons: list[str] | None = None
    # multi-turn trajectories: per row, "tool" or "env" for each observation (each run of model_mask 0s) in order:
    # a tool's result or the environment's own text (read by the traces); None: single turn
    observation_sources: list[list[str]] | None = None
    # a vision-language policy's rows: per row, its prompt's processor outputs beyond the ids (pixels, per-token
    # image marks: grpoplus.models.vision.VisionInputs, one object shared by a group's rows); None: text prompts
    vision: list | None = None

    @property
    def env_returns(self) -> torch.Tensor | None:  # [N] float32
        """The environment's return of each trajectory (the sum of its turn rewards); None for single-turn rows."""
        if self.turn_rewards is None:
            return None
        return torch.tensor([sum(r for r in turn if r is not None) for turn in self.turn_rewards], dtype=torch.float32)

    @property
    def lengths(self) -> torch.Tensor:  # [N] long
        """|o_i|: the tokens the policy sampled (a multi-turn trajectory's observations not counted, ALGORITHMS.md
        section 12)."""
        return self.sampled_mask.sum(1).long()

    def response_lists(self) -> list[list[int]]:
        """Each row's response token ids, unpadded (responses are right-padded: the first ``response_mask``-many
        columns), observation tokens of a multi-turn row included."""
        lengths = self.response_mask.sum(1).long().tolist()
        return [row[:n].tolist() for row, n in zip(self.response_ids, lengths)]

    @property
    def sampled_mask(self) -> torch.Tensor:  # [N, T] float
        """1 on the tokens the policy sampled: the only ones that carry loss, log-probs and entropy."""
        return self.response_mask if self.model_mask is None else self.model_mask

    def select(self, rows: torch.Tensor) -> "Rollouts":
        """The given row indices (whole groups expected), group ids renumbered 0..B'-1."""
        rows = rows.long()
        uniq, new_groups = torch.unique(self.group_ids[rows], return_inverse=True)
        return Rollouts(
            prompt_ids=self.prompt_ids[rows], prompt_mask=self.prompt_mask[rows],
            response_ids=self.response_ids[rows], response_mask=self.response_mask[rows],
            logp_roll=self.logp_roll[rows], finished=self.finished[rows], group_ids=new_groups,
            texts=[self.texts[i] for i in rows.tolist()], prompt_index=[self.prompt_index[g] for g in uniq.tolist()],
            policy_version=self.policy_version, routing=None if self.routing is None else self.routing[rows],
            model_mask=None if self.model_mask is None else self.model_mask[rows],
            turn_rewards=_pick(self.turn_rewards, rows), turn_ends=_pick(self.turn_ends, rows),
            end_reasons=_pick(self.end_reasons, rows), observation_sources=_pick(self.observation_sources, rows),
            vision=_pick(self.vision, rows))

    @staticmethod
    def concat(parts: list["Rollouts"], pad_id: int) -> "Rollouts":
        """Stack several rollout batches (e.g. dynamic-sampling rounds): prompts re-left-padded,
        responses re-right-padded to the widest part, group ids offset so groups stay distinct.
        The result carries the oldest policy version of its parts."""
        if len(parts) == 1:
            return parts[0]
        width_p = max(p.prompt_ids.shape[1] for p in parts)
        width_t = max(p.response_ids.shape[1] for p in parts)
        offsets = torch.tensor([0] + [len(p.prompt_index) for p in parts[:-1]]).cumsum(0).tolist()
        return Rollouts(
            prompt_ids=torch.cat([_pad(p.prompt_ids, width_p, pad_id, left=True) for p in parts]),
            prompt_mask=torch.cat([_pad(p.prompt_mask, width_p, 0, left=True) for p in parts]),
            response_ids=torch.cat([_pad(p.response_ids, width_t, pad_id) for p in parts]),
            response_mask=torch.cat([_pad(p.response_mask, width_t, 0.0) for p in parts]),
            logp_roll=torch.cat([_pad(p.logp_roll, width_t, 0.0) for p in parts]),
            finished=torch.cat([p.finished for p in parts]),
            group_ids=torch.cat([p.group_ids + off for p, off in zip(parts, offsets)]),
            texts=[t for p in parts for t in p.texts],
            prompt_index=[i for p in parts for i in p.prompt_index],
            policy_version=min(p.policy_version for p in parts),
            routing=_concat_routing(parts, width_p, width_t),
            model_mask=None if all(p.model_mask is None for p in parts) else
            torch.cat([_pad(p.sampled_mask, width_t, 0.0) for p in parts]),
            turn_rewards=_joined(parts, "turn_rewards"), turn_ends=_joined(parts, "turn_ends"),
            end_reasons=_joined(parts, "end_reasons"), observation_sources=_joined(parts, "observation_sources"),
            vision=_joined(parts, "vision"),
        )


def _pick(values: list | None, rows: torch.Tensor) -> list | None:
    return None if values is None else [values[i] for i in rows.tolist()]


def _joined(parts: list[Rollouts], name: str) -> list | None:
    """A per-row list field of every part, concatenated (None unless every part has it)."""
    values = [getattr(p, name) for p in parts]
    return None if any(v is None for v in values) else [x for v in values for x in v]


def _pad(x: torch.Tensor, width: int, value, left: bool = False) -> torch.Tensor:
    """Pad dim 1 of ``x`` to ``width`` on the left or the right."""
    extra = width - x.shape[1]
    return torch.nn.functional.pad(x, (extra, 0) if left else (0, extra), value=value)


def _concat_routing(parts: list[Rollouts], width_p: int, width_t: int) -> torch.Tensor | None:
    """The parts' routings re-padded like their prompts and responses (NATURAL on the new padding)."""
    if any(p.routing is None for p in parts):
        return None
    return torch.cat([pad_routing(p.routing, p.prompt_ids.shape[1], width_p, width_t) for p in parts])


@dataclass
class ScoredGroups:
    """Rollouts with their rewards: ``rewards`` is the trained reward, the weighted sum of every
    reward component (shaping such as the soft overlong punishment included). A response a reward
    failed on (raised, timed out, NaN) has no score: ``scored`` False, its reward a 0 placeholder;
    it is left out of its group's statistics and of the loss."""

    rollouts: Rollouts
    rewards: torch.Tensor  # [N] float32 total reward
    correct: torch.Tensor  # [N] bool, the task verifier's verdict
    components: dict[str, list]  # name -> [N] per-component rewards (None = does not apply, or failed)
    scored: torch.Tensor | None = None  # [N] bool, False where a reward failed; None: every response scored

    @property
    def scored_mask(self) -> torch.Tensor:  # [N] bool
        return torch.ones(len(self.rewards), dtype=torch.bool) if self.scored is None else self.scored

    def select(self, rows: torch.Tensor) -> "ScoredGroups":
        idx = rows.tolist()
        return ScoredGroups(self.rollouts.select(rows), self.rewards[rows], self.correct[rows],
                            {k: [v[i] for i in idx] for k, v in self.components.items()},
                            None if self.scored is None else self.scored[rows])

    @staticmethod
    def concat(parts: list["ScoredGroups"], pad_id: int) -> "ScoredGroups":
        if len(parts) == 1:
            return parts[0]
        scored = None if all(p.scored is None for p in parts) else torch.cat([p.scored_mask for p in parts])
        return ScoredGroups(Rollouts.concat([p.rollouts for p in parts], pad_id),
                            torch.cat([p.rewards for p in parts]), torch.cat([p.correct for p in parts]),
                            {k: [v for p in parts for v in p.components[k]] for k in parts[0].components}, scored)

    @property
    def num_groups(self) -> int:
        return len(self.rollouts.prompt_index)


@dataclass
class Collected:
    """What collection hands to the learner: the groups to train on, and every group drawn."""

    batch: ScoredGroups | None  # the groups to train on; None when every drawn group was filtered out
    drawn: list[ScoredGroups]  # every sampling round of the step, for the step's metrics
    metrics: dict[str, float]  # reward pipeline, sampling and timing metrics of the collection
    sampled: bool = True  # False: demonstrations (a supervised stage), whose rewards and lengths say nothing


@dataclass
class TrainBatch:
    """Everything the learner's update needs for one rollout batch (N responses)."""

    prompt_ids: torch.Tensor  # [N, P]
    prompt_mask: torch.Tensor  # [N, P]
    response_ids: torch.Tensor  # [N, T]
    response_mask: torch.Tensor  # [N, T] tokens present (attention)
    loss_mask: torch.Tensor  # [N, T] tokens that carry loss (after filters)
    advantages: torch.Tensor  # [N] or [N, T]
    logp_roll: torch.Tensor  # [N, T]
    logp_old: torch.Tensor | None  # [N, T]; None exactly when the plan takes pi_old from the training forward
    logp_ref: torch.Tensor | None  # [N, T]
    group_ids: torch.Tensor  # [N]
    routing: torch.Tensor | None = None  # [N, P + T, L, k] MoE experts: replayed (R2, R3) or measured against (off)
    vision: list | None = None  # [N] a vision-language policy's rows: their images (Rollouts.vision)

    def rows(self, idx: torch.Tensor) -> "TrainBatch":
        picked = self._map(lambda x: x[idx.to(x.device)])
        picked.vision = None if self.vision is None else [self.vision[i] for i in idx.tolist()]
        return picked

    def to(self, device: torch.device) -> "TrainBatch":
        return self._map(lambda x: x.to(device))

    def _map(self, fn) -> "TrainBatch":
        return TrainBatch(**{f.name: None if (x := getattr(self, f.name)) is None else x if isinstance(x, list) else
                             fn(x) for f in fields(self)})


@dataclass
class LearnerTrace:
    """What the learner made of each row of a batch, for the run's traces (grpoplus.metrics.traces)."""

    advantages: torch.Tensor  # [N] or [N, T], as the loss took them
    loss_mask: torch.Tensor  # [N, T] the tokens that carried loss (after the filters)
    logp: torch.Tensor | None  # [N, T] the learner's pi_old log-probs of the sampled tokens; None: it computed none
    # (learner.logp_old=rollout takes the sampler's)


@dataclass
class UpdateResult:
    """What the update reports: metrics of every optimizer step, reduced, the entropy it measured, and (from the
    learner) what it made of each row."""

    metrics: dict[str, float]
    entropy: torch.Tensor | None  # [N, T] token entropy, when the training forward measured it
    logp: torch.Tensor | None = None  # [N, T] pi_old log-probs, when the training forward is pi_old (logp_old=forward)
    trace: LearnerTrace | None = None
