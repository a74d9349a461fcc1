"""The Ray cluster of ``cluster=ray``: starting or joining it, checking that the roles fit, and
waiting on a role with a time limit and an error that names it.

``ray.address`` unset starts a local Ray instance (``ray.init()``); ``auto`` or ``host:port``
joins a running cluster (``ray start --head`` on the head node, ``ray start --address=...``
on the others). A run started inside a driver that already called ``ray.init`` uses that
instance and leaves it running.
"""

from __future__ import annotations

import socket

import ray
import ray.exceptions

from grpoplus.core.endpoints import cluster_address
from grpoplus.distributed.group import RESUME_HINT, RoleError, first_line

PROBE_TIMEOUT_S = 30.0  # longest to wait for a cluster address to accept a TCP connection


class RoleDied(RoleError):
    """The process of a role (a Ray actor) died: ``"<role> died during <what> (<cause>); <resume hint>"``."""

    def with_fix(self, fix: str) -> "RoleDied":
        """The same death with ``fix`` (what to do) between its description and the resume hint."""
        what, _, hint = str(self).partition("; ")
        return RoleDied(f"{what}{fix}; {hint}")


class Cluster:
    """A connection to Ray; ``close`` shuts down only what this run started."""

    def __init__(self, address: str | None, num_cpus: int | None, timeout_s: float):
        self.owned = not ray.is_initialized()
        if not self.owned:
            return
        if address not in (None, "auto"):
            probe(address, timeout_s)
        kwargs = {"include_dashboard": False} if address is None else {"address": address}
        if address is None and num_cpus is not None:
            kwargs["num_cpus"] = num_cpus
        try:  # a host:port was probed above; "auto" fails at once when no cluster runs here
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise RoleError(f"cluster: could not join Ray at {address!r} ({first_line(err)}); start it with "
                            "`ray start --head` on the head node, or leave ray.address unset to start a local "
                            "instance") from err

    def require_gpus(self, needed: int, roles: str) -> None:
        """A configuration that cannot fit is an error now, not actors that wait forever to be placed."""
        have = int(ray.cluster_resources().get("GPU", 0))
        if needed > have:
            raise ValueError(f"{roles} need {needed} GPUs (one per role with learner.device=cuda) but the Ray "
                             f"cluster has {have}: lower rollout.workers or learner.data_parallel, or add GPU nodes")

    def close(self) -> None:
        if self.owned and ray.is_initialized():
            ray.shutdown()


def role_resources(gpu: bool) -> dict:
    """Ray resources of one rollout worker or learner rank: a GPU each on GPUs; on CPUs none reserved
    (Ray's own default for a running actor), so a small machine holds every role."""
    return {"num_gpus": 1} if gpu else {"num_cpus": 0}


def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """A ``host:port`` that does not accept a connection is an error within ``timeout_s`` (at most
    :data:`PROBE_TIMEOUT_S`)."""
    timeout_s = min(timeout_s, PROBE_TIMEOUT_S)
    host, port = cluster_address(address)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as err:
        raise RoleError(f"cluster: the Ray cluster at {address} did not answer within {timeout_s:.0f} s "
                        f"({first_line(err)}); start it with `ray start --head --port={port}` on {host}, check "
                        "ray.address, or leave it unset to start a local Ray instance") from err


def wait(ref, timeout_s: float, role: str, what: str):
    """``ray.get(ref)`` within ``timeout_s``; a failure raises the role's own error (one line), a death or
    a silence a :class:`RoleError` naming ``role`` and ``what`` it was doing."""
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise RoleError(f"{role} did not finish {what} within {timeout_s:.0f} s (ray.timeout_s); it is stuck or the "
                        f"cluster lacks the resources to place it; {RESUME_HINT}") from None
    except ray.exceptions.RayTaskError as err:
        cause = getattr(err, "cause", None)
        if isinstance(cause, Exception):
            raise cause from None  # the role's own error (a RoleError, EngineError, RewardError, ...)
        raise RoleError(f"{role} failed during {what} ({first_line(err)}); {RESUME_HINT}") from err
    except ray.exceptions.RayActorError as err:
        raise RoleDied(f"{role} died during {what} ({first_line(err)}); {RESUME_HINT}") from err
