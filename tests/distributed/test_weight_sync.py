"""ray.weight_sync=collective on a local Ray instance (gloo on CPU): a broadcast copies bytes, so a run
trains exactly as with the object store; after a sync every rollout worker holds learner rank 0's
weights and version; a bad value, a member that never joins and a worker that dies are one-line
errors within a bounded time."""

import time

import pytest
import torch

ray = pytest.importorskip("ray", reason="cluster=ray needs ray: pip install -e '.[ray]'")

from test_ray import SMALL, _equal, _final, _records, killing_a_worker  # noqa: E402

from grpoplus.assemble import assemble  # noqa: E402
from grpoplus.config import build_config  # noqa: E402
from grpoplus.distributed.group import RoleError, free_port  # noqa: E402
from grpoplus.distributed.weight_sync import WeightGroup  # noqa: E402
from grpoplus.loop.driver import train, train_step  # noqa: E402
from grpoplus.plan import resolve  # noqa: E402

TWO_WORKERS = ("cluster=ray", "rollout.workers=2", "learner.data_parallel=1")


pytestmark = pytest.mark.usefixtures("ray_instance")


def _config(nano_dir: str, out, *overrides: str):
    return build_config("dapo", None, [f"model={nano_dir}", f"out={out}", "max_steps=4", *SMALL, *overrides])


@pytest.mark.slow
def test_collective_sync_trains_exactly_like_the_object_store(nano_dir, tmp_path):
    train(_config(nano_dir, tmp_path / "store", *TWO_WORKERS))
    train(_config(nano_dir, tmp_path / "bcast", *TWO_WORKERS, "ray.weight_sync=collective"))
    assert _records(tmp_path / "bcast") == _records(tmp_path / "store")  # every metric of every step, time aside
    assert _equal(_final(tmp_path / "bcast")[1], _final(tmp_path / "store")[1])


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["replicate", "fsdp2"])
def test_after_a_sync_every_worker_holds_learner_rank_0s_weights_and_version(nano_dir, tmp_path, strategy):
    # two learner ranks: the weight-sync group lives beside their default group, not in it; sharded (fsdp2), rank 0
    # gathers the whole weights from both ranks' shards before it broadcasts them
    cfg = _config(nano_dir, tmp_path, "cluster=ray", "rollout.workers=2", "learner.data_parallel=2",
                  "ray.weight_sync=collective", f"learner.strategy={strategy}")
    c = assemble(resolve(cfg))
    try:
        before = ray.get(c.learner.actors[0].weights.remote())
        train_step(c, 1)  # collect, update, publish version 1
        learner = ray.get(c.learner.actors[0].weights.remote())
        held = ray.get([w.__ray_call__.remote(lambda w: ({k: v.detach().cpu() for k, v in w.model.state_dict().items()},
                                                         w.engine.version)) for w in c.engine.actors])
    finally:
        c.close()
    assert not _equal(learner, before)  # the update moved the weights: a missed sync would show
    for weights, version in held:
        assert _equal(weights, learner) and version == 1


def test_a_bad_weight_sync_value_is_the_config_layers_one_line_error():
    with pytest.raises(ValueError, match=r"^config key ray.weight_sync: 'nccl' is not one of object_store, "
                                         r"collective$"):
        build_config(overrides=["ray.weight_sync=nccl"])
    assert build_config().ray.weight_sync == "object_store"


def test_a_member_that_never_joins_is_a_one_line_error_within_the_time_limit():
    started = time.monotonic()
    with pytest.raises(RoleError) as err:  # rank 0 of a group of 2 whose worker never comes
        WeightGroup.join(f"tcp://127.0.0.1:{free_port()}", 0, 2, torch.nn.Linear(2, 2), 3.0, "learner rank 0")
    assert time.monotonic() - started < 30
    message = str(err.value)
    assert "\n" not in message and message.startswith("learner rank 0: the weight-sync group")
    assert "did not form within 3 s" in message and "ray.weight_sync=object_store" in message


@pytest.mark.slow
def test_a_worker_killed_during_the_run_ends_it_in_one_line_within_a_bounded_time(nano_dir, tmp_path):
    from grpoplus.distributed.ray_cluster import RoleDied

    started = time.monotonic()
    with killing_a_worker(tmp_path / "killed") as killed, pytest.raises(RoleDied) as err:
        train(_config(nano_dir, tmp_path / "killed", *TWO_WORKERS, "ray.weight_sync=collective"))  # max_restarts=3
    assert time.monotonic() - started < 200  # seen at once, not after ray.timeout_s=300 of silence
    message = str(err.value)
    assert killed and "\n" not in message
    assert message.startswith("rollout worker ") and "died during sampling" in message
    assert "ray.weight_sync=collective cannot re-form the weight-sync group" in message
    assert "set ray.weight_sync=object_store" in message and "--resume RUN" in message
