"""QLoRA: the frozen 4-bit base (grpoplus.models.qlora) under peft's adapters: which layers are 4-bit and frozen,
the quantisation error, gradients through every layer, the sampler's and the learner's log-probs, the reference
with adapters off, adapter checkpoints on a re-quantised base, and the config's refusals."""

import copy
import sys

import pytest
import torch

from grpoplus.config import build_config
from grpoplus.learner import checkpoint as ckpt
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer

pytest.importorskip("peft")
bnb = pytest.importorskip("bitsandbytes")

from grpoplus.models.lora import adapters_off, add_lora, compute_module, plain_model  # noqa: E402
from grpoplus.models.qlora import FourBit, is_4bit, parameter_count, quantize_base  # noqa: E402
from grpoplus.rollout import HFEngine, SamplingParams  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
NF4 = FourBit("nf4", torch.float32)


def _base(size: str = "small", four_bit: FourBit = NF4):
    """(the full-precision tiny model, its 4-bit copy); the small model's layers are 96 wide (block size 32), the
    MLP's down projection 256 wide (block size 64)."""
    tok = char_tokenizer()
    full = tiny_model(tok, size=size, seed=0)
    return full, quantize_base(copy.deepcopy(full), four_bit), tok


def _qlora(rank: int = 4, seed: int = 0, four_bit: FourBit = NF4):
    """A LoRA policy on the 4-bit small model, its B drawn non-zero so the adapters change the outputs."""
    _, base, tok = _base(four_bit=four_bit)
    torch.manual_seed(seed)
    policy = add_lora(base, rank, 2.0 * rank, 0.0, ["all-linear"])
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    return policy, tok


def _batch(tok):
    prompts = tok(["12+3=", "7*8-1="], padding=True, padding_side="left", return_tensors="pt")
    response = torch.tensor([[5, 9, 11, 4], [6, 7, 3, 0]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])
    return prompts["input_ids"], prompts["attention_mask"], response, mask


def _dequantized(layer) -> torch.Tensor:
    return bnb.functional.dequantize_4bit(layer.weight.data, layer.weight.quant_state)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_the_blocks_linears_are_4bit_and_frozen_the_head_and_embeddings_are_not(quant_type):
    full, base, _ = _base(four_bit=FourBit(quant_type, torch.float32))
    four_bit = {n: m for n, m in base.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert sorted({n.rpartition(".")[2] for n in four_bit}) == ["down_proj", "gate_proj", "k_proj", "o_proj",
                                                                 "q_proj", "up_proj", "v_proj"]
    assert len(four_bit) == 7 * full.config.num_hidden_layers and is_4bit(base)
    assert type(base.lm_head) is torch.nn.Linear and base.lm_head.weight is base.model.embed_tokens.weight  # tied
    assert all(m.weight.quant_type == quant_type and not m.weight.requires_grad for m in four_bit.values())
    assert parameter_count(base) == sum(p.numel() for p in full.parameters())  # counted as before quantisation
    # 4-bit codes with a float32 scale per block: nf4 is ~9 % off per weight on a Gaussian-like matrix, fp4 ~10 %
    # (the block size divides each row: with bitsandbytes' default of 64 on these 96-wide rows, its CPU kernel is
    # ~30-60 % off)
    for name, layer in four_bit.items():
        weight = full.get_submodule(name).weight
        assert layer.weight.blocksize == (64 if weight.shape[1] % 64 == 0 else 32)
        assert (_dequantized(layer) - weight).norm() / weight.norm() < 0.15, name


def test_quantisation_is_deterministic_so_a_resumed_run_gets_the_same_base():
    _, first, _ = _base()
    _, second, _ = _base()
    a, b = first.model.layers[0].mlp.down_proj.weight, second.model.layers[0].mlp.down_proj.weight
    assert torch.equal(a.data, b.data) and torch.equal(a.quant_state.absmax, b.quant_state.absmax)


def test_only_the_adapters_train_and_every_layers_adapters_get_a_gradient():
    policy, tok = _qlora()
    trained = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    logp, _ = response_logprobs(policy, *_batch(tok))
    (logp.exp() * _batch(tok)[3]).sum().backward()
    # the gradient reaches the first layer's adapters through the 4-bit layers above them
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in policy.named_parameters() if "lora_A" in n)


def test_a_no_grad_forward_leaves_the_4bit_weights_as_they_are():
    """bitsandbytes would repack a weight in place on an avx512_bf16 CPU at its first eval forward without
    gradients (a bf16-only inference layout, no gradient to the input): turned off, the sampler's forward leaves
    the learner's weights alone."""
    policy, tok = _qlora()
    ids = torch.cat(_batch(tok)[::2], 1)
    before = compute_module(policy)(input_ids=ids).logits
    policy.eval()
    with torch.inference_mode():
        compute_module(policy)(input_ids=ids)
    policy.train()
    layer = compute_module(policy).model.layers[0].self_attn.q_proj.base_layer
    assert not getattr(layer.weight.quant_state, "packing_format_for_cpu", False)
    assert torch.equal(compute_module(policy)(input_ids=ids).logits, before)


def test_the_reference_is_the_4bit_base_with_adapters_off():
    policy, tok = _qlora()
    _, base, _ = _base()
    batch = _batch(tok)
    with adapters_off(policy):
        ref, _ = response_logprobs(policy, *batch)
    want, _ = response_logprobs(base, *batch)
    adapted, _ = response_logprobs(policy, *batch)
    assert torch.equal(ref, want)
    assert (ref - adapted).abs().max() > 1e-2  # the adapters are back on after the block


def test_the_hf_engine_samples_the_4bit_policy_itself_and_the_learner_agrees():
    policy, tok = _qlora()
    engine = HFEngine(policy, tok)
    assert engine.model is compute_module(policy)  # no merged copy: 4-bit weights cannot hold W + delta W
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.mul_(-1.5)  # the learner's update, seen by the engine without a copy
    engine.sync_weights(policy, version=1)
    rollouts = engine.generate(["12+3=", "7*8-1="], SamplingParams(n=3, max_new_tokens=6),
                               generator=torch.Generator().manual_seed(1))
    learner, _ = response_logprobs(policy, rollouts.prompt_ids, rollouts.prompt_mask, rollouts.response_ids,
                                   rollouts.response_mask)
    # the same module and kernels, the decode's KV cache against one full forward: float32 rounding (the
    # mismatch metrics of a real run: mismatch/abs_p_diff_max ~1e-6, tests/loop/test_qlora_e2e.py)
    assert (learner - rollouts.logp_roll).abs().max() < 1e-5
    with pytest.raises(ValueError, match="cannot hold its adapters merged"):
        plain_model(policy)


def test_adapter_checkpoints_load_onto_a_requantised_base(tmp_path):
    policy, tok = _qlora(seed=0)
    path = ckpt.save_checkpoint(tmp_path, 3, policy, tok, {"step": 3})
    assert (path / "adapter_model.safetensors").is_file() and not list(path.glob("model*.safetensors"))
    other, _ = _qlora(seed=1)  # a fresh 4-bit base, other adapters
    batch = _batch(tok)
    assert not torch.equal(response_logprobs(other, *batch)[0], response_logprobs(policy, *batch)[0])
    ckpt.load_weights(other, path)
    assert torch.equal(response_logprobs(other, *batch)[0], response_logprobs(policy, *batch)[0])


@pytest.mark.parametrize("overrides, message", [
    (["quantize=nf4"], "learner.quantize=nf4 freezes the base model in 4-bit, so only LoRA adapters can train: set "
                       "learner.lora_rank > 0"),
    (["lora_rank=8", "quantize=fp4", "rollout.engine=vllm"], "does not run with rollout.engine=vllm"),
    (["lora_rank=8", "quantize=nf4", "rollout.quantization=int8"], "does not run with rollout.quantization=int8"),
    (["lora_rank=8", "quantize=nf4", "learner.strategy=fsdp2"], "does not run with learner.strategy=fsdp2"),
    (["lora_rank=8", "quantize=nf4", "data_parallel=2", "micro_batch_size=8"], "trains in one process for now"),
    (["lora_rank=8", "quantize=int4"], "quantize"),
])
def test_what_a_4bit_base_cannot_run_is_refused_in_one_line(overrides, message):
    with pytest.raises(ValueError, match=message.replace("+", r"\+")) as err:
        build_config(overrides=overrides)
    assert "\n" not in str(err.value)


def test_a_missing_bitsandbytes_is_one_line_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # find_spec now fails as if it were not installed
    with pytest.raises(ImportError, match=r"learner.quantize=nf4 needs the bitsandbytes package, which is not "
                                          r"installed: pip install -e '\.\[qlora\]'"):
        build_config(overrides=["lora_rank=8", "quantize=nf4"])


def _families() -> list[str]:
    from grpoplus.models.families import FAMILIES

    return sorted(FAMILIES)


@pytest.mark.parametrize("family", _families())
def test_every_architecture_trains_its_adapters_on_a_4bit_base(family):
    """Every family of the architecture matrix, at its size there (an MoE, linear-attention and Mamba hybrids, a model
    with per-layer inputs...): its plain linear layers become 4-bit (routers and fused experts stay as they are) and
    every adapter gets a gradient."""
    from grpoplus.models.families import tiny_family_model

    tok = char_tokenizer()
    policy = add_lora(quantize_base(tiny_family_model(tok, family, seed=0), NF4), 4, 8.0, 0.0, ["all-linear"])
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in policy.modules())
    logp, _ = response_logprobs(policy, *_batch(tok))
    logp.sum().backward()
    grads = [p.grad for n, p in policy.named_parameters() if "lora_B" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
