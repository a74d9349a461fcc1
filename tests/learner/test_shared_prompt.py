"""Each distinct prompt computed once (learner.share_prompts): the same log-probs and gradients, less work."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
from transformers.models.llama import modeling_llama

from grpoplus.learner.logprobs import response_logprobs
from grpoplus.learner.shared_prompt import shared_prompt_hidden

SMALL = dict(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


@pytest.fixture
def float64_norm(monkeypatch):
    """transformers' RMSNorm computes in float32 whatever the model's dtype; in float64 the comparison
    is then exact to float64 precision rather than float32's."""
    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))
    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", forward)


def _logp_and_grads(model, rows, share: bool):
    model.zero_grad()
    logp, _ = response_logprobs(model, *rows, share_prompts=share)
    weights = torch.linspace(-1.0, 2.0, logp.shape[1], dtype=logp.dtype)
    (logp * weights).sum().backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("seed", [0, 1])
def test_shared_prompts_give_the_row_by_row_logprobs_and_gradients_in_float64(float64_norm, seed, grouped_rows):
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**SMALL)).double()
    rows = grouped_rows(seed)
    logp, grads = _logp_and_grads(model, rows, share=False)
    logp_s, grads_s = _logp_and_grads(model, rows, share=True)
    assert torch.allclose(logp_s, logp, rtol=0, atol=1e-12)
    assert (logp_s[rows[3] == 0] == 0).all()
    for name, grad in grads.items():
        assert torch.allclose(grads_s[name], grad, rtol=1e-10, atol=1e-12), name


def test_shared_prompts_agree_in_float32(grouped_rows):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMALL))
    rows = grouped_rows(2)
    logp, grads = _logp_and_grads(model, rows, share=False)
    logp_s, grads_s = _logp_and_grads(model, rows, share=True)
    assert torch.allclose(logp_s, logp, atol=1e-5)
    for name, grad in grads.items():
        assert torch.allclose(grads_s[name], grad, rtol=1e-4, atol=1e-5), name


def test_each_distinct_prompt_is_computed_once(grouped_rows):
    model = LlamaForCausalLM(LlamaConfig(**SMALL))
    seen = []
    model.model.embed_tokens.register_forward_hook(lambda mod, args, out: seen.append(args[0].numel()))
    pid, pm, rid, rm = grouped_rows(3, prompts=3, group=4, p=7, t=6)
    t1 = int(rm.sum(1).max())
    for share in (False, True):
        seen.clear()
        response_logprobs(model, pid, pm, rid, rm, share_prompts=share)
        assert sum(seen) == (3 * 7 + 12 * (t1 - 1) if share else 12 * (7 + t1))


def test_nothing_is_shared_without_repeated_prompts_or_with_a_sliding_window(grouped_rows):
    pid, pm, rid, rm = grouped_rows(4, prompts=3, group=1)
    model = LlamaForCausalLM(LlamaConfig(**SMALL))
    ids, mask = torch.cat([pid, rid], 1), torch.cat([pm, rm], 1)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    assert shared_prompt_hidden(model, ids, mask, positions, pid.shape[1], rid.shape[1]) is None
    pid, pm, rid, rm = grouped_rows(4, prompts=2, group=2)
    windowed = MistralForCausalLM(MistralConfig(**SMALL, sliding_window=4))
    ids, mask = torch.cat([pid, rid], 1), torch.cat([pm, rm], 1)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    assert shared_prompt_hidden(windowed, ids, mask, positions, pid.shape[1], rid.shape[1]) is None
    assert shared_prompt_hidden(model, ids, mask, positions, pid.shape[1], rid.shape[1]) is not None


@pytest.mark.parametrize("group, longest", [(1, None), (4, None), (4, 1)])
def test_always_runs_two_body_passes_whatever_the_rows_with_the_same_logprobs(float64_norm, grouped_rows, group,
                                                                             longest):
    # A sharded learner's ranks must run their layers equally often: "always" runs the prompt pass and the
    # response pass with unique prompts (group 1) and with one-token responses (longest 1) too.
    torch.manual_seed(5)
    model = LlamaForCausalLM(LlamaConfig(**SMALL)).double()
    pid, pm, rid, rm = grouped_rows(5, prompts=3, group=group)
    if longest is not None:
        rm = torch.zeros_like(rm)
        rm[:, :longest] = 1
    passes = []
    model.model.embed_tokens.register_forward_hook(lambda *_: passes.append(1))
    plain, _ = response_logprobs(model, pid, pm, rid, rm, share_prompts=False)
    passes.clear()
    always, _ = response_logprobs(model, pid, pm, rid, rm, share_prompts="always")
    assert len(passes) == 2
    assert torch.allclose(always, plain, rtol=0, atol=1e-12)
