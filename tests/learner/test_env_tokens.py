"""Environment tokens of a multi-turn trajectory (``Rollouts.model_mask`` 0): attended to, never in the loss.

Every learner path (chunked head, shared prompts, activation checkpointing, token-budget micro-batches,
token whitening, KL to a reference, rollout corrections, LoRA, MoE routing replay, bf16, packed micro-batches) is run on a batch
whose responses are turn 1 (sampled), an observation (environment tokens), turn 2 (sampled):

- the loss mask of every micro-batch is 0 on the observation and 1 on the sampled tokens;
- with pi_old taken from the sampler, changing the observation's logp_roll (which the engine leaves 0 and a
  leak would read) changes nothing: the weights after the update are bit-for-bit the same;
- changing the observation's tokens changes the update: later turns attend to them.
"""

import copy
import importlib.util

import pytest
import torch

import grpoplus.learner.update as update_module
from grpoplus.assemble.factories import build_lora
from grpoplus.assemble.learner import build_learner_parts, build_learner_plan
from grpoplus.config import build_config
from grpoplus.containers import Rollouts, ScoredGroups
from grpoplus.distributed.learner import learn_step
from grpoplus.models.tiny import tiny_model, tiny_moe_model
from grpoplus.plan import resolve
from grpoplus.teacher.local import LocalTeacher

N, P, T = 8, 4, 9
OBSERVATION = slice(3, 6)  # response columns 0-2: turn 1, 3-5: the environment's answer, 6-8: turn 2
BASE = ["micro_batch_size=4", "num_minibatches=2", "max_new_tokens=9", "logp_old=rollout"]
PATHS = {
    "chunked head, shared prompts": [],
    "no shared prompts": ["share_prompts=false"],
    "activation checkpointing": ["gradient_checkpointing=true"],
    "token-budget micro-batches": ["micro_batch_tokens=40"],
    "token whitening": ["adv_estimator=reinforce_pp", "adv_whiten=token"],
    "KL to the reference in the loss": ["beta=0.05"],
    "token-level correction": ["corrections=[tis_token]"],
    "LoRA": ["lora_rank=4", "lora_dropout=0"],  # dropout would make two runs differ by themselves
    "bf16_mixed": ["precision=bf16_mixed"],
    "MoE, routing replay r2": ["routing_replay=r2", "logp_old=auto"],
    "packed micro-batches, token budget": ["packing=on", "micro_batch_tokens=40"],
    "packed, MoE routing replay r2": ["packing=on", "routing_replay=r2", "logp_old=auto"],
    "packed, LoRA": ["packing=on", "lora_rank=4", "lora_dropout=0"],
    "teacher: opd advantage and reverse_kl loss": ["teacher=nano-seed-1", "lambda_opd=1.0", "distill_loss=reverse_kl"],
    "teacher in bf16_mixed": ["teacher=nano-seed-1", "lambda_opd=1.0", "distill_loss=gjsd", "precision=bf16_mixed"],
}


def _scored(tok, observation_ids=None, observation_logp=0.0) -> ScoredGroups:
    gen = torch.Generator().manual_seed(0)
    vocab = len(tok)
    prompts = torch.randint(5, vocab, (N // 4, P), generator=gen).repeat_interleave(4, 0)  # groups of 4 share one
    response_ids = torch.randint(5, vocab, (N, T), generator=gen)
    response_mask = torch.ones(N, T)
    response_mask[::3, 7:] = 0  # some second turns end early
    model_mask = response_mask.clone()
    model_mask[:, OBSERVATION] = 0
    if observation_ids is not None:
        response_ids[:, OBSERVATION] = observation_ids
    logp_roll = -torch.rand(N, T, generator=gen) * model_mask
    logp_roll[:, OBSERVATION] = observation_logp
    rollouts = Rollouts(prompts, torch.ones(N, P, dtype=torch.long), response_ids * response_mask.long(),
                        response_mask, logp_roll, torch.ones(N, dtype=torch.bool), torch.arange(N) // 4,
                        [""] * N, [0, 1], model_mask=model_mask)
    rewards = torch.randn(N, generator=gen)
    return ScoredGroups(rollouts, rewards, rewards > 0, {})


def _update(tok, overrides, scored, masks=None):
    """Weights after one batch's update of a fresh policy, recording every micro-batch's loss mask."""
    cfg = build_config("grpo", overrides=[*BASE, *overrides])
    moe = cfg.algo.routing_replay != "off"
    model = (tiny_moe_model if moe else tiny_model)(tok, size="moe" if moe else "nano", seed=0)
    torch.manual_seed(0)  # LoRA's initial A matrices
    model = build_lora(resolve(cfg).lora, model)
    teacher, cfg.learner.teacher = cfg.learner.teacher, None  # a teacher is handed in, not loaded from a path
    parts, plan = build_learner_parts(resolve(cfg).learner, model), build_learner_plan(resolve(cfg).learner, model)
    if teacher is not None:
        parts.teacher = LocalTeacher(tiny_model(tok, size="nano", seed=1))
    learn_step(parts, copy.deepcopy(scored), 1, cfg.algo, plan)
    return {k: v.detach().clone() for k, v in parts.model.state_dict().items()}


def _recording(monkeypatch) -> list:
    masks = []
    policy_loss = update_module.policy_loss

    def recorded(logp, logp_old, advantages, loss_mask, *args, **kwargs):
        masks.append(loss_mask.detach().clone())
        return policy_loss(logp, logp_old, advantages, loss_mask, *args, **kwargs)

    monkeypatch.setattr(update_module, "policy_loss", recorded)
    return masks


@pytest.mark.parametrize("path", [pytest.param(name, marks=pytest.mark.skipif(
    "LoRA" in name and importlib.util.find_spec("peft") is None, reason="LoRA needs peft: pip install -e '.[lora]'"))
    for name in PATHS])
def test_environment_tokens_are_attended_to_and_never_carry_loss(tok, path, monkeypatch):
    overrides = PATHS[path]
    masks = _recording(monkeypatch)
    base = _update(tok, overrides, _scored(tok))
    assert masks and all(m.shape[1] >= OBSERVATION.stop for m in masks)
    for mask in masks:
        assert not mask[:, OBSERVATION].any(), "an environment token carries loss"
        assert mask[:, :OBSERVATION.start].any() and mask[:, OBSERVATION.stop:].any()
    if "logp_old=auto" not in overrides:  # pi_old from the sampler: a leaked observation log-prob would move weights
        leaked = _update(tok, overrides, _scored(tok, observation_logp=-3.0))
        assert all(torch.equal(base[k], leaked[k]) for k in base), "the observation's logp_roll reached the loss"
    other = _update(tok, overrides, _scored(tok, observation_ids=7))
    assert any(not torch.equal(base[k], other[k]) for k in base), "turn 2 does not attend to the observation"


def test_selecting_and_stacking_rollouts_keeps_which_tokens_the_policy_sampled(tok):
    r = _scored(tok).rollouts
    single = Rollouts(r.prompt_ids[:4], r.prompt_mask[:4], r.response_ids[:4, :5], r.response_mask[:4, :5],
                      r.logp_roll[:4, :5], r.finished[:4], torch.zeros(4, dtype=torch.long), [""] * 4, [9])
    both = Rollouts.concat([r, single], pad_id=0)
    assert torch.equal(both.sampled_mask[:N], r.model_mask)  # the multi-turn rows keep their observations out
    assert torch.equal(both.sampled_mask[N:, :5], single.response_mask) and not both.sampled_mask[N:, 5:].any()
    assert r.lengths.tolist() == [4, 6, 6, 4, 6, 6, 4, 6]  # |o_i|: turns 1 and 2, the observation not counted
    picked = r.select(torch.arange(4, 8))
    assert torch.equal(picked.model_mask, r.model_mask[4:]) and single.sampled_mask is single.response_mask
