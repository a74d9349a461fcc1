"""GPU paths beyond the selftest's checks (``pytest -m gpu``; skipped without CUDA): FSDP2 mixed precision over
NCCL, the reference and the teacher in bf16, ``learner.tf32``, MoE routing replay and the multi-turn guess task on
the device. One GPU each: NCCL refuses two ranks on one device."""

import copy

import pytest
import torch
from safetensors.torch import load_file

from grpoplus.distributed.rank_hooks import ShardHooks
from grpoplus.distributed.sharding import model_spec, sharded_twin
from grpoplus.entry.cli import main
from grpoplus.learner.checkpoint import latest_checkpoint
from grpoplus.learner.hooks import ONE_PROCESS
from grpoplus.learner.precision import lower_frozen_linears, set_tf32
from grpoplus.learner.prepare import learner_logprobs
from grpoplus.learner.update import update_policy
from grpoplus.metrics import read_metrics
from grpoplus.models.tiny import tiny_moe_model
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.selftest import fixtures as F
from grpoplus.selftest.rank_checks import one_rank
from grpoplus.selftest.runner import Context
from grpoplus.teacher.load import load_teacher

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
SMALL = ["prompts_per_step=4", "group_size=4", "max_new_tokens=8", "eval_size=4", "eval_samples=0", "progress=false",
         "loggers=[]", "doctor_every=0", "micro_batch_size=8", "num_minibatches=2", "device=cuda"]


@pytest.fixture(autouse=True)
def _ieee_fp32_after():
    yield
    set_tf32(False)


def _bf16_updates(model, hooks, plan) -> list[float]:
    opt, sched = F.optimizer(model)
    scorer = F.nano(CUDA)
    losses = []
    for step in range(2):
        batch = F.batch(scorer, F.sample(scorer, seed=step), F.learner_plan("bf16_mixed"), seed=step)
        losses.append(update_policy(model, opt, sched, batch, F.algo(), plan, first_step=step, hooks=hooks
                                    ).metrics["loss/total"])
    return losses


def test_fsdp2_bf16_mixed_over_nccl_trains_close_to_one_process_bf16(tmp_path):
    # FSDP2 gathers the layers' parameters in bf16 (its MixedPrecisionPolicy): norms and the residual stream run in
    # bf16 where one process keeps them in float32 under autocast, so the two agree to bf16 rounding only.
    plain = F.nano(CUDA)
    ours = _bf16_updates(plain, ONE_PROCESS, F.learner_plan("bf16_mixed"))
    with one_rank(Context(CUDA, tmp_path)) as group:
        whole = F.nano(CUDA)
        model = sharded_twin(model_spec(whole), whole, CUDA, "bf16_mixed")
        theirs = _bf16_updates(model, ShardHooks(group), F.learner_plan("bf16_mixed", sharded=True))
        local = {k: v.to_local() for k, v in model.named_parameters()}
    assert all(v.dtype == torch.float32 for v in local.values())  # the sharded master weights
    start = dict(F.nano(CUDA).named_parameters())
    with torch.no_grad():
        moved = torch.cat([(p - start[k]).flatten() for k, p in plain.named_parameters()])
        diff = torch.cat([(p - local[k]).flatten() for k, p in plain.named_parameters()])
    assert float(diff.norm() / moved.norm()) < 0.25  # the same update, up to bf16 rounding (AdamW's first steps
    # are near sign steps: an element whose gradient is tiny may move either way, so no elementwise bound)
    assert all(abs(a - b) < 5e-2 for a, b in zip(ours, theirs)), (ours, theirs)


def test_a_bf16_reference_scores_like_float32_weights_under_cuda_autocast():
    model = F.nano(CUDA)
    ref = lower_frozen_linears(copy.deepcopy(model).requires_grad_(False), "bf16_mixed")
    assert ref.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    rollouts = F.sample(model)
    plan = F.learner_plan("bf16_mixed")
    assert torch.equal(learner_logprobs(ref, rollouts, plan, False)[0], learner_logprobs(model, rollouts, plan, False)[0])


def test_a_local_teacher_loads_on_the_gpu_with_bf16_linears(tmp_path):
    teacher = load_teacher(F.nano_dir(tmp_path / "teacher"), CUDA, "bf16_mixed")
    weights = [p for p in teacher.model.parameters()]
    assert all(p.device.type == "cuda" for p in weights)
    assert teacher.model.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    rollouts = F.sample(F.nano(CUDA))
    with torch.autocast("cuda", dtype=torch.bfloat16):  # the learner's autocast, which the teacher scores under
        logp, _ = teacher.token_logprobs(rollouts)
    assert logp.device.type == "cpu" and torch.isfinite(logp).all()
    assert (logp[rollouts.response_mask == 0] == 0).all()


def test_tf32_switch_trades_float32_accuracy_on_the_gpu():
    a, b = torch.randn(2048, 2048, device=CUDA), torch.randn(2048, 2048, device=CUDA)
    exact = a.double() @ b.double()
    errors = {}
    for enabled in (False, True):
        set_tf32(enabled)
        errors[enabled] = float(((a @ b).double() - exact).abs().max())
    assert errors[False] < errors[True] / 10, errors  # TF32 keeps 10 mantissa bits of float32's 23


def test_a_run_with_tf32_trains_on_the_gpu(nano_dir, tmp_path):
    assert main(["train", "--preset", "grpo", "--model", nano_dir, "--out", str(tmp_path / "run"), "max_steps=2",
                 "tf32=true", *SMALL]) == 0
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert all(v == v for v in read_metrics(tmp_path / "run")[-1].values())


@pytest.mark.parametrize("mode", ["r2", "r3"])
def test_moe_routing_replay_trains_on_the_gpu(tmp_path, mode):
    tok = char_tokenizer()
    tiny_moe_model(tok, size="moe-nano", seed=0).save_pretrained(tmp_path / "moe")
    tok.save_pretrained(tmp_path / "moe")
    out = tmp_path / mode
    assert main(["train", "--preset", "grpo", "--model", str(tmp_path / "moe"), "--out", str(out), "max_steps=2",
                 f"routing_replay={mode}", *SMALL]) == 0
    last = read_metrics(out)[-1]
    assert 0.0 <= last["moe/routing_mismatch"] <= 1.0 and last["moe/load_max_frac"] >= 0.25


def test_the_multi_turn_guess_task_trains_on_the_gpu(nano_dir, tmp_path):
    out = tmp_path / "guess"
    assert main(["train", "--task", "guess", "--model", nano_dir, "--out", str(out), "max_steps=2", *SMALL]) == 0
    last = read_metrics(out)[-1]
    assert last["env/turns_max"] <= 4 and "env/return_mean" in last
    weights = load_file(next(latest_checkpoint(out).glob("*.safetensors")))
    assert all(torch.isfinite(w).all() for w in weights.values())


def _rollouts(engine, seed: int):
    from grpoplus.containers import SamplingParams

    return engine.generate(F.PROMPTS, SamplingParams(n=4, max_new_tokens=24), generator=torch.Generator().manual_seed(seed))


def test_the_compiled_decode_replays_cuda_graphs_and_samples_the_eager_rollouts(capsys):
    # rollout.compile on a GPU: CUDA graphs captured on the kept static batch (not skipped by torch), the eager
    # engine's tokens in float32, a second rollout of the bucket replaying the graph, and release_memory freeing it.
    from torch._dynamo.utils import counters

    from grpoplus.rollout import EngineOptions, HFEngine

    F.ieee_fp32(CUDA)
    model = F.nano(CUDA)
    eager = HFEngine(model, F.tokenizer())
    compiled = HFEngine(model, F.tokenizer(), EngineOptions(compile=True, release_memory=True))
    skips = counters["inductor"]["cudagraph_skips"]
    for seed in (1, 2):
        a, b = _rollouts(eager, seed), _rollouts(compiled, seed)
        assert torch.equal(a.response_ids, b.response_ids)
        torch.testing.assert_close(a.logp_roll, b.logp_roll, atol=1e-4, rtol=0)
    assert not compiled.step.failed and compiled.step.graphs
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert "rollout.compile" not in capsys.readouterr().err
    compiled.offload()
    assert compiled.step.pool.tensors == {}
    assert torch.equal(_rollouts(compiled, 1).response_ids, _rollouts(eager, 1).response_ids)


def test_a_bf16_decode_on_the_gpu_samples_a_bf16_copy_of_the_linear_weights():
    # the default on a GPU (rollout.engine_kwargs.cast_weights=auto): bit for bit the rollouts of autocast over the
    # float32 weights, with the copy refreshed in place at a sync
    from grpoplus.rollout import EngineOptions, HFEngine

    model = F.nano(CUDA)
    cast = HFEngine(model, F.tokenizer(), EngineOptions(dtype=torch.bfloat16))
    plain = HFEngine(model, F.tokenizer(), EngineOptions(dtype=torch.bfloat16, extra={"cast_weights": False}))
    assert cast.model is not model and cast.model.lm_head.weight.dtype == torch.bfloat16 and plain.model is model
    a, b = _rollouts(plain, 3), _rollouts(cast, 3)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logp_roll, b.logp_roll)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    cast.sync_weights(model, version=1)
    assert torch.equal(cast.model.model.layers[0].mlp.up_proj.weight,
                       model.model.layers[0].mlp.up_proj.weight.to(torch.bfloat16))


def test_the_chunked_heads_weight_gradient_runs_in_bf16_on_the_gpu_close_to_float32():
    # under bf16 autocast the head's d W = dz^T h takes bf16 operands with float32 accumulation (mm's out_dtype), as
    # autocast computes every other weight's gradient: float32's gradient to bf16 rounding
    from grpoplus.learner.logprobs import ChunkedHeadLogProb

    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(300, 64, device=CUDA, generator=g)
    weight = (torch.randn(500, 64, device=CUDA, generator=g) * 0.1).requires_grad_()
    tokens = torch.randint(0, 500, (300,), device=CUDA, generator=g)
    grads = []
    for dtype in (None, torch.bfloat16):
        weight.grad = None
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            logp, _ = ChunkedHeadLogProb.apply(hidden, weight, tokens, 1.0, False)
        logp.sum().backward()
        grads.append(weight.grad.clone())
    assert grads[1].dtype == torch.float32
    rel = (grads[1] - grads[0]).norm() / grads[0].norm()
    assert 1e-6 < rel < 2e-2  # bf16's rounding, not float32's


def test_a_packed_forward_under_flex_attention_gives_the_padded_gradients_on_the_gpu(capsys):
    # learner.packed_attention=auto on a GPU: packed rows under flex attention (each row's block, no [S, S] mask), the
    # padded forward's log-probs and gradients to float32 rounding, and no fallback said
    from grpoplus.learner.logprobs import response_logprobs
    from grpoplus.learner.packing import packed_attention

    F.ieee_fp32(CUDA)
    model = F.nano(CUDA)
    assert packed_attention("auto", model, "auto") == "flex_attention"
    g = torch.Generator().manual_seed(0)
    lens_p, lens_r = torch.tensor([9, 5, 3, 7]), torch.tensor([12, 2, 7, 10])
    pm = (torch.arange(9)[None] >= 9 - lens_p[:, None]).long()
    rm = (torch.arange(12)[None] < lens_r[:, None]).long()
    rows = [x.to(CUDA) for x in (torch.randint(5, 60, (4, 9), generator=g) * pm, pm,
                                 torch.randint(5, 60, (4, 12), generator=g) * rm, rm)]
    out = []
    for kwargs in ({"share_prompts": False}, {"packing": True, "packed_attention": "flex_attention"}):
        model.zero_grad(set_to_none=True)
        logp, _ = response_logprobs(model, *rows, **kwargs)
        logp.sum().backward()
        out.append((logp.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(out[1][0], out[0][0], atol=1e-4, rtol=0)
    for a, b in zip(out[0][1], out[1][1]):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-3)
    assert "packed forward under flex_attention failed" not in capsys.readouterr().err
