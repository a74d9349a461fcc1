"""Where each step's rollouts come from: now, or ahead of the learner with bounded staleness.

Policy versions count rollout batches trained on: the learner trains step ``t`` at version
``t - 1`` and publishes version ``t`` after it. A batch sampled with version ``v`` and
trained at step ``t`` has staleness ``(t - 1) - v``.

- :class:`Synchronous` (``rollout.max_staleness = 0``): the step's rollouts are collected when
  the step asks for them, with the weights just published: today's loop, unchanged.
- :class:`BoundedStaleness` (``K >= 1``): a background thread collects the batches of later
  steps while the learner trains (AReaL, Fu et al. 2025, arXiv:2505.24298; one-step-off
  pipelining in verl and prime-rl is ``K = 1``). It starts the batch of step ``s`` only once
  version ``s - 1 - K`` is published, so that batch is trained at most ``K`` versions late;
  every batch's version tags are checked again before it is trained on. The gap between
  the sampler's ``logp_roll`` and the learner's ``logp_old`` then holds real staleness,
  which the corrections of ALGORITHMS.md section 5 and ``learner.logp_old=recompute`` address.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

import torch

from grpoplus.containers import Collected, Rollouts, SamplingParams
from grpoplus.data.order import PromptSampler
from grpoplus.rollout.weights import StateDict, snapshot


def position(sampler: PromptSampler, generator: torch.Generator) -> dict:
    """The data position and sampling generator: where the next collection starts (checkpointed)."""
    return {"sampler": sampler.state(), "generator": generator.get_state()}


class Synchronous:
    """Collect each step's rollouts when the step asks for them."""

    def __init__(self, collect_step: Callable[[], Collected], sampler: PromptSampler, generator: torch.Generator):
        self.collect_step, self.sampler, self.generator = collect_step, sampler, generator

    def next(self, step: int) -> Collected:
        return self.collect_step()

    def position(self) -> dict:
        return position(self.sampler, self.generator)

    def load(self, state: dict) -> None:
        self.sampler.load(state["sampler"])
        self.generator.set_state(state["generator"])

    def close(self) -> None:
        """Nothing runs in the background."""


class BoundedStaleness:
    """Collect later steps' rollouts in a background thread, at most ``max_staleness`` versions ahead.

    It is a weight target of the learner (``sync_weights``): it passes the weights to its
    engine and learns which version is published, which gates the next collection.
    """

    def __init__(self, collect_step: Callable[[], Collected], engine, sampler: PromptSampler,
                 generator: torch.Generator, max_staleness: int):
        self.collect_step, self.engine, self.sampler, self.generator = collect_step, engine, sampler, generator
        self.max_staleness = max_staleness
        self._cond = threading.Condition()
        self._ready: deque = deque()  # (step, Collected, position before it, version it started with)
        self._published = 0  # newest version sent to the engine
        self._next = 0  # the step the background thread collects next
        self._inflight = None  # (position before, version) of the collection under way
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._stop = False
        self._sampler_busy_s = 0.0
        self._last_take: tuple[float, float] | None = None  # (time, sampler busy seconds) when the last batch was taken

    def sync_weights(self, weights, version: int) -> None:
        """Pass the learner's weights to the engine; collections that start from now use them."""
        self.engine.sync_weights(weights, version)
        with self._cond:
            self._published = version
            self._cond.notify_all()

    def next(self, step: int) -> Collected:
        """The rollouts to train on at ``step`` (learner version ``step - 1``), with the async/* metrics."""
        if self._thread is None:
            self._next = step
            self._thread = threading.Thread(target=self._run, name="grpoplus-rollouts", daemon=True)
            self._thread.start()
        t0 = time.perf_counter()
        with self._cond:
            self._cond.wait_for(lambda: self._ready or self._error is not None)
            if self._error is not None:
                raise self._error
            got, collected, _, started = self._ready.popleft()
            busy = self._sampler_busy_s
        now = time.perf_counter()
        self._check(step, got, collected)
        collected.metrics.update(self._metrics(step, collected, started, now - t0, now, busy))
        return collected

    def position(self) -> dict:
        """Where the oldest collection not yet trained on started (a resumed run collects it again)."""
        with self._cond:
            if self._ready:
                return self._ready[0][2]
            if self._inflight is not None:
                return self._inflight[0]
            return position(self.sampler, self.generator)

    def load(self, state: dict) -> None:
        if self._thread is not None:
            raise RuntimeError("BoundedStaleness.load must come before the first batch is collected")
        self.sampler.load(state["sampler"])
        self.generator.set_state(state["generator"])

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5.0)  # a collection under way finishes on its own (engine time limits)
        self.engine.close()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._stop or self._published >= self._next - 1 - self.max_staleness)
                    if self._stop:
                        return
                    step, self._inflight = self._next, (position(self.sampler, self.generator), self._published)
                t0 = time.perf_counter()
                collected = self.collect_step()
                with self._cond:
                    self._sampler_busy_s += time.perf_counter() - t0
                    self._ready.append((step, collected, *self._inflight))
                    self._inflight, self._next = None, step + 1
                    self._cond.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the training thread, which raises it
            with self._cond:
                self._error = err
                self._cond.notify_all()

    def _check(self, step: int, got: int, collected: Collected) -> None:
        """Never train beyond the bound: the version tags of every round of the batch are checked."""
        oldest = min(s.rollouts.policy_version for s in collected.drawn)
        if got != step or (step - 1) - oldest > self.max_staleness:
            raise RuntimeError(f"bounded staleness broken: the batch for step {step} (collected as step {got}) was "
                               f"sampled with policy version {oldest}, more than rollout.max_staleness="
                               f"{self.max_staleness} behind version {step - 1}; an engine tags its rollouts with "
                               "a version it did not sample with")

    def _metrics(self, step: int, collected: Collected, started: int, waited: float, now: float,
                 busy: float) -> dict[str, float]:
        """Staleness of the batch's rows, version lag, and busy fractions since the previous batch was taken."""
        rows = torch.cat([torch.full((len(s.rewards),), float((step - 1) - s.rollouts.policy_version))
                          for s in collected.drawn])
        out = {"async/staleness_mean": float(rows.mean()), "async/staleness_max": float(rows.max()),
               "async/version_lag": float((step - 1) - started)}
        if self._last_take is not None:
            interval = max(now - self._last_take[0], 1e-9)
            out["async/sampler_busy_frac"] = min(1.0, (busy - self._last_take[1]) / interval)
            out["async/learner_busy_frac"] = max(0.0, 1.0 - waited / interval)
        self._last_take = (now, busy)
        return out


class SnapshotEngine:
    """A rollout engine on its own copy of the policy, so it can sample while the learner updates.

    ``sync_weights`` snapshots the learner's weights at once (that version: the learner goes on
    changing them) and the engine loads the snapshot into its copy before its next ``generate``;
    calls come from two threads.
    """

    def __init__(self, engine):
        self.engine = engine
        self.name, self.pad_id = engine.name, engine.pad_id
        self._lock = threading.Lock()
        self._pending: tuple[StateDict, int] | None = None

    def sync_weights(self, weights, version: int) -> None:
        taken = snapshot(weights)
        with self._lock:
            self._pending = (taken, version)

    def generate(self, prompts: list[str], params: SamplingParams, prompt_index: list[int] | None = None,
                 generator: torch.Generator | None = None, **per_prompt) -> Rollouts:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self.engine.sync_weights(*pending)
        return self.engine.generate(prompts, params, prompt_index=prompt_index, generator=generator, **per_prompt)

    def offload(self) -> None:
        """The sampler keeps its memory: it works while the learner updates."""

    def close(self) -> None:
        self.engine.close()
