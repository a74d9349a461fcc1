"""``grpoplus selftest``: check a machine before a run is booked on it.

One line per check, a summary, ``selftest.json`` in ``--out``, exit code 1 when a check fails. The environment
(torch, CUDA, driver, NCCL, the device, its memory, bf16 and TF32), then on the chosen device with the built-in
nano model: the hf engine's log-probs against the learner's (fp32 and bf16_mixed), the chunked head, a bf16_mixed
update, LoRA, one rank of fsdp2 / fsdp2 with cpu_offload / DDP against the plain learner, a checkpoint resumed bit
for bit, and a short main job whose held-out accuracy rises::

    grpoplus selftest --device cuda --out selftest/
    grpoplus selftest --device cpu --only engine_logprobs,chunked_head

A failed check is one line naming the cause (an out-of-memory error with the device's free memory); the other
checks still run. It runs installed or from a source tree (``PYTHONPATH=. python -m grpoplus selftest``).
"""

from __future__ import annotations

from pathlib import Path

from grpoplus.selftest import job_checks, learner_checks, rank_checks  # noqa: F401 - registers the checks in order
from grpoplus.selftest.runner import CHECKS, Report, run_checks

__all__ = ["CHECKS", "Report", "run_checks", "register_selftest"]


def register_selftest(subparsers) -> None:
    p = subparsers.add_parser("selftest", help="check this machine (device, bf16, NCCL, engine vs learner, "
                                               "checkpoints, a short job) before booking a run on it",
                              description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--out", default=None, help="directory to write selftest.json into")
    p.add_argument("--only", default=None, metavar="NAMES",
                   help=f"comma-separated checks to run (default all): {', '.join(c.name for c in CHECKS)}")
    p.add_argument("--quick", action="store_true", help="a shorter main job (30 steps; accuracy need only rise)")
    p.set_defaults(func=_selftest)


def _selftest(args) -> int:
    only = [name.strip() for name in args.only.split(",") if name.strip()] if args.only else None
    report = run_checks(args.device, only, Path(args.out) if args.out else None, quick=args.quick)
    return 1 if report.failed else 0
