"""learner.gradient_checkpointing: the same log-probs and gradients, with far fewer activations kept for backward."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from grpoplus.assemble import assemble
from grpoplus.config import build_config
from grpoplus.learner.activation_checkpointing import checkpointed_layers, require_checkpointable
from grpoplus.learner.entropy import response_logprobs_and_entropy
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.loop.driver import train_step
from grpoplus.plan import resolve

SMALL = dict(vocab_size=40, hidden_size=32, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def _logp_and_grads(model, rows, checkpointed: bool, entropy_bonus: bool = False, share: bool = True):
    model.zero_grad()
    with checkpointed_layers(model, checkpointed):
        if entropy_bonus:
            logp, entropy = response_logprobs_and_entropy(model, *rows)
        else:
            (logp, _), entropy = response_logprobs(model, *rows, share_prompts=share), None
    weights = torch.linspace(-1.0, 2.0, logp.shape[1], dtype=logp.dtype)
    loss = (logp * weights).sum() + (0.0 if entropy is None else 0.3 * entropy.sum())
    loss.backward()  # after the block: the recompute runs the layers' own forward
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(model, rows, tolerance: float = 1e-12, **kwargs):
    logp, grads = _logp_and_grads(model, rows, checkpointed=False, **kwargs)
    logp_c, grads_c = _logp_and_grads(model, rows, checkpointed=True, **kwargs)
    assert torch.equal(logp_c, logp)
    assert grads.keys() == grads_c.keys() and len(grads) > 0
    for name, grad in grads.items():
        assert torch.allclose(grads_c[name], grad, rtol=tolerance, atol=tolerance), name


@pytest.mark.parametrize("share", [True, False])
def test_checkpointed_layers_give_the_same_logprobs_and_gradients(share, grouped_rows):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMALL)).double()
    _assert_same(model, grouped_rows(0), share=share)


def test_the_entropy_bonus_path_and_a_moe_policy_checkpoint_too(grouped_rows):
    torch.manual_seed(1)
    _assert_same(LlamaForCausalLM(LlamaConfig(**SMALL)).double(), grouped_rows(1), entropy_bonus=True)
    moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(**SMALL, num_experts=4, num_experts_per_tok=2,
                                             moe_intermediate_size=16, head_dim=8))
    _assert_same(moe, grouped_rows(2), tolerance=1e-6)  # float32: the grouped expert kernels take no float64


def test_lora_adapters_get_the_same_gradients(grouped_rows):
    peft = pytest.importorskip("peft")
    torch.manual_seed(2)
    base = LlamaForCausalLM(LlamaConfig(**SMALL)).double()
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                      init_lora_weights=False))
    _assert_same(model, grouped_rows(3))


def _saved_activation_bytes(model, rows, checkpointed: bool) -> int:
    """Bytes of the tensors autograd keeps for backward after the forward (parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), checkpointed_layers(model, checkpointed):
        logp, _ = response_logprobs(model, *rows)
    logp.sum().backward()
    return sum(kept.values())


def test_checkpointing_keeps_a_fraction_of_the_activations(grouped_rows):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMALL))
    rows = grouped_rows(4, prompts=4, group=4, p=12, t=16)
    full = _saved_activation_bytes(model, rows, checkpointed=False)
    kept = _saved_activation_bytes(model, rows, checkpointed=True)
    assert kept < 0.25 * full, (kept, full)


def test_the_layers_are_themselves_again_after_the_block():
    model = LlamaForCausalLM(LlamaConfig(**SMALL))
    with checkpointed_layers(model):
        assert all("forward" in layer.__dict__ for layer in model.model.layers)
    assert all("forward" not in layer.__dict__ for layer in model.model.layers)


def test_a_model_without_decoder_layers_and_routing_replay_are_refused():
    with pytest.raises(ValueError, match="has no checkpointable layers: set it to false"):
        require_checkpointable(torch.nn.Linear(3, 3))
    with pytest.raises(ValueError, match="turn one of them off"):
        build_config("grpo", overrides=["model=tiny-moe", "routing_replay=r3", "gradient_checkpointing=true"])


def test_a_training_step_is_the_same_with_checkpointing(tmp_path):
    common = ["prompts_per_step=4", "group_size=4", "max_new_tokens=8", "eval_size=4", "progress=false",
              "loggers=[]", "doctor_every=0", "threads=1", "num_minibatches=2", "beta=0.04"]
    runs = []
    for checkpointing in ("false", "true"):
        cfg = build_config("grpo", overrides=[f"out={tmp_path / checkpointing}", *common,
                                              f"gradient_checkpointing={checkpointing}"])
        c = assemble(resolve(cfg))
        try:
            metrics = [train_step(c, step)[0] for step in (1, 2)]
            runs.append((metrics, {n: p.detach().clone() for n, p in c.learner.parts.model.named_parameters()}))
        finally:
            c.close()
    (m0, w0), (m1, w1) = runs
    assert m0[1]["optim/grad_norm"] > 0
    for a, b in zip(m0, m1):
        assert {k: v for k, v in a.items() if not k.startswith(("time/", "throughput/"))} == \
               {k: v for k, v in b.items() if not k.startswith(("time/", "throughput/"))}
    assert all(torch.equal(w0[n], w1[n]) for n in w0)
