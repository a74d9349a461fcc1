"""Rank programs for the data-parallel tests, each run in its own spawned process (one per rank).

``spawn(program, world, out_dir, *args)`` starts ``world`` processes that join a gloo group and
run ``program(group, *args)``; each rank's return value comes back through ``out_dir``.
The batches and models are rebuilt from seeds in every process, so every rank and the
single-process reference see the same numbers.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import torch

from grpoplus.algo import AlgoConfig, EntropyControl
from grpoplus.containers import TrainBatch
from grpoplus.distributed.group import RankGroup, Rendezvous, RoleError, free_port
from grpoplus.distributed.rank_hooks import ReplicateHooks
from grpoplus.learner.hooks import ONE_PROCESS
from grpoplus.learner.prepare import LearnerPlan
from grpoplus.learner.update import update_policy
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.plan.run import logp_old_mode

N, P, T = 16, 4, 6  # 4 groups of 4 responses
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "seq_mean_token_sum")
CASES = [(agg, corrections, beta) for agg in AGGREGATIONS for corrections in ((), ("tis_token", "geo_mask"))
         for beta in (0.0, 0.05)]
"""Every aggregation, without and with corrections (a clipping and a masking one), without and with KL."""
EXTRA_CASES = {
    "entropy_adaptive": ({"entropy_coef": 0.01, "entropy_adaptive": True, "entropy_target": 10.0}, {}),
    "clip_cov": ({"loss": "clip_cov", "cov_lb": -10.0, "cov_ub": 10.0, "cov_ratio": 0.2}, {}),
    "token_budget": ({}, {"micro_batch_tokens": 100}),
    "one_micro_batch": ({}, {"micro_batch_tokens": 1000}),
}
"""Parts of the update each rank must reproduce, with (algo, plan) settings: the entropy bonus under
adaptive control (its coefficient carried from step to step), Clip-Cov's random token subset
(seeded per optimizer step), micro-batches by token budget (rows taken out of order: the 10 rows
of 10 tokens, then the 6 rows of 8, one micro-batch per rank), and a budget that makes one
micro-batch of the whole mini-batch: rank 1 has none and runs a stand-in (no loss) so that DDP's
all-reduce has both ranks."""


def algo_for(aggregation: str, corrections: tuple, beta: float) -> AlgoConfig:
    return AlgoConfig.preset("grpo", aggregation=aggregation, corrections=corrections, beta=beta, max_len=T)


def batch_for(seed: int, dtype: torch.dtype, with_logp_old: bool, with_ref: bool) -> TrainBatch:
    """A rollout batch with real sampler/learner gaps: a third of the rows far enough off to be masked."""
    gen = torch.Generator().manual_seed(seed)
    vocab = len(char_tokenizer())
    response_mask = torch.ones(N, T, dtype=dtype)
    response_mask[::3, 4:] = 0
    logp_roll = (-torch.rand(N, T, generator=gen, dtype=dtype) - 0.1) * response_mask
    off = (torch.arange(N) % 3 == 1).to(dtype)[:, None]  # these rows: pi_old / mu = e on average, beyond geo_mask's 2
    gap = 0.05 * torch.randn(N, T, generator=gen, dtype=dtype) + off
    logp_old = (logp_roll + gap) * response_mask
    logp_ref = (logp_old + 0.1 * torch.randn(N, T, generator=gen, dtype=dtype)) * response_mask
    return TrainBatch(torch.randint(5, vocab, (N, P), generator=gen), torch.ones(N, P, dtype=torch.long),
                      torch.randint(5, vocab, (N, T), generator=gen), response_mask, response_mask.clone(),
                      torch.randn(N, generator=gen, dtype=dtype), logp_roll, logp_old if with_logp_old else None,
                      logp_ref if with_ref else None, torch.arange(N) // 4)


def train_three_steps(case: tuple, dtype: torch.dtype, micro: int, group: RankGroup | None) -> dict:
    """Weights and update metrics after three update_policy calls (three optimizer steps)."""
    algo = algo_for(*case)
    mode = logp_old_mode(algo, "auto", algo.beta > 0)  # forward (fused) or recompute, as the trainer picks
    return run_three_steps(algo, LearnerPlan(temperature=1.0, micro_batch_size=micro, max_grad_norm=1.0,
                                             logp_old=mode), dtype, group)


def train_extra(name: str, group: RankGroup | None) -> dict:
    """:func:`run_three_steps` for one of ``EXTRA_CASES`` (float64, token_mean, pi_old recomputed)."""
    algo_kwargs, plan_kwargs = EXTRA_CASES[name]
    algo = AlgoConfig.preset("grpo", aggregation="token_mean", max_len=T, **algo_kwargs)
    return run_three_steps(algo, LearnerPlan(temperature=1.0, micro_batch_size=8, max_grad_norm=1.0,
                                             logp_old="recompute", seed=3, **plan_kwargs), torch.float64, group)


def every_extra(group: RankGroup | None) -> dict:
    return {name: train_extra(name, group) for name in EXTRA_CASES}


def run_three_steps(algo: AlgoConfig, plan: LearnerPlan, dtype: torch.dtype, group: RankGroup | None) -> dict:
    """Weights and update metrics after three update_policy calls (three optimizer steps), with the
    entropy control and optimizer-step index carried from call to call as the learner carries them."""
    model = tiny_model(char_tokenizer(), size="nano", seed=0).to(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.99), foreach=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    control = EntropyControl.from_config(algo)
    hooks = ONE_PROCESS if group is None else ReplicateHooks(group, model)
    metrics = []
    for seed in range(3):
        batch = batch_for(seed, dtype, with_logp_old=plan.logp_old != "forward", with_ref=algo.beta > 0)
        result = update_policy(model, optimizer, scheduler, batch, algo, plan, control,
                               first_step=seed * algo.updates_per_batch, hooks=hooks)
        metrics.append(result.metrics)
    return {"weights": {k: v.clone() for k, v in model.state_dict().items()}, "metrics": metrics,
            "entropy": result.entropy}


def every_case(group: RankGroup | None, micro: int) -> dict:
    return {(case, dtype): train_three_steps(case, dtype, micro, group)
            for case in CASES for dtype in (torch.float32, torch.float64)}


def peer_fails(group: RankGroup, how: str) -> tuple[str, float] | None:
    """Rank 1 dies (or stops answering) before the update; rank 0 reports what it saw and when."""
    if group.rank == 1:
        if how == "dies":
            os._exit(3)
        time.sleep(600)  # killed by spawn() once rank 0 is done
    t0 = time.perf_counter()
    try:
        train_three_steps(CASES[0], torch.float32, 8, group)
    except RoleError as err:
        return str(err), time.perf_counter() - t0
    return "no error", time.perf_counter() - t0


def spawn(program, world: int, out_dir: Path, *args, timeout_s: float = 60.0, join_s: float = 300.0) -> list:
    """Run ``program(group, *args)`` on ``world`` spawned ranks; returns each rank's result (None if it gave none).
    Ranks still running a few seconds after rank 0 ended are killed (a rank made to hang)."""
    ctx = multiprocessing.get_context("spawn")
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_rank_main, args=(program, Rendezvous(init, r, world, "cpu", timeout_s), str(out_dir),
                                                  args)) for r in range(world)]
    for proc in procs:
        proc.start()
    procs[0].join(timeout=join_s)
    for proc in procs:
        proc.join(timeout=10.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
    files = [Path(out_dir) / f"rank{r}.pt" for r in range(world)]
    return [torch.load(f, weights_only=False) if f.exists() else None for f in files]


def _rank_main(program, rendezvous: Rendezvous, out_dir: str, args: tuple) -> None:
    torch.set_num_threads(1)
    group = RankGroup.join(rendezvous)
    result = program(group, *args)
    if result is not None:
        torch.save(result, Path(out_dir) / f"rank{rendezvous.rank}.pt")
    if program is not peer_fails:
        group.close()


def sharded_start(group: RankGroup, model_dir: str, world: int) -> dict:
    """A sharded learner rank built as a run builds it (beta > 0: the reference too): what it holds."""
    from torch.distributed.tensor import DTensor

    from grpoplus.assemble.learner import build_learner_rank_parts, build_rank_model
    from grpoplus.config import build_config
    from grpoplus.plan import resolve

    cores = os.sched_getaffinity
    os.sched_getaffinity = lambda pid: set(range(max(world, len(cores(pid)))))  # 3 ranks on a 2-core machine
    try:
        cfg = build_config(overrides=[f"model={model_dir}", f"data_parallel={world}", "strategy=fsdp2",
                                      "beta=0.02", "micro_batch_size=4", "threads=1"])
        model = build_rank_model(resolve(cfg).learner, "cpu", group.rank)
    finally:
        os.sched_getaffinity = cores
    loaded = model is not None
    parts, _ = build_learner_rank_parts(resolve(cfg).learner, model, group)

    def held(m) -> tuple[int, int, int, bool]:
        """(elements this rank holds, elements of the whole model, of a ceil(1/world) share of every tensor's rows,
        every parameter a shard)."""
        params = list(m.parameters())
        local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params)
        share = sum(-(-p.shape[0] // group.world) * (p.numel() // p.shape[0]) for p in params)
        return local, sum(p.numel() for p in params), share, all(isinstance(p, DTensor) for p in params)

    def whole(m) -> dict:
        return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
                for k, v in [*m.state_dict().items(), *m.named_buffers()]}

    policy, reference = whole(parts.model), whole(parts.ref_model)  # collectives: every rank gathers
    out = {"loaded": loaded, "policy": held(parts.model), "reference": held(parts.ref_model),
           "tied": parts.model.lm_head.weight is parts.model.model.embed_tokens.weight,
           "reference_frozen": not any(p.requires_grad for p in parts.ref_model.parameters()),
           "mirror_is_loaded": parts.mirror is model if loaded else parts.mirror is None,
           "buffers": {k: v.clone() for m in (parts.model, parts.ref_model) for k, v in m.named_buffers()}}
    if group.rank == 0:
        out.update(gathered=policy, gathered_ref=reference,
                   loaded_state={k: v.clone() for k, v in [*model.state_dict().items(), *model.named_buffers()]})
    return out


def sharded_scores(group: RankGroup, n: int) -> dict:
    """ShardHooks.score over ``n`` rows: the rows this rank scored, and the gathered result."""
    from grpoplus.containers import Rollouts
    from grpoplus.distributed.rank_hooks import ShardHooks

    ids = torch.arange(n)[:, None].repeat(1, 3)  # row i's response tokens are all i
    rollouts = Rollouts(ids[:, :1], torch.ones(n, 1, dtype=torch.long), ids, torch.ones(n, 3), torch.zeros(n, 3),
                        torch.ones(n, dtype=torch.bool), torch.arange(n) // 2, [""] * n, list(range(-(-n // 2))))
    scored = []

    def fn(rows):
        scored.append(rows.response_ids[:, 0].tolist())
        return rows.response_ids.float() * 10, None

    hooks = ShardHooks(group)
    values, nothing = hooks.score(fn, rollouts)
    return {"scored": scored, "values": values, "nothing": nothing}
