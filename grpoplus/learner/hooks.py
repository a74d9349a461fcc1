"""What the learner ranks' strategy supplies to an update: the learner's update knows one process, and these hooks
say how its micro-batches meet the other learner ranks (grpoplus.distributed.rank_hooks implements them).

:class:`UpdateHooks` itself is one process: every micro-batch is this rank's, the training forward
is the plain call, nothing is synchronised and the results stay as they are.
"""

from __future__ import annotations

from contextlib import nullcontext


class UpdateHooks:
    """One process's update (the base of every strategy's hooks)."""

    def share(self, micro: list) -> tuple[list, list]:
        """(this rank's micro-batches, the stand-ins it also runs: micro-batches forwarded and backpropagated
        with no loss, so that every rank runs the collectives its peers run)."""
        return micro, []

    def score(self, fn, rollouts):
        """The no-grad passes of the batch's preparation (logp_old, logp_ref): ``fn(rows)`` returns a tuple of
        [rows, T] CPU tensors (or None) for a :class:`~grpoplus.containers.Rollouts`; one process scores every row."""
        return fn(rollouts)

    def forward(self, fn, model, *args, **kwargs):
        """The training forward ``fn(model, *args, **kwargs)`` (through the strategy's wrapper, which then
        synchronises the gradients in the backward)."""
        return fn(model, *args, **kwargs)

    def backward_scope(self, last: bool):
        """Context around one micro-batch's forward and backward; ``last``: this rank's last one of the
        mini-batch (where accumulated gradients are synchronised)."""
        return nullcontext()

    def gather(self, parts: list, tally):
        """Every rank's micro-batch results in the order one process makes them, and the routing counts
        (a ``RoutingTally`` or None) added up over the ranks."""
        return parts, tally


ONE_PROCESS = UpdateHooks()
