"""Compiled learner layers (learner.compile): eager's numbers, no recompilation per width, a one-line fallback.

Compiling costs seconds on a CPU (inductor builds C++ kernels), so the tests that compile are marked slow; the
fallback and the refusals need no compilation.
"""

import importlib.util

import pytest
import torch
from torch._dynamo.exc import Unsupported

from grpoplus.config import build_config
from grpoplus.learner import compiling
from grpoplus.learner.activation_checkpointing import checkpointed_layers
from grpoplus.learner.compiling import check_compile, compiled_graphs, compiled_layers
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.learner.precision import autocast
from grpoplus.models.tiny import tiny_model, tiny_moe_model

from .conftest import groups, lora_nano, three_steps


@pytest.fixture(autouse=True)
def fresh_compilation(monkeypatch):
    """Each test compiles afresh: no graph of an earlier test counts towards dynamo's limit, no failure is remembered."""
    torch._dynamo.reset()
    monkeypatch.setattr(compiling, "_COMPILED", {})


def _grads(model, rows, mode, checkpointing=False, precision="fp32", **kwargs):
    model.zero_grad(set_to_none=True)
    with compiled_layers(model, mode), checkpointed_layers(model, checkpointing), autocast(precision, rows[0].device):
        logp, _ = response_logprobs(model, *rows, **kwargs)
    (logp * torch.linspace(-1.0, 2.0, logp.shape[1])).sum().backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_equal(compiled, eager, atol=1e-5):
    (logp_c, grads_c), (logp_e, grads_e) = compiled, eager
    torch.testing.assert_close(logp_c, logp_e, atol=atol, rtol=0)
    assert grads_c.keys() == grads_e.keys() and grads_e
    for name, grad in grads_e.items():
        torch.testing.assert_close(grads_c[name], grad, atol=atol, rtol=1e-4, msg=name)


@pytest.mark.slow
def test_compiled_layers_give_eager_log_probs_and_gradients_at_every_width_without_recompiling(tok):
    model = tiny_model(tok, size="nano", seed=0)
    graphs = []
    for rows in (groups(0), groups(1, t=9), groups(2, prompts=2, p=5, t=3)):  # widths 13, 16, 8; 12, 12, 8 rows
        for kwargs in (dict(share_prompts=False), dict(packing=True)):
            _assert_equal(_grads(model, rows, "default", **kwargs), _grads(model, rows, None, **kwargs))
        graphs.append(compiled_graphs())
    assert graphs[0] > 0 and graphs[1] == graphs[0] == graphs[2]  # new widths and row counts: no new graph


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs peft: pip install -e '.[lora]'")
def test_compiled_layers_compose_with_lora_gradient_checkpointing_and_shared_prompts(tok):
    model = lora_nano(tok)
    rows = groups(3)
    before = compiled_graphs()
    kwargs = dict(checkpointing=True, share_prompts=False)  # LoRA's layers compiled, recomputed in the backward
    _assert_equal(_grads(model, rows, "default", **kwargs), _grads(model, rows, None, **kwargs))
    assert compiled_graphs() > before
    # the shared-prompt forward carries a key/value cache: its layers run eagerly, the same numbers
    _assert_equal(_grads(model, rows, "default", share_prompts=True), _grads(model, rows, None, share_prompts=True))


@pytest.mark.slow
def test_compiled_layers_under_bf16_autocast_match_eager_bf16(tok):
    model = tiny_model(tok, size="nano", seed=0)
    rows = groups(4)
    # bf16 matmuls: the compiled kernels may round differently, within bf16's 8 bits of mantissa
    _assert_equal(_grads(model, rows, "default", precision="bf16_mixed", share_prompts=False),
                  _grads(model, rows, None, precision="bf16_mixed", share_prompts=False), atol=3e-2)


def test_a_failed_compilation_runs_eagerly_from_then_on_said_in_one_line(tok, capsys, monkeypatch):
    model = tiny_model(tok, size="nano", seed=0)
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise Unsupported("injected: dynamo cannot trace this layer")

    monkeypatch.setattr(compiling.torch, "compile", lambda fn, **kwargs: broken)
    rows = groups(5)
    _assert_equal(_grads(model, rows, "default", share_prompts=False), _grads(model, rows, None, share_prompts=False),
                  atol=0)
    _grads(model, rows, "default", share_prompts=False)  # the class stays eager: its compiled forward is not tried
    assert len(calls) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("grpoplus: note: learner.compile: compiling LlamaDecoderLayer "
                                               "failed (Unsupported: injected")


@pytest.mark.slow
def test_a_layer_past_the_recompilation_limit_runs_eagerly_said_in_one_line(tok, capsys, monkeypatch):
    model = tiny_model(tok, size="nano", seed=0)
    monkeypatch.setattr(compiling, "LAYER_GRAPHS", 1)
    rows = groups(6)
    with torch._dynamo.config.patch(recompile_limit=1):
        _grads(model, rows, "default", share_prompts=False)
        with torch.no_grad(), compiled_layers(model, "default"):  # another kind of forward: a second graph
            logp, _ = response_logprobs(model, *rows, share_prompts=False)
    torch.testing.assert_close(logp, response_logprobs(model, *rows, share_prompts=False)[0], atol=1e-5, rtol=0)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("grpoplus:")]
    assert err == ["grpoplus: note: learner.compile: compiling LlamaDecoderLayer failed (it needed more than 1 graphs "
                   "(torch._dynamo.config.recompile_limit)); it runs eagerly from now on"]


def test_compile_is_refused_in_one_line_under_routing_replay_and_an_moe_policy_stays_eager(tok, capsys):
    with pytest.raises(ValueError, match="^learner.compile=true compiles the decoder layers, inside which"):
        build_config("grpo", overrides=["learner.compile=true", "model=tiny-moe", "routing_replay=r3"])
    capsys.readouterr()
    assert check_compile(True, "default", tiny_moe_model(tok, size="moe-nano"), routing=True) is None
    assert capsys.readouterr().err.startswith("grpoplus: note: learner.compile=true runs this model's layers eagerly")
    assert check_compile(True, "default", tiny_model(tok, size="nano"), routing=False) == "default"
    assert check_compile(False, "default", tiny_model(tok, size="nano"), routing=False) is None


@pytest.mark.slow
def test_a_few_training_steps_compiled_give_the_eager_losses(tmp_path):
    # The warm-started model (some rewards differ within a group). beta=0: with a reference, the first step's KL
    # is exactly 0 eagerly but ~1e-14 compiled (the no-grad and the grad graphs round differently), and AdamW
    # turns that ~1e-8 gradient into a full-size step: a rounding difference, amplified, not compile's error.
    records = {}
    for compile_ in ("false", "true"):
        records[compile_] = three_steps(tmp_path / compile_, "beta=0", "micro_batch_size=4", f"learner.compile={compile_}")
    assert len(records["true"]) == len(records["false"]) == 3
    for off, on in zip(records["false"], records["true"]):
        assert on["length/mean"] == off["length/mean"]  # the same rollouts: the weights stayed within fp32 rounding
        assert on["loss/total"] == pytest.approx(off["loss/total"], rel=1e-4, abs=1e-6)
        assert on["optim/grad_norm"] == pytest.approx(off["optim/grad_norm"], rel=1e-4, abs=1e-6)
        assert on["learner/compiled_graphs"] > 0 and "learner/compiled_graphs" not in off
