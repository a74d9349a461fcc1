"""The failure gallery, weight sync to Ray rollout workers: a sync whose object-store copy of the weights leaves one
tensor stale is named by the first step that samples with it, as in one process (tests/failures/test_sync.py)."""

import pytest

ray = pytest.importorskip("ray", reason="cluster=ray needs ray: pip install -e '.[ray]'")

from grpoplus.distributed import ray_rollout  # noqa: E402
from grpoplus.entry.cli import main  # noqa: E402
from grpoplus.metrics import read_metrics  # noqa: E402
from grpoplus.rollout.weights import ObjectStore, as_source  # noqa: E402

SPREAD = "def spread(prompts, completions, **fields):\n    return [len(set(c)) / 10 for c in completions]\n"
SMALL = ["--preset", "grpo", "prompts_per_step=4", "group_size=4", "max_new_tokens=10", "eval_size=4",
         "eval_samples=0", "progress=false", "loggers=[]", "micro_batch_size=8", "threads=1", "health.stop_after=0",
         "lr=1e-3", "cluster=ray", "rollout.workers=1", "learner.data_parallel=1", "ray.timeout_s=300",
         "ray.num_cpus=2"]


@pytest.fixture(scope="module")
def ray_instance():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_a_sync_to_ray_workers_that_leaves_one_tensor_stale_is_named(nano_dir, tmp_path, monkeypatch, capsys,
                                                                     ray_instance):
    sync, first = ray_rollout.RayRolloutEngine.sync_weights, {}
    name = "model.layers.0.mlp.down_proj.weight"

    def stale_sync(self, weights, version):  # the workers get rank 0's weights with one tensor as first sent
        tensors = dict(ray.get(as_source(weights).ref))
        tensors[name] = first.setdefault(name, tensors[name].clone())
        sync(self, ObjectStore(ray.put(tensors)), version)

    monkeypatch.setattr(ray_rollout.RayRolloutEngine, "sync_weights", stale_sync)
    (tmp_path / "spread.py").write_text(SPREAD)
    out = tmp_path / "run"
    assert main(["train", "--model", nano_dir, "--out", str(out), "max_steps=2",
                 f"rewards=[{tmp_path / 'spread.py'}:spread]", *SMALL]) == 0
    err = capsys.readouterr().err
    k3 = {r["step"]: r["mismatch/k3"] for r in read_metrics(out)[1:]}
    assert first and k3[1] < 1e-9  # step 1: the weights both sides started from
    assert "health: step 2: sync_gap: the engine's log-probs differ from the learner's right after the weight sync" \
        in err and k3[2] > 1e-8  # update 1 did not reach the worker's down_proj of layer 0
