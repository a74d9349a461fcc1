"""`grpoplus train` past one process on this machine: 2 learner ranks train exactly like one process
and resume exactly after SIGKILL; max_staleness=0 is the synchronous loop; asynchronous runs
stay within their bound, resume, and report the async/* metrics."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from bounded import run_bounded
from safetensors.torch import load_file

from grpoplus.collect import collect
from grpoplus.config import build_config
from grpoplus.learner.prepare import LearnerPlan, prepare
from grpoplus.learner.update import update_policy
from grpoplus.loop.driver import train
from grpoplus.metrics import read_metrics
from grpoplus.plan.run import logp_old_mode

KILLER = str(Path(__file__).resolve().parents[1] / "killed.py")  # grpoplus train, SIGKILLed after step N

# 4 prompts x 4 responses = 16 rows, micro-batches of 8: one per rank, so 2 ranks add exactly the
# two gradients one process adds.
SMALL = ["prompts_per_step=4", "group_size=4", "max_new_tokens=10", "eval_size=6", "eval_samples=2",
         "progress=false", "loggers=[]", "threads=1", "micro_batch_size=2", "doctor_every=0"]



def _cli(args: list[str], kill_at: int | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, KILLER, str(kill_at)] if kill_at else [sys.executable, "-m", "grpoplus"]
    return run_bounded([*cmd, "train", *args])


def _comparable(records):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in records]


def _weights(run, step):
    return load_file(run / "checkpoints" / f"step-{step}" / "model.safetensors")


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_two_learner_ranks_train_like_one_process_under_both_launchers_and_resume_exactly(nano_dir, tmp_path):
    common = ["--model", nano_dir, "max_steps=5", "save_every=2", "eval_every=2", *SMALL]
    one, two, killed = tmp_path / "one", tmp_path / "two", tmp_path / "killed"
    assert _cli(["--out", str(one), *common]).returncode == 0
    run = _cli(["--out", str(two), *common, "data_parallel=2"])
    assert run.returncode == 0, run.stderr[-2000:]
    assert _comparable(read_metrics(two)) == _comparable(read_metrics(one))
    assert _same(_weights(two, 5), _weights(one, 5))
    torchrun = tmp_path / "torchrun"  # the same 2 ranks started by torchrun: every rank runs `grpoplus train`
    run = run_bounded([os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone",
                       "--nproc_per_node=2", "-m", "grpoplus", "train", "--out", str(torchrun), *common,
                       "data_parallel=2"])
    assert run.returncode == 0, run.stderr[-2000:]
    assert _comparable(read_metrics(torchrun)) == _comparable(read_metrics(one))
    assert _same(_weights(torchrun, 5), _weights(one, 5))
    run = _cli(["--out", str(killed), *common, "data_parallel=2"], kill_at=3)
    assert run.returncode == -9  # rank 0 killed after step 3 was logged; last checkpoint is step 2
    resumed = _cli(["--resume", str(killed)])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _comparable(read_metrics(killed)) == _comparable(read_metrics(two))
    assert _same(_weights(killed, 5), _weights(two, 5))


@pytest.mark.slow
def test_two_replicated_ranks_in_bf16_mixed_train_like_one_process_in_bf16(nano_dir, tmp_path):
    """DDP's forward runs inside the learner's bf16 autocast: the 2-rank run is the one-process bf16 run."""
    common = ["--model", nano_dir, "max_steps=3", "save_every=3", "eval_every=0", "precision=bf16_mixed", *SMALL]
    one, two = tmp_path / "one", tmp_path / "two"
    assert _cli(["--out", str(one), *common]).returncode == 0
    run = _cli(["--out", str(two), *common, "data_parallel=2"])
    assert run.returncode == 0, run.stderr[-2000:]
    assert _comparable(read_metrics(two)) == _comparable(read_metrics(one))
    assert _same(_weights(two, 3), _weights(one, 3))
    assert read_metrics(two)[-1]["mismatch/abs_p_diff_max"] > 1e-6  # bf16 was in force (this run in fp32: 1.3e-8)


def test_max_staleness_0_is_the_synchronous_loop(nano_dir, tmp_path):
    """train() equals the stages run by hand in the order of the synchronous loop (collect, prepare,
    update, sync), step for step: the default path is unchanged by the scale-out."""
    from grpoplus.assemble import assemble
    from grpoplus.learner.packing import check_packing
    from grpoplus.plan import resolve

    cfg = build_config("dapo", None, [f"model={nano_dir}", f"out={tmp_path / 'a'}", "max_steps=3", "eval_every=0",
                                      "save_every=0", "beta=0.01", *SMALL])
    records = train(cfg)
    assert any("loss/total" in r for r in records)  # some step trained: the comparison below is not vacuous
    c = assemble(resolve(cfg))  # the same components again, driven by hand
    p = c.learner.parts
    plan = LearnerPlan(temperature=cfg.rollout.temperature, micro_batch_size=cfg.learner.micro_batch_size,
                       max_grad_norm=cfg.learner.max_grad_norm,
                       logp_old=logp_old_mode(cfg.algo, cfg.learner.logp_old, True), seed=cfg.run.seed,
                       packing=check_packing(cfg.learner.packing, p.model))
    for step in range(1, 4):
        collected = collect(c.engine, c.sampler, c.train, c.scorer, c.collect_plan, c.generator)
        assert collected.metrics["reward/mean"] == records[step]["reward/mean"]
        if collected.batch is None:  # no group with spread: the loop trains on nothing this step
            assert "loss/total" not in records[step]
            continue
        batch, _, prep = prepare(collected.batch, p.model, p.ref_model, cfg.algo, plan)
        result = update_policy(p.model, p.optimizer, p.scheduler, batch, cfg.algo, plan, p.entropy_control,
                               first_step=(step - 1) * cfg.algo.updates_per_batch)
        c.engine.sync_weights(p.model, version=step)
        assert {k: records[step][k] for k in result.metrics} == result.metrics
    c.close()
    saved, own = _weights(tmp_path / "a", 3), p.model.state_dict()  # saved: tied lm_head written once
    assert all(torch.equal(own[k], saved[k]) for k in saved)


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2])
def test_asynchronous_run_stays_within_its_bound_and_resumes(nano_dir, tmp_path, k):
    out = tmp_path / f"async{k}"
    common = ["--preset", "grpo", "--model", nano_dir, "--out", str(out), "max_steps=5", "save_every=2", "eval_every=0",
              f"max_staleness={k}", "logp_old=recompute", "corrections=[tis_token]", *SMALL, "micro_batch_size=8"]
    run = _cli(common, kill_at=3)
    assert run.returncode == -9
    resumed = _cli(["--resume", str(out)])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    records = read_metrics(out)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4, 5]  # steps 3.. redone once after the resume
    trained = records[1:]
    assert all(r["async/staleness_max"] <= k for r in trained)
    assert all(r["async/staleness_mean"] <= r["async/staleness_max"] for r in trained)
    assert records[2]["async/staleness_max"] == 1  # the batch of step 2 was sampled before update 1
    busy = [r["async/learner_busy_frac"] for r in trained if "async/learner_busy_frac" in r]
    assert len(busy) >= 3 and all(0 <= b <= 1 for b in busy)  # from the second batch taken by each process
    stale = [r for r in trained if r["async/staleness_max"] >= 1]
    assert any(r["mismatch/k3"] > 1e-6 for r in stale)  # a stale sampler, once the weights moved: logp_roll != logp_old


def _children(pid: int) -> list[int]:
    path = f"/proc/{pid}/task/{pid}/children"
    return [int(c) for c in open(path).read().split()] if os.path.exists(path) else []


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["replicate", "fsdp2"])
def test_a_learner_rank_killed_mid_run_stops_the_run_with_its_name_and_resume_works(nano_dir, tmp_path, strategy):
    out = tmp_path / "run"
    args = ["--model", nano_dir, "--out", str(out), "max_steps=5", "save_every=2", "eval_every=0",
            "data_parallel=2", "collective_timeout_s=60", f"strategy={strategy}", *SMALL]
    proc = subprocess.Popen([sys.executable, "-m", "grpoplus", "train", *args], env=dict(os.environ, OMP_NUM_THREADS="1"),
                            stderr=subprocess.PIPE, text=True)
    while proc.poll() is None and not (out / "checkpoints" / "step-2").is_dir():
        time.sleep(0.05)
    followers = [c for c in _children(proc.pid) if "multiprocessing-fork" in _cmdline(c)
                 and "resource_tracker" not in _cmdline(c)]
    assert len(followers) == 1
    os.kill(followers[0], signal.SIGKILL)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2 and time.monotonic() - t0 < 60  # at once: the dead peer closed its connections
    assert "learner rank 0 of 2:" in err and f"learner rank 1 (pid {followers[0]}) exited with code -9" in err
    assert "grpoplus train --resume" in err and "Traceback" not in err
    assert ckpt_steps(out)[-1] >= 2  # the last complete checkpoint is kept
    resumed = _cli(["--resume", str(out)])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [r["step"] for r in read_metrics(out)] == [0, 1, 2, 3, 4, 5]


def ckpt_steps(run) -> list[int]:
    from grpoplus.learner.checkpoint import list_checkpoints

    return [int(p.name.split("-")[1]) for p in list_checkpoints(run)]


@pytest.mark.slow
def test_multi_turn_runs_train_on_two_ranks_exactly_like_one_process_and_asynchronously(short_turns_dir, tmp_path):
    common = ["--task", "guess", "--model", short_turns_dir, "max_steps=3", "eval_every=3", *SMALL]
    one, two, ahead = tmp_path / "one", tmp_path / "two", tmp_path / "async"
    assert _cli(["--out", str(one), *common]).returncode == 0
    records = read_metrics(one)
    assert all(r["env/obs_token_frac"] > 0 for r in records[1:])  # environment tokens in every batch
    run = _cli(["--out", str(two), *common, "data_parallel=2"])
    assert run.returncode == 0, run.stderr[-2000:]
    assert _comparable(read_metrics(two)) == _comparable(records)
    assert _same(_weights(two, 3), _weights(one, 3))
    run = _cli(["--out", str(ahead), *common, "max_staleness=1"])
    assert run.returncode == 0, run.stderr[-2000:]
    steps = [r for r in read_metrics(ahead) if r["step"] > 0]
    assert all(r["async/staleness_max"] <= 1 and r["env/turns_mean"] >= 1 for r in steps)


def test_a_follower_that_is_still_exiting_is_named_with_its_code():
    """A killed rank's connections close before its exit status can be read: the error still names it."""
    import multiprocessing

    from grpoplus.distributed.local import LocalRanks

    proc = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0.5,))
    proc.start()
    assert LocalRanks([proc]).describe(grace_s=30.0) == f"learner rank 1 (pid {proc.pid}) exited with code 0"
    live = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(30,), daemon=True)
    live.start()
    t0 = time.monotonic()
    assert LocalRanks([live]).describe(grace_s=0.5) == "" and time.monotonic() - t0 < 5  # a live one: not waited for
    live.kill()
    live.join()
