"""Learner preparation: scored groups -> :class:`TrainBatch`.

In the order of ALGORITHMS.md: the learner's forwards that must precede the update
(``logp_old`` and entropy when something needs them first, ``logp_ref`` when ``beta > 0``),
KL in the reward, advantages (over GFPO's kept responses), then the loss-mask filters
(overlong filtering, the high-entropy mask). Where ``pi_old`` comes from is decided once,
by the run's plan (:func:`grpoplus.plan.run.logp_old_mode`), and carried in the :class:`LearnerPlan`. For an MoE policy the
batch carries the routing its training forwards replay or are measured against
(:mod:`grpoplus.learner.replay`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from grpoplus import algo as A
from grpoplus.containers import Rollouts, ScoredGroups, TrainBatch
from grpoplus.learner.compiling import compiled_layers
from grpoplus.learner.hooks import ONE_PROCESS, UpdateHooks
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.learner.packing import packing_pays
from grpoplus.learner.precision import autocast
from grpoplus.learner.replay import LearnerRouting, check_replay_checkpointing, check_replay_source, input_mask
from grpoplus.models.device import compute_device
from grpoplus.models.lora import adapters_off
from grpoplus.models.routing import RoutingSpec
from grpoplus.models.vision import vision_of

LOGP_OLD_MODES = ("forward", "recompute", "rollout")


@dataclass(frozen=True, kw_only=True)
class LearnerPlan:
    """How the learner prepares and updates, decided once from the config."""

    temperature: float  # the sampling temperature: logp is taken under softmax(logits / temperature)
    micro_batch_size: int  # responses per forward/backward
    max_grad_norm: float
    logp_old: str  # one of LOGP_OLD_MODES
    micro_batch_tokens: int = 0  # > 0: micro-batches by (rows x padded width) token budget instead of row count
    routing_replay: str = "off"  # algo.routing_replay: off | r2 | r3
    routing_spec: RoutingSpec | None = None  # the policy's MoE routing shape; None for a dense policy
    seed: int = 0  # the run seed: with the optimizer step's index it seeds Clip-Cov's token subset
    reward_weights: tuple[tuple[str, float], ...] = ()  # (component, weight) of the reward pipeline, for GDPO
    reference_adapters_off: bool = False  # logp_ref from the policy with its LoRA adapters off (no reference copy)
    share_prompts: bool = True  # each distinct prompt of a forward computed once (grpoplus.learner.shared_prompt)
    gradient_checkpointing: bool = False  # decoder layers recomputed in backward (grpoplus.learner.activation_checkpointing)
    trim_every: int = 0  # > 0: freed memory goes back to the system every this many layers of the backward
    release_after_update: bool = False  # freed memory goes back to the system after each batch's update
    precision: str = "fp32"  # learner.precision: the forwards' autocast (grpoplus.learner.precision)
    sharded: bool = False  # learner.strategy=fsdp2 over several ranks: every rank runs as many forwards
    objective: str = "policy"  # policy: the algorithm's loss | sft: the demonstrations' negative log-likelihood
    packing: bool | str = False  # forwards' rows as one sequence without padding: True, or "auto" where that computes less
    compile: str = "off"  # off, or the torch.compile mode of the decoder layers (grpoplus.learner.compiling)
    packed_attention: str | None = None  # a packed forward's attention implementation (None: the model's own)

    def __post_init__(self):
        check_replay_source(self.routing_replay, self.logp_old)
        check_replay_checkpointing(self.routing_replay, self.gradient_checkpointing)
        if self.routing_replay != "off" and self.routing_spec is None:
            raise ValueError(f"routing_replay={self.routing_replay} needs an MoE policy (routing_spec), got None")

    @property
    def logp_old_from_forward(self) -> bool:
        return self.logp_old == "forward"


def forward_sharing(plan: LearnerPlan) -> bool | str:
    """How the learner's forwards share prompts: a sharded learner's run both passes whatever the rows ("always"),
    since every forward is a collective and its ranks see different rows."""
    return "always" if plan.sharded and plan.share_prompts else plan.share_prompts


def estimated_sharing(plan: LearnerPlan) -> bool:
    """Whether ``learner.packing=auto``'s estimate counts prompts as shared: ``learner.share_prompts`` on a dense policy
    (routing replay forwards every row whole); one process's answer, so every rank estimates alike (not
    :func:`forward_sharing`'s "always")."""
    return plan.share_prompts and plan.routing_spec is None


def decided_packing(model, rollouts: Rollouts, plan: LearnerPlan) -> LearnerPlan:
    """``plan`` with ``learner.packing=auto`` answered once for the batch's no-grad passes, from all its rows in the
    forwards one process would run (:func:`~grpoplus.learner.packing.packing_pays`): a sharded learner's ranks, each
    scoring its share of the rows, then run the same passes, and the same as one process."""
    if plan.packing != "auto":
        return plan
    n = len(rollouts.group_ids)
    forwards = list(torch.arange(n).split(plan.micro_batch_size or n))
    return replace(plan, packing=packing_pays(model, rollouts.prompt_ids, rollouts.prompt_mask,
                                              rollouts.response_mask, estimated_sharing(plan), forwards,
                                              plan.packed_attention))


@torch.no_grad()
def learner_logprobs(model, rollouts: Rollouts, plan: LearnerPlan, with_entropy: bool,
                     routing: LearnerRouting | None = None):
    """No-grad log-probs [N, T] (and entropy) of the rollouts under ``model``, returned on the CPU;
    ``routing`` replays or records the MoE routing of its forwards."""
    device = compute_device(model)
    with compiled_layers(model, plan.compile), autocast(plan.precision, device):
        logp, entropy = response_logprobs(model, rollouts.prompt_ids.to(device), rollouts.prompt_mask.to(device),
                                          rollouts.response_ids.to(device), rollouts.response_mask.to(device),
                                          temperature=plan.temperature, with_entropy=with_entropy,
                                          micro_batch_size=plan.micro_batch_size, routing=routing,
                                          share_prompts=forward_sharing(plan), packing=plan.packing,
                                          packed_attention=plan.packed_attention, **vision_of(rollouts.vision))
    return logp.cpu(), None if entropy is None else entropy.cpu()



def old_pass_routing(model, rollouts: Rollouts, plan: LearnerPlan) -> LearnerRouting | None:
    """The routing of the no-grad pass that computes logp_old: R3 replays the sampler's, R2 records
    the learner's own (to replay in the training forwards), off routes naturally (None)."""
    if plan.routing_replay == "off":
        return None
    device = compute_device(model)
    routing = None if rollouts.routing is None else rollouts.routing.to(device)
    return LearnerRouting(model, routing, input_mask(rollouts.prompt_mask, rollouts.response_mask).to(device),
                          replay=plan.routing_replay == "r3", record=plan.routing_replay == "r2")


def prepare(scored: ScoredGroups, model, ref_model, algo: A.AlgoConfig, plan: LearnerPlan, teacher=None,
            hooks: UpdateHooks = ONE_PROCESS) -> tuple[TrainBatch, torch.Tensor | None, dict[str, float]]:
    """Returns (batch, entropy [N, T] when measured here - None when the update measures it, metrics).
    ``teacher`` (grpoplus.teacher): on-policy distillation's, scoring the sampled tokens (section 11);
    ``hooks``: how the no-grad passes meet the other ranks (a sharded learner's ranks each score 1/N of the rows)."""
    r = scored.rollouts
    if plan.objective == "sft":
        return demonstration_batch(r), None, {}
    if plan.routing_replay == "r3" and r.routing is None:
        raise ValueError("algo.routing_replay=r3 replays the rollout engine's expert routing, but the engine returned "
                         "none: use rollout.engine=hf, or algo.routing_replay=r2")
    mask = r.sampled_mask.float()  # environment tokens of a multi-turn trajectory carry no loss
    logp_old = entropy = logp_ref = None
    plan = decided_packing(model, r, plan)
    routing = r.routing  # R3 replays it; off measures the learner's routing against it; R2 replaces it below
    if plan.logp_old == "recompute" or algo.entropy_mask_rho < 1.0:  # the entropy mask needs entropy first
        old_routing = old_pass_routing(model, r, plan)
        logp_old, entropy = hooks.score(lambda rows: learner_logprobs(model, rows, plan, with_entropy=True,
                                                                      routing=old_routing), r)
        if plan.routing_replay == "r2":  # the plan's logp_old_mode: R2 always has this pass
            routing = old_routing.natural
    if plan.logp_old == "rollout":
        logp_old = r.logp_roll.clone()
    if ref_model is not None:
        logp_ref, _ = hooks.score(lambda rows: learner_logprobs(ref_model, rows, plan, with_entropy=False), r)
    elif plan.reference_adapters_off:
        with adapters_off(model):
            logp_ref, _ = learner_logprobs(model, r, plan, with_entropy=False)
    rewards, metrics = scored.rewards, {}
    if logp_ref is not None and algo.kl_placement == "in_reward":  # logp_old is recomputed (the plan's logp_old_mode)
        rewards = A.kl_in_reward(rewards, logp_old, logp_ref, mask, algo.beta)
        metrics["reward/kl_penalty_mean"] = float((scored.rewards - rewards).mean())
    keep = kept_rows(scored, rewards, algo)
    advantages = _advantages(scored, rewards, keep, algo, plan)
    if teacher is not None:
        advantages, opd = teacher_advantages(teacher, r, advantages, logp_old, mask, algo, plan)
        metrics.update(opd)
    loss_mask = mask if keep is None else mask * keep.unsqueeze(1).float()
    if algo.overlong_filter:
        loss_mask = A.overlong_filter_mask(loss_mask, r.finished)
        metrics["filter/overlong_frac"] = float((~r.finished).float().mean())
    if algo.entropy_mask_rho < 1.0:
        loss_mask = A.high_entropy_mask(entropy, loss_mask, algo.entropy_mask_rho)
    metrics["filter/active_token_frac"] = float(loss_mask.sum() / mask.sum().clamp(min=1))
    batch = TrainBatch(r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask, loss_mask, advantages,
                       r.logp_roll, logp_old, logp_ref, r.group_ids, routing=routing, vision=r.vision)
    return batch, entropy, metrics


def kept_rows(scored: ScoredGroups, rewards: torch.Tensor, algo: A.AlgoConfig) -> torch.Tensor | None:
    """[N] bool rows that take part in the advantages and the loss, None for all: the scored ones (a response a
    reward failed on has no score), and of those GFPO's k best of each group. The others get advantage 0 and no
    loss tokens; they are not counted by a token or per-response mean, but stay in Dr. GRPO's constant N x L_max,
    as GFPO's and the overlong filter's dropped rows do."""
    keep = scored.scored
    if not algo.gfpo_keep:
        return keep
    r = scored.rollouts
    rows = torch.nonzero(scored.scored_mask).squeeze(1)
    selected = torch.zeros(len(rewards), dtype=torch.bool)
    selected[rows] = A.gfpo_select(rewards[rows], r.lengths[rows], r.group_ids[rows], algo.gfpo_keep, algo.gfpo_metric)
    return selected


def demonstration_batch(r: Rollouts) -> TrainBatch:
    """A supervised stage's batch: the loss on the demonstrated tokens (``sampled_mask``: observations masked out),
    no advantage, no pi_old (the objective has no ratio) and no reference."""
    n = len(r.group_ids)
    return TrainBatch(r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask, r.sampled_mask.float(),
                      torch.zeros(n), r.logp_roll, None, None, r.group_ids, vision=r.vision)


def teacher_advantages(teacher, r: Rollouts, advantages: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor,
                       algo: A.AlgoConfig, plan: LearnerPlan) -> tuple[torch.Tensor, dict[str, float]]:
    """The teacher's log-probs of the sampled tokens: the opd token advantage when ``algo.lambda_opd > 0``
    (section 11; [N] outcome advantages become [N, T]), and the ``opd/*`` metrics in any case."""
    with autocast(plan.precision, getattr(teacher, "device", "cpu")):
        logp_teacher, top1 = teacher.token_logprobs(r)
    metrics = A.opd_metrics(logp_old, logp_teacher, mask, top1)
    if algo.lambda_opd > 0:
        advantages = A.opd_advantages(advantages, logp_old, logp_teacher, mask, algo.lambda_opd,
                                      algo.opd_outcome).float()
    return advantages, metrics


def turn_advantages(r, rewards: torch.Tensor, keep: torch.Tensor | None, algo: A.AlgoConfig,
                    scored: torch.Tensor | None = None) -> torch.Tensor:
    """[N, T] turn-level advantages (``algo.turn_credit``): each turn's environment reward is a step reward ending at
    its last sampled token, and the rest of the trajectory's reward (the reward functions' score of the transcript,
    a KL penalty in the reward) is added to the last turn's (ALGORITHMS.md section 12). ``scored`` [N] bool: only
    those rows enter the group statistics (the others get 0)."""
    if r.turn_rewards is None:
        raise ValueError(f"algo.turn_credit={algo.turn_credit} needs step rewards: multi-turn rollouts (data.env or "
                         "data.tools) or a process reward model's (data.prm); or set algo.turn_credit=off")
    rest = (rewards - r.env_returns).tolist()
    steps = [[0.0 if x is None else x for x in turn] for turn in r.turn_rewards]
    for i, turn in enumerate(steps):
        if turn:
            turn[-1] += rest[i]
    T = r.response_ids.shape[1]
    rows = torch.arange(len(steps)) if scored is None else torch.nonzero(scored).squeeze(1)
    picked = [steps[i] for i in rows.tolist()], [r.turn_ends[i] for i in rows.tolist()], r.group_ids[rows]
    if algo.turn_credit == "process":
        part = A.process_advantages(*picked, T, eps=algo.adv_eps)
    else:
        part = A.return_to_go_advantages(*picked, T)
    adv = torch.zeros(len(steps), T, dtype=part.dtype)
    adv[rows] = part
    return adv if keep is None else adv * keep[:, None].float()


def _advantages(scored: ScoredGroups, rewards: torch.Tensor, keep: torch.Tensor | None, algo: A.AlgoConfig,
                plan: LearnerPlan) -> torch.Tensor:
    """[N], or [N, T] with token whitening (``adv_whiten=token``). ``reward_aggregation=gdpo``:
    every reward component of the pipeline is a column (None -> 0), weighted as in the pipeline."""
    r = scored.rollouts
    if algo.turn_credit != "off":
        return turn_advantages(r, rewards, keep, algo, scored.scored)
    token_mask = r.sampled_mask if algo.adv_whiten == "token" else None
    if algo.reward_aggregation != "gdpo":
        return A.compute_advantages(rewards, r.group_ids, estimator=algo.adv_estimator, eps=algo.adv_eps,
                                    keep=keep, token_mask=token_mask)
    if not plan.reward_weights:
        raise ValueError("reward_aggregation='gdpo' needs the reward components' weights (LearnerPlan.reward_weights)")
    names = [name for name, _ in plan.reward_weights]
    components = torch.tensor([[0.0 if v is None else float(v) for v in scored.components[name]] for name in names],
                              dtype=torch.float64).T  # [N, K]
    return A.compute_advantages_multi(components, r.group_ids, [w for _, w in plan.reward_weights],
                                      estimator=algo.adv_estimator, eps=algo.adv_eps, keep=keep,
                                      token_mask=token_mask).float()
