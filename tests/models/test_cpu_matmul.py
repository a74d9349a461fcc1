"""Float32 linear layers on a CPU through oneDNN (learner.cpu_matmul): the same outputs and gradients as torch's
path, oneDNN really doing the products where routed and never where it must not (another dtype, autocast, a model
grpoplus did not load), and the mode's one-line errors."""

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from grpoplus.config import build_config
from grpoplus.learner.logprobs import ChunkedHeadLogProb
from grpoplus.models import cpu_matmul
from grpoplus.models.cpu_matmul import linear, mm, route, use_cpu_matmul, uses_onednn

needs_onednn = pytest.mark.skipif(not cpu_matmul.onednn_available(), reason="this torch has no oneDNN linear op")


@pytest.fixture
def mode(monkeypatch):
    """Sets the process's mode for one test; the mode and ``nn.Linear``'s forward before it are restored after."""
    monkeypatch.setattr(cpu_matmul, "_state", dict(cpu_matmul._state))
    monkeypatch.setattr(torch.nn.Linear, "forward", torch.nn.Linear.forward)
    return use_cpu_matmul


@pytest.fixture
def products(monkeypatch):
    """The shapes oneDNN multiplied, in call order."""
    calls, original = [], cpu_matmul.onednn_linear
    monkeypatch.setattr(cpu_matmul, "onednn_linear", lambda x, w, b=None: calls.append(tuple(x.shape)) or original(x, w, b))
    return calls


def _grads(x_shape, bias, frozen=False, transposed=False):
    torch.manual_seed(0)
    layer = route(torch.nn.Linear(96, 80, bias=bias)).requires_grad_(not frozen)
    x = torch.randn(*x_shape[::-1]).T if transposed else torch.randn(*x_shape)
    x.requires_grad_(True)
    out = layer(x)
    out.backward(torch.randn_like(out))
    return out.detach(), x.grad, layer.weight.grad, None if layer.bias is None else layer.bias.grad


@needs_onednn
@pytest.mark.parametrize("x_shape, bias, frozen, transposed", [
    ((37, 96), True, False, False), ((3, 13, 96), False, False, False), ((2, 3, 5, 96), True, True, False),
    ((96, 29)[::-1], True, False, True)])
def test_onednn_linear_equals_torch_forward_and_backward(mode, products, x_shape, bias, frozen, transposed):
    mode("torch")
    expected = _grads(x_shape, bias, frozen, transposed)
    assert products == []
    mode("onednn")
    got = _grads(x_shape, bias, frozen, transposed)
    rows = 1
    for n in x_shape[:-1]:
        rows *= n
    # the forward, dX = dY W (input dY: [..., out]) and, when the weight trains, dW = dY^T X (input [out, rows])
    assert products[0] == tuple(x_shape) and products[1][-1] == 80 and (products[2:] == [(80, rows)]) != frozen
    for want, have in zip(expected, got):
        assert (want is None) == (have is None)
        if want is not None:
            torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_torch_keeps_what_onednn_must_not_take(mode, products):
    mode("onednn")
    layer = route(torch.nn.Linear(16, 8))
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16_mixed: autocast's bf16 product
        assert layer(x).dtype == torch.bfloat16
    assert layer.double()(x.double()).dtype == torch.float64  # float64 (exact gradient tests)
    assert products == []
    mode("torch")
    layer.float()(x)
    assert products == []
    mode("onednn")
    with torch.no_grad():
        assert layer(x).grad_fn is None
    assert products == [(4, 16)]


@needs_onednn
def test_a_model_trains_the_same_through_onednn(mode, products):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    ids = torch.randint(0, 101, (3, 12), generator=torch.Generator().manual_seed(1))

    def loss_and_grads(m):
        loss = F.cross_entropy(m(input_ids=ids).logits[:, :-1].reshape(-1, 101), ids[:, 1:].reshape(-1))
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in m.named_parameters()}

    mode("torch")
    route(model)
    loss, grads = loss_and_grads(copy.deepcopy(model))  # the copy keeps the marks
    assert products == []
    mode("onednn")
    loss_dnn, grads_dnn = loss_and_grads(model)
    assert len(products) >= 2 * 7 * 3  # every projection of both layers, forward and backward
    torch.testing.assert_close(loss_dnn, loss, rtol=1e-6, atol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_dnn[name], grad, rtol=1e-5, atol=1e-6, msg=name)


@needs_onednn
def test_the_chunked_heads_products_go_through_onednn_with_the_same_gradients(mode, products):
    torch.manual_seed(0)
    hidden, weight = torch.randn(9, 32), torch.randn(300, 32)
    tokens = torch.randint(0, 300, (9,))

    def run():
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        logp, _ = ChunkedHeadLogProb.apply(h, w, tokens, 0.7, False, True)  # a marked head's
        logp.sum().backward()
        return logp.detach(), h.grad, w.grad

    mode("torch")
    expected = run()
    mode("onednn")
    got = run()
    assert products  # the head's forward and backward products
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mm(hidden, weight.T), hidden @ weight.T, rtol=1e-5, atol=1e-5)


def test_auto_takes_onednn_on_amd_x86_only(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "onednn_available", lambda: True)
    monkeypatch.setattr(cpu_matmul.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(cpu_matmul, "cpu_vendor", lambda: "AuthenticAMD")
    assert uses_onednn("auto") and uses_onednn("onednn") and not uses_onednn("torch")
    assert cpu_matmul.auto_choice().startswith("oneDNN: an AMD x86 CPU")
    monkeypatch.setattr(cpu_matmul, "cpu_vendor", lambda: "GenuineIntel")
    assert not uses_onednn("auto")
    assert cpu_matmul.auto_choice().startswith("torch's BLAS: a GenuineIntel CPU (oneDNN is picked on AMD x86 only")
    monkeypatch.setattr(cpu_matmul, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(cpu_matmul.platform, "machine", lambda: "aarch64")
    assert not uses_onednn("auto")
    monkeypatch.setattr(cpu_matmul, "onednn_available", lambda: False)
    assert cpu_matmul.auto_choice().startswith("torch's BLAS: this torch ")


def test_a_mode_this_torch_cannot_run_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "onednn_available", lambda: False)
    with pytest.raises(ValueError, match=r"^learner.cpu_matmul=onednn: this torch .* no oneDNN linear op") as err:
        uses_onednn("onednn")
    assert "\n" not in str(err.value)
    assert not uses_onednn("auto")
    with pytest.raises(ValueError, match="learner.cpu_matmul='fast': expected one of auto, onednn, torch"):
        uses_onednn("fast")


def test_a_local_run_is_refused_onednn_where_this_torch_lacks_it_before_any_model_loads(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "onednn_available", lambda: False)
    with pytest.raises(ValueError, match=r"^learner.cpu_matmul=onednn: this torch .* use learner.cpu_matmul=auto"):
        build_config(overrides=["learner.cpu_matmul=onednn"])
    assert build_config(overrides=["learner.cpu_matmul=auto"]).learner.cpu_matmul == "auto"


def test_the_config_key_takes_the_three_modes_and_refuses_others():
    assert build_config(overrides=["learner.cpu_matmul=torch"]).learner.cpu_matmul == "torch"
    with pytest.raises(Exception, match="cpu_matmul"):
        build_config(overrides=["learner.cpu_matmul=mkl"])


def test_linear_falls_back_to_torch_for_an_empty_batch(mode):
    mode("onednn" if cpu_matmul.onednn_available() else "torch")
    layer = torch.nn.Linear(8, 4)
    assert linear(torch.randn(0, 8), layer.weight, layer.bias).shape == (0, 4)


@needs_onednn
def test_a_second_derivative_through_a_routed_layer_is_torchs(mode):
    def second(mode_name):
        mode(mode_name)
        torch.manual_seed(0)
        layer = route(torch.nn.Linear(8, 4))
        x = torch.randn(3, 8, requires_grad=True)
        (grad,) = torch.autograd.grad(layer(x).pow(2).sum(), x, create_graph=True)
        return grad.detach(), torch.autograd.grad(grad.pow(2).sum(), (x, layer.weight))

    grad, (xx, xw) = second("torch")
    grad_dnn, (xx_dnn, xw_dnn) = second("onednn")
    for want, have in ((grad, grad_dnn), (xx, xx_dnn), (xw, xw_dnn)):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-6)


@needs_onednn
def test_a_model_grpoplus_did_not_load_keeps_torchs_products(mode, products):
    # a library user's own model in a process whose run routes to oneDNN: its layers are not marked, so torch computes
    # them, and the chunked head of an unmarked head too
    mode("onednn")
    cpu_matmul.route_every_layer(False)  # as a run's process: only what grpoplus loaded is marked
    own = torch.nn.Linear(16, 8)
    own(torch.randn(4, 16))
    h, w = torch.randn(3, 16), torch.randn(20, 16)
    ChunkedHeadLogProb.apply(h, w, torch.tensor([1, 2, 3]), 1.0, False)
    assert products == []
    route(own)(torch.randn(4, 16))
    assert products == [(4, 16)]


def test_loading_a_model_marks_it_and_patches_nothing(monkeypatch):
    # grpoplus's loader marks the model it loads; the process's nn.Linear is changed only by a run's process setup
    from grpoplus.models.load import prepared
    from grpoplus.models.tiny import tiny_model
    from grpoplus.models.tokenizer import char_tokenizer

    monkeypatch.setattr(cpu_matmul, "_state", {"active": False, "installed": False, "every": False})
    monkeypatch.setattr(torch.nn.Linear, "forward", cpu_matmul._TORCH_FORWARD)
    tok = char_tokenizer()
    model, _ = prepared(tiny_model(tok, size="nano"), tok, "cpu")
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(getattr(m, cpu_matmul.MARK) for m in linears)
    assert torch.nn.Linear.forward is cpu_matmul._TORCH_FORWARD and not cpu_matmul.in_use()


def test_reset_gives_nn_linear_torchs_forward_back(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "_state", {"active": False, "installed": False, "every": False})
    monkeypatch.setattr(torch.nn.Linear, "forward", cpu_matmul._TORCH_FORWARD)
    use_cpu_matmul("torch")
    assert torch.nn.Linear.forward is not cpu_matmul._TORCH_FORWARD
    cpu_matmul.reset()
    assert torch.nn.Linear.forward is cpu_matmul._TORCH_FORWARD and not cpu_matmul.in_use()
