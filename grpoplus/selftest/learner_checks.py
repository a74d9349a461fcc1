"""Checks of one process on the device: the sampler's log-probs against the learner's, the chunked head, a bf16
update, LoRA."""

from __future__ import annotations

import importlib.util
import math

import torch

from grpoplus.learner.logprobs import chunked_head, response_logprobs
from grpoplus.learner.prepare import learner_logprobs
from grpoplus.learner.update import update_policy
from grpoplus.selftest import fixtures as F
from grpoplus.selftest.environment import bf16_problem
from grpoplus.selftest.runner import CheckFailed, CheckSkipped, Context, check

FP32_TOLERANCE = 1e-5
"""Largest |logp_roll - learner logp| in fp32 (TF32 off): the CPU tests' tolerance."""
BF16_MEAN_BOUND, BF16_MAX_BOUND = 0.01, 0.15
"""bf16_mixed: the sampler's decode and the learner's full forward round differently; mean and largest
|logp_roll - learner logp| over the response tokens must stay within these (nats)."""


def _engine_gap(ctx: Context, precision: str) -> dict:
    F.ieee_fp32(ctx.device)
    model = F.nano(ctx.device)
    dtype = torch.bfloat16 if precision == "bf16_mixed" else torch.float32
    rollouts = F.sample(model, dtype=dtype)
    logp, _ = learner_logprobs(model, rollouts, F.learner_plan(precision), with_entropy=False)  # on the CPU
    mask = rollouts.response_mask.bool()
    gap = (logp - rollouts.logp_roll)[mask].abs()
    if (rollouts.logp_roll[~mask] != 0).any():
        raise CheckFailed("logp_roll is not 0 on padding tokens")
    return {"tokens": int(mask.sum()), "max_gap": float(gap.max()), "mean_gap": float(gap.mean())}


@check("engine_logprobs", "process",
       "the hf engine's logp_roll equals the learner's log-probs to 1e-5 (fp32, TF32 off: the CPU tests' "
       "tolerance)")
def engine_logprobs(ctx: Context) -> dict:
    figures = _engine_gap(ctx, "fp32")
    if not figures["max_gap"] <= FP32_TOLERANCE:
        raise CheckFailed(f"|logp_roll - learner logp| reaches {figures['max_gap']:.2e} over {figures['tokens']} "
                          f"tokens (fp32 bound {FP32_TOLERANCE:g}): the sampler and the learner disagree")
    return figures


@check("engine_logprobs_bf16", "process",
       "the same in learner.precision=bf16_mixed: mean gap <= 0.01, largest <= 0.15 nats (a GPU without native "
       "bf16 fails it, saying so)")
def engine_logprobs_bf16(ctx: Context) -> dict:
    _require_bf16(ctx)
    figures = _engine_gap(ctx, "bf16_mixed")
    if not (figures["mean_gap"] <= BF16_MEAN_BOUND and figures["max_gap"] <= BF16_MAX_BOUND):
        raise CheckFailed(f"bf16 |logp_roll - learner logp|: mean {figures['mean_gap']:.3g} (bound {BF16_MEAN_BOUND}), "
                          f"max {figures['max_gap']:.3g} (bound {BF16_MAX_BOUND})")
    return figures


@check("chunked_head", "process",
       "the learner's chunked LM head gives the full logits' log-probs (1e-5) and head gradient (1e-4)")
def chunked_head_matches(ctx: Context) -> dict:
    F.ieee_fp32(ctx.device)
    model = F.nano(ctx.device)
    if chunked_head(model) is None:
        raise CheckFailed("the nano Llama is not on the chunked-head path (grpoplus.learner.logprobs.HEAD_MODEL_TYPES)")
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, model.config.vocab_size, (4, 7), generator=g).to(ctx.device)
    response = torch.randint(5, model.config.vocab_size, (4, 9), generator=g).to(ctx.device)
    ones_p, mask = torch.ones_like(prompt), torch.ones_like(response, dtype=torch.float32)
    mask[1, 5:] = 0
    logp, _ = response_logprobs(model, prompt, ones_p, response, mask, temperature=0.8, share_prompts=False)
    (logp * mask).sum().backward()
    head_grad = model.lm_head.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=torch.cat([prompt, response], 1)).logits[:, prompt.shape[1] - 1:-1]
    full = (logits / 0.8).log_softmax(-1).gather(-1, response[..., None]).squeeze(-1) * mask
    full.sum().backward()
    figures = {"logp_gap": F.max_abs(logp * mask, full), "grad_gap": F.max_abs(head_grad, model.lm_head.weight.grad)}
    if not (figures["logp_gap"] <= FP32_TOLERANCE and figures["grad_gap"] <= 1e-4):
        raise CheckFailed(f"chunked head vs full logits: log-probs differ by {figures['logp_gap']:.2e} (bound 1e-5), "
                          f"the head's gradient by {figures['grad_gap']:.2e} (bound 1e-4)")
    return figures


@check("bf16_update", "process",
       "four bf16_mixed updates on one batch stay finite, keep float32 master weights and lower the loss")
def bf16_update(ctx: Context) -> dict:
    _require_bf16(ctx)
    model = F.nano(ctx.device)
    plan = F.learner_plan("bf16_mixed")
    batch = F.batch(model, F.sample(model, dtype=torch.bfloat16), plan)
    opt, sched = F.optimizer(model)
    losses = []
    for step in range(4):
        metrics = update_policy(model, opt, sched, batch, F.algo(), plan, first_step=step).metrics
        if not all(math.isfinite(v) for v in metrics.values()) or metrics["optim/skipped_updates"]:
            bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
            raise CheckFailed(f"bf16_mixed step {step + 1}: non-finite {', '.join(bad) or 'gradient (update skipped)'}")
        losses.append(metrics["loss/total"])
    if not all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters()):
        raise CheckFailed("bf16_mixed: the master weights are not finite float32 after the updates")
    if not losses[-1] < losses[0]:
        raise CheckFailed(f"bf16_mixed: 4 updates on one batch did not lower the loss ({losses[0]:.4g} -> {losses[-1]:.4g})")
    return {"loss_first": losses[0], "loss_last": losses[-1]}


@check("lora", "process",
       "LoRA: only the adapters train, and the engine's merged weights sample what the learner scores (1e-5); "
       "skipped without peft")
def lora(ctx: Context) -> dict:
    if importlib.util.find_spec("peft") is None:
        raise CheckSkipped("peft is not installed (pip install -e '.[lora]')")
    from grpoplus.models.lora import add_lora

    F.ieee_fp32(ctx.device)
    torch.manual_seed(0)
    model = add_lora(F.nano(ctx.device), 4, 8.0, 0.0, ["q_proj", "v_proj", "up_proj"])
    base = {k: v.clone() for k, v in model.named_parameters() if not v.requires_grad}
    plan = F.learner_plan()
    opt, sched = F.optimizer(model)
    for step in range(2):
        batch = F.batch(model, F.sample(model, seed=step), plan, seed=step)
        update_policy(model, opt, sched, batch, F.algo(), plan, first_step=step)
    if any(not torch.equal(v, base[k]) for k, v in model.named_parameters() if k in base):
        raise CheckFailed("LoRA: a frozen base weight changed in the update")
    moved = sum(int(not torch.equal(v, torch.zeros_like(v))) for k, v in model.named_parameters() if "lora_B" in k)
    if not moved:
        raise CheckFailed("LoRA: no adapter moved in two updates")
    rollouts = F.sample(model, seed=5)  # merged weights (the hf engine's LoRA path)
    logp, _ = learner_logprobs(model, rollouts, plan, with_entropy=False)
    gap = F.max_abs(logp * rollouts.response_mask, rollouts.logp_roll)
    if not gap <= FP32_TOLERANCE:
        raise CheckFailed(f"LoRA: the engine's merged weights and the adapters disagree by {gap:.2e} in log-prob "
                          f"(bound {FP32_TOLERANCE:g})")
    return {"adapters_moved": moved, "merged_gap": gap}


def _require_bf16(ctx: Context) -> None:
    problem = bf16_problem(str(ctx.device))
    if problem:
        raise CheckFailed(problem)
