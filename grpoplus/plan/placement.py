"""Where each role of a run runs, and which copy of the policy it holds: derived from the config once, read by the
assembly that builds the roles and by the dry run that describes them (so the two cannot disagree)."""

from __future__ import annotations

from grpoplus.config import Config


def shards(cfg: Config) -> int:
    """How many ranks the learner's training state is split over (1: every rank holds it whole)."""
    return cfg.learner.data_parallel if cfg.learner.sharded else 1


def on_gpus(cfg: Config) -> bool:
    return cfg.learner.device.startswith("cuda")


def process_device(cfg: Config) -> str:
    """The device of a role's own process (a learner rank, a Ray actor): one GPU per process is ``cuda``."""
    return "cuda" if on_gpus(cfg) else cfg.learner.device


def whole_copy_in_host_memory(cfg: Config) -> bool:
    """True when a sharded learner's rank 0 on GPUs keeps its whole copy of the policy (checkpoints, weights to the
    engines) in host memory rather than on its GPU: no engine samples with that copy in rank 0's process (vLLM holds
    its own weights, Ray's rollout workers theirs), so rank 0's GPU holds only its shards, like the other ranks'."""
    return on_gpus(cfg) and cfg.learner.sharded and (cfg.run.cluster == "ray" or cfg.rollout.engine == "vllm")


def driver_copy_in_host_memory(cfg: Config) -> bool:
    """True when the driver (rank 0's process) loads the policy into host memory: on Ray the roles load their own,
    and a sharded learner's rank 0 may keep its copy there (:func:`whole_copy_in_host_memory`)."""
    return cfg.run.cluster == "ray" or whole_copy_in_host_memory(cfg)
