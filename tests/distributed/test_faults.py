"""Bad scale-out input is a one-line error naming the problem and the fix, before anything starts:
Ray missing, more ranks than devices, ranks without a micro-batch, a cluster address that does
not answer, torchrun's rank count differing from learner.data_parallel."""

import importlib.util
import os
import socket
import time

import pytest

from grpoplus.config import build_config
from grpoplus.distributed.local import torchrun_follower
from grpoplus.entry.cli import main
from grpoplus.plan import resolve


def test_cluster_ray_without_ray_installed_names_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ImportError, match=r"cluster=ray needs the ray package.*pip install -e '\.\[ray\]'"):
        build_config(overrides=["cluster=ray"])
    build_config(overrides=["cluster=local"])  # the default path needs no Ray


def test_more_learner_ranks_than_devices_cannot_fit(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    with pytest.raises(ValueError, match="data_parallel=3 needs one device per rank but this machine has 2 CPU cores"):
        build_config(overrides=["data_parallel=3", "micro_batch_size=16"])
    with pytest.raises(ValueError, match="this machine has 0 GPUs"):
        build_config(overrides=["data_parallel=2", "micro_batch_size=16", "learner.device=cuda"])


def test_every_rank_needs_a_micro_batch_and_workers_need_ray():
    with pytest.raises(ValueError, match="a mini-batch of 64 responses makes only 1 .* lower micro_batch_size to 32 or fewer"):
        build_config(overrides=["data_parallel=2", "micro_batch_size=256"])
    with pytest.raises(ValueError, match="rollout.workers=2 runs its engines as Ray actors: set cluster=ray"):
        build_config(overrides=["rollout.workers=2"])
    with pytest.raises(ValueError, match="rollout.max_staleness must be >= 0"):
        build_config(overrides=["max_staleness=-1"])


def test_torchrun_rank_count_must_match_data_parallel(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # 2 nodes x 2 ranks
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match="torchrun started 4 ranks but learner.data_parallel=2"):
        torchrun_follower(resolve(build_config(overrides=["data_parallel=2", "micro_batch_size=16"])).placement.ranks)
    assert torchrun_follower(resolve(build_config(overrides=["data_parallel=4", "micro_batch_size=16"])).placement.ranks)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")
def test_a_cluster_address_that_does_not_answer_is_a_named_error_at_once(tmp_path, capsys):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    t0 = time.monotonic()
    code = main(["train", "--out", str(tmp_path / "run"), "cluster=ray", f"ray.address=127.0.0.1:{port}",
                 "max_steps=1", "progress=false", "loggers=[]"])
    err = capsys.readouterr().err
    assert code == 2 and time.monotonic() - t0 < 120
    assert f"cluster: the Ray cluster at 127.0.0.1:{port} did not answer" in err and "ray start --head" in err
