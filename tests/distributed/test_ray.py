"""cluster=ray on a local Ray instance (2 CPUs): one rollout worker and two learner ranks train exactly
like one process; with two rollout workers, a worker killed mid-run is restarted and the run ends
exactly as the uninterrupted one (no step lost or repeated); one that dies past ray.max_restarts ends
the run with a one-line error at once, and resume finishes it as the uninterrupted run."""

import os
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray", reason="cluster=ray needs ray: pip install -e '.[ray]'")

from grpoplus.config import build_config  # noqa: E402
from grpoplus.learner import checkpoint as ckpt  # noqa: E402
from grpoplus.loop.driver import train  # noqa: E402
from grpoplus.metrics import read_metrics  # noqa: E402

SMALL = ["prompts_per_step=4", "group_size=4", "max_new_tokens=10", "eval_size=6", "eval_samples=2",
         "progress=false", "loggers=[]", "threads=1", "micro_batch_size=2", "doctor_every=0", "save_every=2",
         "eval_every=2", "ray.timeout_s=300"]


pytestmark = pytest.mark.usefixtures("ray_instance")



def _run(nano_dir: str, out: Path, *overrides: str) -> list[dict]:
    train(build_config("dapo", None, [f"model={nano_dir}", f"out={out}", "max_steps=4", *SMALL, *overrides]))
    return _records(out)


def _records(out: Path) -> list[dict]:
    """Every metric of every step, time aside."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in read_metrics(out)]


def _final(out: Path) -> tuple[dict, dict]:
    """(data position, weights) of the run's last checkpoint."""
    from safetensors.torch import load_file

    path = ckpt.latest_checkpoint(out)
    return ckpt.load_state(path)["sampler"], load_file(path / "model.safetensors")


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_one_rollout_worker_and_two_learner_ranks_train_exactly_like_one_process(nano_dir, tmp_path):
    local = _run(nano_dir, tmp_path / "local")
    on_ray = _run(nano_dir, tmp_path / "ray", "cluster=ray", "rollout.workers=1", "learner.data_parallel=2")
    assert on_ray == local  # every metric of every step (time aside): same rollouts, rewards, updates
    assert _equal(_final(tmp_path / "ray")[1], _final(tmp_path / "local")[1])


@pytest.mark.slow
def test_sharded_learner_ranks_on_ray_train_exactly_like_sharded_local_ranks(nano_dir, tmp_path):
    # learner.strategy=fsdp2 on Ray actors: the ranks shard the policy in their own group and rank 0's gathered
    # weights reach the rollout worker through the object store; the same as two sharded ranks on this machine.
    fsdp2 = ("learner.data_parallel=2", "learner.strategy=fsdp2")
    local = _run(nano_dir, tmp_path / "local", *fsdp2)
    on_ray = _run(nano_dir, tmp_path / "ray", "cluster=ray", "rollout.workers=1", *fsdp2)
    assert on_ray == local
    assert _equal(_final(tmp_path / "ray")[1], _final(tmp_path / "local")[1])
    assert (ckpt.latest_checkpoint(tmp_path / "ray") / "optimizer" / "__1_0.distcp").is_file()  # rank 1's shards


def _kill_a_worker_mid_request(run_dir: Path, killed: list, stop: threading.Event, after_step: int = 1) -> None:
    """Once ``after_step`` is logged, SIGKILL a rollout worker process while it serves a generate request."""
    while not stop.is_set() and not (run_dir / "metrics.jsonl").is_file() or \
            len((run_dir / "metrics.jsonl").read_text().splitlines()) < after_step + 1:
        if stop.wait(0.05):
            return
    while not stop.is_set():
        for pid in os.listdir("/proc"):
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if title.startswith("ray::RolloutWorker.generate"):
                os.kill(int(pid), signal.SIGKILL)
                killed.append(int(pid))
                return
        time.sleep(0.005)


@contextmanager
def killing_a_worker(run_dir: Path, after_step: int = 1):
    """A thread that SIGKILLs a rollout worker mid-request once ``after_step`` is logged; yields the pids it killed."""
    killed, stop = [], threading.Event()
    killer = threading.Thread(target=_kill_a_worker_mid_request, args=(run_dir, killed, stop, after_step))
    killer.start()
    try:
        yield killed
    finally:
        stop.set()
        killer.join()


@pytest.mark.slow
def test_a_killed_rollout_worker_is_restarted_and_no_step_is_lost_or_repeated(nano_dir, tmp_path, capfd):
    overrides = ("cluster=ray", "rollout.workers=2", "learner.data_parallel=1")
    straight = _run(nano_dir, tmp_path / "straight", *overrides)
    with killing_a_worker(tmp_path / "killed") as killed:
        interrupted = _run(nano_dir, tmp_path / "killed", *overrides)
    assert killed, "no rollout worker was seen serving a request"
    assert "waiting for its restart, then sending its request again" in capfd.readouterr().err
    # How we know no step was lost or repeated: the steps logged are 0..4 once each, and every
    # step's data and update are those of the uninterrupted run (the request sent again sampled
    # the same responses), ending at the same data position and the same weights.
    assert [r["step"] for r in interrupted] == [0, 1, 2, 3, 4]
    assert interrupted == straight
    assert _final(tmp_path / "killed")[0] == _final(tmp_path / "straight")[0]  # sampler position
    assert _equal(_final(tmp_path / "killed")[1], _final(tmp_path / "straight")[1])


@pytest.mark.slow
def test_a_rollout_worker_that_dies_past_its_restarts_ends_the_run_in_one_line_and_resume_finishes_it(
        nano_dir, tmp_path):
    from grpoplus.config import resumed_config
    from grpoplus.distributed.ray_cluster import RoleDied

    overrides = ("cluster=ray", "rollout.workers=2", "learner.data_parallel=1")
    straight = _run(nano_dir, tmp_path / "straight", *overrides)
    run_dir = tmp_path / "gave_up"
    started = time.monotonic()
    with killing_a_worker(run_dir, after_step=2) as killed, pytest.raises(RoleDied) as err:  # saved at 2
        _run(nano_dir, run_dir, *overrides, "ray.max_restarts=0")
    took = time.monotonic() - started
    message = str(err.value)
    assert killed and "\n" not in message
    assert message.startswith("rollout worker ") and "died during sampling" in message
    assert "ray.max_restarts=0 allows no restart: raise ray.max_restarts" in message
    assert "continue with `grpoplus train --resume RUN`" in message
    assert took < 200  # the death is seen at once, not after ray.timeout_s=300 of silence
    # the run directory kept its last complete checkpoint, and resume ends where the uninterrupted run did
    assert ckpt.latest_checkpoint(run_dir) is not None
    cfg = resumed_config(run_dir)
    cfg.run.out = str(run_dir)
    train(cfg, resume=True)
    resumed = _records(run_dir)
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4] and resumed == straight
    assert _final(run_dir)[0] == _final(tmp_path / "straight")[0]
    assert _equal(_final(run_dir)[1], _final(tmp_path / "straight")[1])


def test_roles_that_cannot_fit_the_cluster_are_an_error_before_any_actor_starts(nano_dir, tmp_path):
    cfg = build_config("dapo", None, [f"model={nano_dir}", f"out={tmp_path}", "cluster=ray", "rollout.workers=2",
                                      "learner.device=cuda", *SMALL])
    with pytest.raises(ValueError, match="need 3 GPUs .* but the Ray cluster has 0"):
        train(cfg)


@pytest.mark.slow
def test_multi_turn_rollouts_on_a_ray_worker_train_exactly_like_one_process(short_turns_dir, tmp_path):
    local = _run(short_turns_dir, tmp_path / "local", "task=guess")
    assert all(r["env/obs_token_frac"] > 0 for r in local[1:])  # environment tokens in every batch
    on_ray = _run(short_turns_dir, tmp_path / "ray", "task=guess", "cluster=ray", "rollout.workers=1",
                  "learner.data_parallel=2")
    assert on_ray == local


@pytest.mark.slow
def test_a_vision_language_policy_on_ray_trains_exactly_like_one_process(tmp_path):
    # rows with images: the rollout worker's engine samples with them, the rows carry the pixels to the two learner
    # ranks over Ray, and every metric and weight is one process's
    common = ("model=tiny-vlm", "task=shapes", "max_steps=2", "eval_every=0")
    train(build_config("dapo", None, [f"out={tmp_path / 'local'}", *SMALL, *common]))
    train(build_config("dapo", None, [f"out={tmp_path / 'ray'}", *SMALL, *common, "cluster=ray", "rollout.workers=1",
                                      "learner.data_parallel=2"]))
    local, on_ray = _records(tmp_path / "local"), _records(tmp_path / "ray")
    assert len(local) == 3 and on_ray == local  # step 0 (the held-out evaluation), then two steps
    assert _equal(_final(tmp_path / "ray")[1], _final(tmp_path / "local")[1])
