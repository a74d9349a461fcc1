"""Bounded staleness: no batch is trained beyond K versions (checked on the version tags), the
bound is reached (real overlap), the learner does not wait for a busy sampler, and the
checkpointed position is the first batch not yet trained on."""

import threading
import time

import pytest
import torch

from grpoplus.containers import Collected, Rollouts, ScoredGroups
from grpoplus.data.order import PromptSampler
from grpoplus.distributed.staleness import BoundedStaleness


class FakeEngine:
    """Tags rollouts with the version it was last synced to; ``lag`` mis-tags them (a broken engine)."""

    def __init__(self, lag: int = 0):
        self.version, self.lag, self.closed = 0, lag, False

    def sync_weights(self, weights, version: int) -> None:
        self.version = version

    def close(self) -> None:
        self.closed = True


def _collected(version: int, rows: int = 4) -> Collected:
    rollouts = Rollouts(torch.zeros(rows, 1, dtype=torch.long), torch.ones(rows, 1, dtype=torch.long),
                        torch.zeros(rows, 1, dtype=torch.long), torch.ones(rows, 1), torch.zeros(rows, 1),
                        torch.ones(rows, dtype=torch.bool), torch.zeros(rows, dtype=torch.long), [""] * rows, [0],
                        policy_version=version)
    scored = ScoredGroups(rollouts, torch.zeros(rows), torch.zeros(rows, dtype=torch.bool), {})
    return Collected(scored, [scored], {})


def _collector(k: int, sample_s: float, engine: FakeEngine | None = None):
    engine = engine or FakeEngine()
    sampler = PromptSampler(100, seed=0)

    def collect_step():
        sampler.next(4)  # the data position moves as real collection does
        time.sleep(sample_s)
        return _collected(engine.version - engine.lag)

    return BoundedStaleness(collect_step, engine, sampler, torch.Generator().manual_seed(0), k), sampler


def _train(collector, steps: int, learn_s: float) -> list[dict]:
    """The trainer's loop: take the step's batch, 'update' (sleep), publish version = step."""
    out = []
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        collected = collector.next(step)
        out.append({**collected.metrics, "waited": time.perf_counter() - t0,
                    "version": collected.batch.rollouts.policy_version})
        time.sleep(learn_s)
        collector.sync_weights(None, step)
    collector.close()
    return out


@pytest.mark.parametrize("k", [1, 2])
def test_no_batch_is_trained_beyond_its_bound_and_the_bound_is_reached(k):
    records = _train(_collector(k, sample_s=0.01)[0], steps=8, learn_s=0.05)  # fast sampler: runs ahead
    for step, r in enumerate(records, start=1):
        assert (step - 1) - r["version"] <= k  # the version tag of the batch trained at this step
        assert r["async/staleness_max"] == (step - 1) - r["version"]
    assert max(r["async/staleness_max"] for r in records) == k  # the sampler really ran ahead by k


def test_the_learner_does_not_wait_for_a_busy_sampler():
    # Sampling 0.3 s, learning 0.6 s: synchronously every step waits 0.3 s for its batch; with K=1
    # the next batch is sampled during the update, so after the first step the batch is ready.
    records = _train(_collector(1, sample_s=0.3)[0], steps=5, learn_s=0.6)
    assert records[0]["waited"] > 0.25
    assert all(r["waited"] < 0.15 for r in records[1:]), [round(r["waited"], 3) for r in records]
    assert all(r["async/learner_busy_frac"] > 0.75 for r in records[1:])
    assert all(0.2 < r["async/sampler_busy_frac"] < 0.8 for r in records[1:])  # 0.3 s of each ~0.6 s step


def test_a_mis_tagged_batch_is_never_trained_on():
    collector, _ = _collector(1, sample_s=0.0, engine=FakeEngine(lag=3))
    with pytest.raises(RuntimeError, match="bounded staleness broken"):
        _train(collector, steps=3, learn_s=0.0)
    collector.close()


def test_the_checkpointed_position_is_that_of_the_first_batch_not_trained_on():
    collector, sampler = _collector(2, sample_s=0.0)
    collector.next(1)
    collector.sync_weights(None, 1)
    deadline = time.monotonic() + 5
    while sampler.pos < 16 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert sampler.pos == 16  # version 1 published: batches 2, 3 and 4 (trained at versions <= 1 + 2) are drawn
    assert collector.position()["sampler"] == {"epoch": 0, "pos": 4}  # after batch 1: batch 2 is drawn again
    collector.close()
    assert collector.engine.closed and not any(t.name == "grpoplus-rollouts" for t in threading.enumerate())
