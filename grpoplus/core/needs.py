"""What a run needs of the machine it starts on, noted instead of raised while a dry run checks a config.

A config is checked for two reasons. Before a run, a missing package, GPU or CPU core stops it in
one line, before anything loads. In a dry run (``grpoplus train --dry-run``) the config is often
meant for another machine: a GPU cluster's recipe checked on a laptop without CUDA, vLLM or Ray.
The checks that depend on the machine call :func:`unmet`; inside :func:`collecting` their message is
noted and the check goes on, so the dry run lists every need at once, while a bad value (an unknown
key, a choice outside its list, an impossible combination) still raises as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_NOTED: ContextVar[list[str] | None] = ContextVar("grpoplus_needs", default=None)


@contextmanager
def collecting() -> Iterator[list[str]]:
    """Within the block, :func:`unmet` appends its message to the yielded list instead of raising."""
    noted: list[str] = []
    token = _NOTED.set(noted)
    try:
        yield noted
    finally:
        _NOTED.reset(token)


def unmet(error: Exception) -> None:
    """Raise ``error`` (a requirement this machine does not meet), or note its message inside :func:`collecting`."""
    noted = _NOTED.get()
    if noted is None:
        raise error
    message = str(error)
    if message not in noted:
        noted.append(message)
