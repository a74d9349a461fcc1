"""Rollout workers on Ray: K actors, each with its own engine (hf or vllm), behind one engine.

:class:`RayRolloutEngine` keeps the rollout-engine contract (``generate``, ``sync_weights``,
``offload``, ``close``), so collection and evaluation do not know the workers exist. A
request's prompts are split into K contiguous parts, sampled in parallel and stacked again.

Random streams: worker 0 continues the caller's generator (its state goes with the request
and comes back advanced), the other workers draw from streams seeded from it. One worker
therefore samples exactly what the in-process engine samples, and a request sent again
samples the same responses.

A worker that dies is restarted by Ray (``ray.max_restarts``); the request it was serving is
sent again to the restarted worker after the newest weights, with the same random state, so
the step's data is what it would have been: no step is lost or sampled twice. With
``ray.weight_sync=collective`` the weights come by broadcast from learner rank 0
(:mod:`~grpoplus.distributed.weight_sync`) and a worker that dies ends the run instead.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import ray
import ray.exceptions
import torch

from grpoplus.containers import Rollouts, SamplingParams
from grpoplus.distributed.group import first_line
from grpoplus.distributed.ray_cluster import RoleDied, role_resources, wait
from grpoplus.distributed.weight_sync import WeightGroup, cannot_restart
from grpoplus.models.memory import give_back_freed_memory
from grpoplus.plan.run import RolloutRolePlan
from grpoplus.rollout.weights import Collective, InProcess, ObjectStore, StateDict, as_source, cpu_state_dict


@ray.remote
class RolloutWorker:
    """One rollout engine on its own copy of the policy."""

    def __init__(self, role: RolloutRolePlan, build):
        parts = build(role)  # grpoplus.assemble.factories.build_rollout_worker; the weights come with sync()
        self.model, self.engine, self.release_memory, self.device = parts.model, parts.engine, parts.release_memory, \
            parts.device

    def ready(self) -> int:
        return os.getpid()

    def generate(self, prompts: list[str], params: SamplingParams, prompt_index: list[int],
                 state: torch.Tensor, per_prompt: dict | None = None) -> tuple[Rollouts, torch.Tensor]:
        generator = torch.Generator()
        generator.set_state(state)
        rollouts = self.engine.generate(prompts, params, prompt_index=prompt_index, generator=generator,
                                        **(per_prompt or {}))
        if self.release_memory:
            give_back_freed_memory()  # the KV cache and decode work, between rollouts
        return rollouts, generator.get_state()

    def sync(self, weights: dict, version: int) -> None:
        """The object store's state dict (Ray resolves the reference), which the engine loads into its copy."""
        self.engine.sync_weights(StateDict(weights), version)

    def join_weight_sync(self, address: str, rank: int, world: int, timeout_s: float) -> None:
        self.weights_in = WeightGroup.join(address, rank, world, self.model, timeout_s, f"rollout worker {rank - 1}",
                                           self.device)

    def receive_weights(self, version: int) -> None:
        self.weights_in.broadcast(self.model)
        self.engine.sync_weights(InProcess(self.model), version)


class RayRolloutEngine:
    """K rollout workers as one rollout engine.

    ``sync_weights`` takes any :mod:`grpoplus.rollout.weights` source: an object-store reference to the learner's state
    dict (how learner rank 0 hands them over on Ray; a source in this process is put there), or the
    broadcast of ``collective`` weight sync; workers take them before their next request.
    """

    def __init__(self, role: RolloutRolePlan, weights: ObjectStore, workers: int, engine: str, pad_id: int, build, *,
                 seed: int, gpu: bool, max_restarts: int, timeout_s: float, start_timeout_s: float, collective: bool = False):
        self.name, self.pad_id, self.seed = f"{engine} on {workers} Ray rollout workers", pad_id, seed
        self.timeout_s, self.start_timeout_s, self.collective = timeout_s, start_timeout_s, collective
        self.max_restarts = 0 if collective else max_restarts  # a restarted worker cannot rejoin the broadcast group
        self._busy = threading.Lock()  # held by a request: a broadcast waits for the one in flight (bounded staleness)
        self.actors = [RolloutWorker.options(max_restarts=self.max_restarts, max_task_retries=0, **role_resources(gpu))
                       .remote(role, build) for _ in range(workers)]
        self.restarts = 0
        self.sync_weights(weights, 0)  # self._weights: the newest, sent again to a restarted worker
        for i, actor in enumerate(self.actors):
            wait(actor.ready.remote(), start_timeout_s, f"rollout worker {i}", "starting (building its engine)")

    def generate(self, prompts: list[str], params: SamplingParams, prompt_index: list[int] | None = None,
                 generator: torch.Generator | None = None, **per_prompt) -> Rollouts:
        """As the workers' engine's ``generate``; ``per_prompt``: its keyword inputs with one value per prompt (a
        vision-language policy's ``images`` or ``vision``), split with the prompts."""
        with self._busy:
            return self._generate(prompts, params, prompt_index, generator,
                                  {k: v for k, v in per_prompt.items() if v is not None})

    def _generate(self, prompts: list[str], params: SamplingParams, prompt_index: list[int] | None,
                  generator: torch.Generator | None, per_prompt: dict) -> Rollouts:
        index = list(prompt_index) if prompt_index is not None else list(range(len(prompts)))
        stream = generator if generator is not None else torch.Generator().manual_seed(self.seed)
        parts = [p.tolist() for p in torch.tensor_split(torch.arange(len(prompts)), len(self.actors)) if len(p)]
        states = _states(stream.get_state(), len(parts))
        requests = [([prompts[j] for j in part], params, [index[j] for j in part], state,
                     {k: [v[j] for j in part] for k, v in per_prompt.items()}) for part, state in zip(parts, states)]
        pending = [self.actors[i].generate.remote(*request) for i, request in enumerate(requests)]
        results = [self._result(i, ref, request) for i, (ref, request) in enumerate(zip(pending, requests))]
        if generator is not None:
            generator.set_state(results[0][1])  # worker 0 continued the caller's stream
        return Rollouts.concat([rollouts for rollouts, _ in results], self.pad_id)

    def sync_weights(self, weights, version: int) -> None:
        source = as_source(weights)
        if isinstance(source, Collective):
            with self._busy:  # every worker must be idle to take part in the broadcast
                source.broadcast.push(version)
            return
        if not isinstance(source, ObjectStore):
            source = ObjectStore(ray.put(cpu_state_dict(source)))
        self._weights = (source.ref, version)
        for actor in self.actors:
            actor.sync.remote(source.ref, version)  # runs before the worker's next request (actor call order)

    def offload(self) -> None:
        """Nothing to free: the workers hold their own devices, apart from the learner's."""

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []

    def _result(self, i: int, ref, request: tuple) -> tuple[Rollouts, torch.Tensor]:
        """Worker ``i``'s answer; if it died, wait for its restart, send the newest weights and the same request."""
        role, attempt = f"rollout worker {i}", 0
        while True:
            try:
                return wait(ref, self.timeout_s, role, f"sampling {len(request[0])} prompts")
            except RoleDied as err:
                if self.collective:
                    raise cannot_restart(err) from err.__cause__
                if attempt == self.max_restarts:
                    raise _gave_up(err, self.max_restarts) from err.__cause__
                attempt += 1
                print(f"grpoplus: {role} died ({first_line(err.__cause__)}); waiting for its restart, then sending "
                      "its request again", file=sys.stderr)
                self._await_restart(i, f"restarting (restart {attempt} of ray.max_restarts={self.max_restarts})")
                self.restarts += 1
                self.actors[i].sync.remote(*self._weights)
                ref = self.actors[i].generate.remote(*request)


    def _await_restart(self, i: int, what: str) -> None:
        """Wait until Ray has restarted worker ``i`` (calls fail as 'unavailable' meanwhile)."""
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                wait(self.actors[i].ready.remote(), max(1.0, deadline - time.monotonic()), f"rollout worker {i}", what)
                return
            except RoleDied as err:
                if not isinstance(err.__cause__, ray.exceptions.ActorUnavailableError) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def _gave_up(err: RoleDied, max_restarts: int) -> RoleDied:
    """The death that ends the run: the role's own message, with the restart budget it used up."""
    used = f"its {max_restarts} restart(s) (ray.max_restarts={max_restarts}) are used up" if max_restarts else \
        "ray.max_restarts=0 allows no restart"
    return err.with_fix(f", and {used}: raise ray.max_restarts, or read the worker's log (Ray's session logs, "
                        "/tmp/ray/session_latest/logs) for why it died")


def _states(state: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """Generator states of the parts: the caller's for part 0, streams seeded from a copy of it for the others."""
    copy = torch.Generator()
    copy.set_state(state)
    seeds = torch.randint(0, 2**62, (parts - 1,), generator=copy).tolist()
    return [state] + [torch.Generator().manual_seed(s).get_state() for s in seeds]
