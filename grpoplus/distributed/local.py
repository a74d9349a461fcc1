"""Learner ranks on this machine: started by the run itself, or by torchrun.

``cluster=local learner.data_parallel=N``: the ``grpoplus train`` process is rank 0 (it also
collects rollouts, evaluates and writes the run directory) and starts ranks 1..N-1 as
spawned processes that only take part in updates. Under ``torchrun --nproc_per_node=N
grpoplus train ... learner.data_parallel=N`` every rank runs the same command; rank 0 goes
on as above and the others follow it (:func:`follow_torchrun`).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time

from grpoplus.distributed.group import RankGroup, Rendezvous, RoleError, free_port
from grpoplus.distributed.learner import RankBuilders, follow
from grpoplus.plan.run import LearnerRolePlan


def torchrun_follower(ranks: int) -> bool:
    """True in a rank > 0 that torchrun (or any env:// launcher) started; every rank checks that
    torchrun started as many ranks as ``learner.data_parallel`` (``ranks``) asks for."""
    if "WORLD_SIZE" not in os.environ:
        return False
    if int(os.environ["WORLD_SIZE"]) != ranks:
        raise ValueError(f"torchrun started {os.environ['WORLD_SIZE']} ranks but learner.data_parallel="
                         f"{ranks}: give the same number to both (--nproc_per_node x --nnodes "
                         "= learner.data_parallel)")
    return int(os.environ.get("RANK", "0")) > 0


def rank_device(device: str, local_rank: int) -> str:
    """The device of one rank: ``cuda`` means one GPU per rank, by local rank; the CPU is shared."""
    return f"cuda:{local_rank}" if device == "cuda" else device


def start_ranks(role: LearnerRolePlan, builders: RankBuilders) -> tuple[Rendezvous, "LocalRanks | None"]:
    """Rank 0's rendezvous; ranks 1..N-1 are started here (each building itself from its ``role`` plan with
    ``builders``) unless torchrun started them."""
    world, device, timeout_s = role.ranks, role.process.device, role.collective_timeout_s
    if "WORLD_SIZE" in os.environ:  # torchrun started the ranks (torchrun_follower checked their number)
        return Rendezvous("env://", 0, world, rank_device(device, int(os.environ.get("LOCAL_RANK", "0"))),
                          timeout_s), None
    init = f"tcp://127.0.0.1:{free_port()}"
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no fork of a process holding threads
    procs = [ctx.Process(target=run_follower,
                         args=(role, Rendezvous(init, r, world, rank_device(device, r), timeout_s), builders),
                         name=f"grpoplus-learner-rank{r}", daemon=True) for r in range(1, world)]
    for proc in procs:
        proc.start()
    return Rendezvous(init, 0, world, rank_device(device, 0), timeout_s), LocalRanks(procs)


class LocalRanks:
    """The follower processes this run started: their state for error messages, and their end."""

    def __init__(self, procs: list):
        self.procs = procs

    def describe(self, grace_s: float = 2.0) -> str:
        """The followers that have exited, with their codes. A killed process closes its connections before its exit
        status can be read, so a peer's broken connection may be seen first: each is waited for up to ``grace_s`` in
        all (only on the way to an error)."""
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        dead = [f"learner rank {r} (pid {p.pid}) exited with code {p.exitcode}"
                for r, p in enumerate(self.procs, start=1) if p.exitcode is not None]
        return ", ".join(dead)

    def close(self, timeout_s: float = 30.0) -> None:
        for proc in self.procs:
            proc.join(timeout=timeout_s)
            if proc.is_alive():
                proc.kill()
                proc.join()


def follow_torchrun(role: LearnerRolePlan, builders: RankBuilders) -> None:
    """A torchrun rank > 0: build the learner parts and follow rank 0 until it stops."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    run_follower(role, Rendezvous("env://", int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                                  rank_device(role.process.device, local_rank), role.collective_timeout_s), builders)


def run_follower(role: LearnerRolePlan, rendezvous: Rendezvous, builders: RankBuilders) -> None:
    """Entry point of a follower rank: its policy, the group, its parts, rank 0's commands until stop."""
    try:
        model = builders.model(role, rendezvous.device, rendezvous.rank)
        group = RankGroup.join(rendezvous)
        try:
            parts, plan = builders.parts(role, model, group)
            follow(parts, role.algo, plan, group)
        finally:
            group.close()
    except RoleError as err:
        print(f"grpoplus learner rank {rendezvous.rank}: error: {err}", file=sys.stderr)
        sys.exit(1)
