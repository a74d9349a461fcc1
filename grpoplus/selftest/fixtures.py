"""The checks' shared material: the built-in nano model on a device, a sampled batch, a learner plan, an optimizer.

Everything is rebuilt from seeds, so two copies of a model or a batch are equal bit for bit (on one device).
"""

from __future__ import annotations

import torch

from grpoplus.algo import AlgoConfig
from grpoplus.containers import Rollouts, SamplingParams, TrainBatch
from grpoplus.learner.precision import set_tf32
from grpoplus.learner.prepare import LearnerPlan, learner_logprobs
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.rollout import EngineOptions, HFEngine

PROMPTS = ["12+3=", "7*8=", "100-1=", "9=", "4+4+4=", "61-7="]
"""Prompts of different lengths: every batch is left-padded."""

LR = 1e-3


def ieee_fp32(device: torch.device) -> None:
    """IEEE float32 matmuls on a GPU (TF32 off), so the CPU tests' tolerances apply."""
    if device.type == "cuda":
        set_tf32(False)


def tokenizer():
    return char_tokenizer()


def nano(device: torch.device, seed: int = 0) -> torch.nn.Module:
    """The built-in nano Llama (untrained) with sharpened attention, on ``device``. At the default init scale
    attention is almost uniform, so a wrong position or an unmasked pad token would move log-probs by less than
    the checks' tolerance; larger query/key weights make both visible."""
    model = tiny_model(tokenizer(), size="nano", seed=seed)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(6.0)
            layer.self_attn.k_proj.weight.mul_(6.0)
    return model.to(device)


def sample(model: torch.nn.Module, dtype: torch.dtype = torch.float32, n: int = 4, new_tokens: int = 16,
           seed: int = 1, temperature: float = 1.0) -> Rollouts:
    """Rollouts of :data:`PROMPTS` from the hf engine on the model's device (the run's CPU generator)."""
    engine = HFEngine(model, tokenizer(), EngineOptions(dtype=dtype))
    params = SamplingParams(n=n, temperature=temperature, max_new_tokens=new_tokens)
    return engine.generate(PROMPTS, params, generator=torch.Generator().manual_seed(seed))


def algo() -> AlgoConfig:
    """GRPO with one optimizer step per call of the update, no KL term (no reference model)."""
    return AlgoConfig.preset("grpo", num_minibatches=1, num_iterations=1, beta=0.0)


def learner_plan(precision: str = "fp32", sharded: bool = False, micro_batch_size: int = 8) -> LearnerPlan:
    return LearnerPlan(temperature=1.0, micro_batch_size=micro_batch_size, max_grad_norm=1.0, logp_old="recompute",
                       precision=precision, sharded=sharded)


def batch(model: torch.nn.Module, rollouts: Rollouts, learner_plan: LearnerPlan, seed: int = 0) -> TrainBatch:
    """A fixed batch: the rollouts, group-normalised random rewards as advantages, pi_old from ``model``."""
    n = rollouts.response_ids.shape[0]
    rewards = torch.rand(n, generator=torch.Generator().manual_seed(seed))
    grouped = rewards.view(-1, int((rollouts.group_ids == 0).sum()))
    advantages = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).flatten()
    logp_old, _ = learner_logprobs(model, rollouts, learner_plan, with_entropy=False)
    r = rollouts
    return TrainBatch(r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask, r.response_mask.clone(),
                      advantages, r.logp_roll, logp_old, None, r.group_ids, vision=r.vision)


def optimizer(model: torch.nn.Module):
    """The learner's own optimizer and schedule (grpoplus.assemble.factories.build_optimizer) at lr :data:`LR`,
    constant."""
    from grpoplus.assemble.factories import build_optimizer
    from grpoplus.config import build_config
    from grpoplus.plan import resolve

    cfg = build_config(overrides=[f"lr={LR}", "lr_schedule=constant", "warmup_steps=0"])
    return build_optimizer(resolve(cfg).learner.optimizer, model)


def nano_dir(path, seed: int = 0) -> str:
    """The untrained nano model and its tokenizer saved as a Hugging Face model directory."""
    tok = tokenizer()
    tiny_model(tok, size="nano", seed=seed).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float().cpu() - b.detach().float().cpu()).abs().max())


def weights_gap(a: torch.nn.Module, b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between ``a``'s parameters and the tensors ``b`` (by name)."""
    return max(max_abs(p, b[name]) for name, p in a.named_parameters())
