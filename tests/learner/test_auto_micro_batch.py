"""learner.micro_batch_size=auto: micro-batches by a token budget chosen from the free memory when the learner starts,
from an activation model that bounds what autograd keeps; a shape that cannot fit is refused in one line."""

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpoplus.assemble.learner import build_learner_plan
from grpoplus.config import build_config
from grpoplus.learner.logprobs import logprobs_of
from grpoplus.loop.driver import train
from grpoplus.models import memory
from grpoplus.models.footprint import HEAD_BYTES, MARGIN, activation_bytes_per_token
from grpoplus.models.sizes import arch_from_config
from grpoplus.plan import resolve


def kept_bytes(model, rows: int, width: int, precision: str) -> int:
    """Bytes of the tensors autograd keeps for the backward of a training forward (the weights aside)."""
    kept, weights = {}, {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(3, model.config.vocab_size, (rows, width), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16_mixed"):
        logprobs_of(model, ids, mask, ids, mask, temperature=1.0)
    return sum(size for ptr, size in kept.items() if ptr not in weights)


@pytest.mark.parametrize("precision", ["fp32", "bf16_mixed"])
@pytest.mark.parametrize("shape", [(128, 384, 4, 2), (192, 768, 6, 6), (256, 512, 8, 2)])
def test_the_activation_model_bounds_what_the_backward_keeps(shape, precision):
    hidden, intermediate, heads, kv_heads = shape
    config = LlamaConfig(vocab_size=64, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).train()
    arch = arch_from_config(config.to_dict())
    # the growth from 2 to 6 rows of 2 x 24 tokens: what a token keeps, the head's fixed share aside
    per_token = (kept_bytes(model, 6, 24, precision) - kept_bytes(model, 2, 24, precision)) / (4 * 48)
    model_says = activation_bytes_per_token(arch, precision, checkpointing=False)
    assert per_token <= model_says < 1.5 * per_token


def _auto_plan(monkeypatch, free: int, *overrides: str):
    from grpoplus.assemble.factories import build_policy
    from grpoplus.assemble.learner import build_learner_parts

    plan = resolve(build_config(overrides=["micro_batch_size=auto", "max_steps=1", *overrides]))
    role = plan.learner
    model, _ = build_policy(role.policy, "cpu", role.process.seed)
    parts = build_learner_parts(role, model)
    monkeypatch.setattr(memory, "available_bytes", lambda device: free)
    return build_learner_plan(role, parts.model), parts.model


def test_auto_takes_the_tokens_that_fit_beside_the_optimizer_state(monkeypatch, capsys):
    free = 2 << 30
    plan, model = _auto_plan(monkeypatch, free)
    arch = arch_from_config(model.config.to_dict())
    state = 12 * sum(p.numel() for p in model.parameters() if p.requires_grad)  # fp32 gradient + 2 AdamW moments
    per_token = activation_bytes_per_token(arch, "fp32", checkpointing=False)
    assert plan.micro_batch_tokens == int((free / MARGIN - state - HEAD_BYTES) // per_token)
    assert plan.micro_batch_size == memory.AUTO_ROWS
    assert f"micro-batches of up to {plan.micro_batch_tokens} tokens" in capsys.readouterr().err


def test_a_row_that_cannot_fit_is_refused_with_the_figures(monkeypatch):
    with pytest.raises(ValueError, match=r"auto: .* GB free on cpu, .* leave room for 0 tokens, fewer than the "
                                         r"longest row's \d+: free memory, shorten rows"):
        _auto_plan(monkeypatch, HEAD_BYTES)


def test_auto_is_refused_where_ranks_must_agree_or_a_budget_is_set():
    with pytest.raises(ValueError, match="micro_batch_size=auto sizes one learner process's micro-batches"):
        build_config(overrides=["micro_batch_size=auto", "data_parallel=2"])
    with pytest.raises(ValueError, match="keep one of the two"):
        build_config(overrides=["micro_batch_size=auto", "micro_batch_tokens=512"])
    with pytest.raises(ValueError, match="learner.micro_batch_size: 'big' is not"):
        build_config(overrides=["micro_batch_size=big"])


def test_a_run_with_auto_micro_batches_trains(tmp_path):
    records = train(build_config(overrides=["micro_batch_size=auto", "max_steps=2", "eval_every=0",
                                            f"out={tmp_path}"]))
    trained = [r for r in records if "loss/total" in r]
    assert [r["step"] for r in trained] == [1, 2] and all(math.isfinite(r["loss/total"]) for r in trained)
