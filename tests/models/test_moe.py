"""The built-in tiny MoE policy: its shape, its warm start and loading, and that it samples and
scores like the dense one (rollout log-probs = learner log-probs)."""

import json

import pytest
import torch
from transformers import Qwen3MoeForCausalLM

import grpoplus.sft.warmstart as warmstart
from grpoplus.learner.logprobs import response_logprobs_from_rollouts
from grpoplus.models.moe import MOE_SIZES, balance_loss_while_training, tiny_moe_config
from grpoplus.models.routing import routing_spec
from grpoplus.models.tiny import tiny_model, tiny_moe_model
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.rollout.base import SamplingParams
from grpoplus.rollout.hf import HFEngine
from grpoplus.sft.warmstart import build_warmstart, encode_sft, load_builtin


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOPLUS_CACHE", str(tmp_path))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tmp_path
    torch.set_num_threads(threads)


def test_tiny_moe_shape_matches_the_dense_small_model():
    tok = char_tokenizer()
    model = tiny_model(tok, size="moe")  # tiny_model dispatches the MoE sizes
    assert isinstance(model, Qwen3MoeForCausalLM)
    config = model.config
    # vLLM's CPU attention needs head size 32, 64, 80, ...; same width and depth as 'small'.
    assert config.head_dim == 32 and config.hidden_size == 96 and config.num_hidden_layers == 3
    # Each token uses 2 of 4 experts of 128: the dense 'small' MLP width (256) per token.
    assert routing_spec(model) == routing_spec(tiny_moe_model(tok)) and config.num_experts_per_tok * \
        config.moe_intermediate_size == 256
    assert (routing_spec(model).num_layers, routing_spec(model).num_experts, routing_spec(model).top_k) == (3, 4, 2)
    assert config.norm_topk_prob and all(p.dtype == torch.float32 for p in model.parameters())
    assert model.generation_config.eos_token_id == tok.eos_token_id


def test_same_seed_same_weights_and_unknown_size():
    tok = char_tokenizer()
    a, b, c = (tiny_moe_model(tok, size="moe-nano", seed=s) for s in (0, 0, 1))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters()))
    assert tiny_moe_config(50, size="moe-nano", num_experts=8).num_experts == 8
    with pytest.raises(ValueError, match="unknown tiny MoE size 'huge'.*moe-nano"):
        tiny_moe_config(50, size="huge")
    assert set(MOE_SIZES) == {"moe", "moe-nano"}


def test_balance_loss_is_added_while_training_only():
    tok = char_tokenizer()
    model = tiny_moe_model(tok, size="moe-nano")
    batch = encode_sft(tok, ["1+2=", "12+3="], ["3#3", "#15"])
    with torch.no_grad():
        plain = model(**batch).loss
        with balance_loss_while_training(model):
            out = model(**batch)
        after = model(**batch).loss
    # loss = cross-entropy + router_aux_loss_coef * aux, with aux > 0 (Switch Transformer eq. 4)
    torch.testing.assert_close(out.loss, plain + model.config.router_aux_loss_coef * out.aux_loss)
    assert float(out.aux_loss) > 0 and not model.config.output_router_logits and torch.equal(after, plain)


def test_moe_warm_start_is_its_own_cache_and_saves_an_inference_config(cache):
    dense = build_warmstart("arithmetic", size="nano", steps=2, batch_size=4)
    moe = build_warmstart("arithmetic", size="moe-nano", steps=2, batch_size=4)
    assert moe != dense and moe.name.startswith("arithmetic-d4-moe-nano-")
    config = json.loads((moe / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe" and config["output_router_logits"] is False


def test_load_policy_tiny_moe_builds_the_moe_warm_start(monkeypatch):
    calls = []

    def quick(task, difficulty=None, **kwargs):
        calls.append(kwargs["size"])
        return build_warmstart(task, difficulty, **{**kwargs, "size": "moe-nano", "steps": 2, "batch_size": 4})

    monkeypatch.setattr(warmstart, "build_warmstart", quick)
    model, tok = load_builtin("tiny-moe", "arithmetic")
    assert calls == ["moe"]  # the real recipe asks for the 'moe' size
    assert isinstance(model, Qwen3MoeForCausalLM) and tok.padding_side == "left"
    with pytest.raises(ValueError, match="is warm-started on a built-in task, and a data set's run"):
        load_builtin("tiny-moe", None)


def test_engine_logprobs_equal_learner_logprobs():
    # The MoE model goes through the same rollout and scoring code as the dense one; with
    # equal fp32 weights the learner's log-probs equal the sampler's (the rollout tests'
    # 1e-5 bar: KV-cached decode and full forward sum in different orders).
    tok = char_tokenizer()
    model = tiny_moe_model(tok, size="moe-nano", seed=3)
    rollouts = HFEngine(model, tok).generate(["12+3=", "7="], SamplingParams(n=3, max_new_tokens=6),
                                             generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logp, _ = response_logprobs_from_rollouts(model, rollouts)
    assert rollouts.response_mask.sum() > 6
    torch.testing.assert_close(logp, rollouts.logp_roll, rtol=0, atol=1e-5)
