"""Checks of the learner ranks' update hooks (grpoplus.distributed.rank_hooks) on one rank of a real process group
(NCCL on a GPU, gloo on a CPU): a sharded learner (``learner.strategy=fsdp2``, with and without
``learner.cpu_offload``) and a data-parallel one (DDP) must train like the plain learner. One rank is all one GPU
allows (NCCL refuses two ranks on a device); it runs every collective and hook of the strategy."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.distributed.tensor import DTensor

from grpoplus.distributed.group import RankGroup, Rendezvous, free_port
from grpoplus.distributed.rank_hooks import ReplicateHooks, ShardHooks
from grpoplus.distributed.sharding import model_spec, sharded_twin
from grpoplus.learner.hooks import ONE_PROCESS
from grpoplus.learner.update import update_policy
from grpoplus.selftest import fixtures as F
from grpoplus.selftest.environment import nccl_problem
from grpoplus.selftest.runner import CheckFailed, CheckSkipped, Context, check

RANK_TOLERANCE = 1e-5
"""Largest |weight difference| after two updates between one rank of a strategy and the plain learner (fp32)."""
STEPS = 2


@contextmanager
def one_rank(ctx: Context):
    """A process group of this process alone, on the check's device (NCCL on a GPU), destroyed afterwards."""
    if ctx.on_gpu and nccl_problem():
        raise CheckFailed(nccl_problem())
    if torch.distributed.is_initialized():
        raise CheckSkipped("this process already belongs to a process group (run the selftest outside torchrun)")
    device = f"cuda:{ctx.device.index or 0}" if ctx.on_gpu else "cpu"
    group = RankGroup.join(Rendezvous(f"tcp://127.0.0.1:{free_port()}", 0, 1, device, 120.0))
    try:
        yield group
    finally:
        group.close()


def _train(model, hooks, plan, ctx: Context) -> list[dict]:
    """Two updates on two fixed batches (sampled and scored by a plain copy, so both sides see the same)."""
    opt, sched = F.optimizer(model)
    scorer = F.nano(ctx.device)
    metrics = []
    for step in range(STEPS):
        batch = F.batch(scorer, F.sample(scorer, seed=step), F.learner_plan(), seed=step)
        metrics.append(update_policy(model, opt, sched, batch, F.algo(), plan, first_step=step, hooks=hooks).metrics)
    return metrics


def _compare(name: str, model: torch.nn.Module, reference: torch.nn.Module, theirs: list[dict], ours: list[dict]
             ) -> dict:
    local = {k: (v.to_local() if isinstance(v, DTensor) else v) for k, v in model.named_parameters()}  # 1 rank: whole
    gap = F.weights_gap(reference, local)
    loss_gap = max(abs(a["loss/total"] - b["loss/total"]) for a, b in zip(theirs, ours))
    if not gap <= RANK_TOLERANCE:
        raise CheckFailed(f"{name} on one rank vs the plain learner: weights differ by {gap:.2e} after {STEPS} updates "
                          f"(bound {RANK_TOLERANCE:g}; losses differ by {loss_gap:.2e})")
    return {"weight_gap": gap, "loss_gap": loss_gap}


def _plain(ctx: Context) -> tuple[torch.nn.Module, list[dict]]:
    model = F.nano(ctx.device)
    return model, _train(model, ONE_PROCESS, F.learner_plan(), ctx)


def _sharded(ctx: Context, offload: bool) -> dict:
    F.ieee_fp32(ctx.device)
    plain, ours = _plain(ctx)
    with one_rank(ctx) as group:
        whole = F.nano(ctx.device)
        model = sharded_twin(model_spec(whole), whole, ctx.device, "fp32", offload=offload)
        theirs = _train(model, ShardHooks(group), F.learner_plan(sharded=True), ctx)
        return _compare("fsdp2" + (" with cpu_offload" if offload else ""), model, plain, theirs, ours)


@check("fsdp2_one_rank", "rank",
       "learner.strategy=fsdp2 on one rank (NCCL on a GPU, gloo on a CPU) trains like the plain learner (weights "
       "within 1e-5 after two updates)")
def fsdp2_one_rank(ctx: Context) -> dict:
    return _sharded(ctx, offload=False)


@check("cpu_offload", "rank", "the same with learner.cpu_offload (the shards in host memory); GPU only")
def cpu_offload(ctx: Context) -> dict:
    if not ctx.on_gpu:
        raise CheckSkipped("learner.cpu_offload is a GPU setting")
    return _sharded(ctx, offload=True)


@check("ddp_one_rank", "rank", "learner.strategy=replicate (DDP) on one rank trains like the plain learner (1e-5)")
def ddp_one_rank(ctx: Context) -> dict:
    F.ieee_fp32(ctx.device)
    plain, ours = _plain(ctx)
    with one_rank(ctx) as group:
        model = F.nano(ctx.device)
        theirs = _train(model, ReplicateHooks(group, model), F.learner_plan(), ctx)
        return _compare("DDP", model, plain, theirs, ours)
