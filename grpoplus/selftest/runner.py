"""Running the checks: each isolated (a failure is one line and the next check still runs), timed, its peak
memory measured, the results printed one line each and written as JSON.

A check is a function ``fn(ctx) -> figures`` registered with :func:`check`: it raises :class:`CheckFailed`
when the property it checks does not hold, :class:`CheckSkipped` when it does not apply here (a GPU-only
setting on a CPU, a package that is not installed). Any other exception is a failure too, reported in one
line (an out-of-memory error with the device's free memory).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from grpoplus.selftest.environment import device_problem, environment


class CheckFailed(Exception):
    """The property a check verifies does not hold (the message says what was measured and what was expected)."""


class CheckSkipped(Exception):
    """The check does not apply on this machine (the message says why)."""


STAGES = ("process", "rank", "trainer")
"""The order checks run in: one process's pieces first, then one rank of a process group, then whole runs."""

ENVIRONMENT = "environment"
"""The name of the report's first result: whether the device can run the checks at all. It is not a check."""


@dataclass(frozen=True)
class Check:
    name: str
    stage: str  # one of STAGES
    what: str  # one line: the property checked
    fn: Callable[["Context"], dict]


CHECKS: list[Check] = []
"""Every check, in the order they run (:data:`STAGES`, then the order each stage's module registers them)."""


def check(name: str, stage: str, what: str) -> Callable:
    """Register ``fn(ctx) -> figures`` as the check ``name`` of ``stage``."""
    if stage not in STAGES:
        raise ValueError(f"selftest stage {stage!r} is not one of {', '.join(STAGES)}")
    if name == ENVIRONMENT:
        raise ValueError(f"selftest check name {name!r} is the report's environment line: choose another")

    def register(fn):
        if any(c.name == name for c in CHECKS):
            raise ValueError(f"selftest check {name!r} is already registered")
        CHECKS.append(Check(name, stage, what, fn))
        CHECKS.sort(key=lambda c: STAGES.index(c.stage))  # stable: a stage keeps its registration order
        return fn
    return register


@dataclass
class Context:
    """What every check gets: the device, a scratch directory of its own, and whether the quick sizes are asked."""

    device: torch.device
    scratch: Path
    quick: bool = False

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"


@dataclass
class Result:
    name: str
    status: str  # pass | fail | skip
    seconds: float
    message: str = ""  # the failure's or skip's one line; empty on a pass
    peak_mb: float | None = None  # the device's peak allocated memory during the check (GPU), or None
    figures: dict = field(default_factory=dict)

    def line(self) -> str:
        peak = "" if self.peak_mb is None else f", peak {self.peak_mb:,.0f} MB"
        head = f"{self.status.upper():4} {self.name:<22} {self.seconds:6.1f} s{peak}"
        shown = self.message or ", ".join(f"{k} {_short(v)}" for k, v in self.figures.items())
        return f"{head}  {shown}" if shown else head


@dataclass
class Report:
    environment: dict
    results: list[Result]

    @property
    def failed(self) -> list[Result]:
        """Every failed result, the environment's included (the exit code follows it)."""
        return [r for r in self.results if r.status == "fail"]

    @property
    def checks(self) -> list[Result]:
        """The checks' results: every result but the environment's."""
        return [r for r in self.results if r.name != ENVIRONMENT]

    def summary(self) -> str:
        """One line counting the checks (not the environment line); names the failed ones."""
        checks = self.checks
        counts = {s: sum(r.status == s for r in checks) for s in ("pass", "fail", "skip")}
        took = sum(r.seconds for r in checks)
        failed = [r.name for r in checks if r.status == "fail"]
        names = f": {', '.join(failed)}" if failed else ""
        env_failed = any(r.name == ENVIRONMENT for r in self.failed)
        return (f"selftest on {self.environment.get('device_name', self.environment['device'])}: "
                f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped in {took:.0f} s{names}"
                f"{'; the environment failed, so no check ran' if env_failed else ''}")

    def to_json(self) -> dict:
        return {"environment": self.environment, "results": [asdict(r) for r in self.results],
                "summary": self.summary()}


def run_checks(device: str, only: list[str] | None = None, out: Path | None = None, quick: bool = False,
               checks: list[Check] | None = None, echo: Callable[[str], None] = print) -> Report:
    """Run ``checks`` (default every registered one, or those named in ``only``) on ``device``; print a line per
    check as it ends, and write ``selftest.json`` into ``out`` when given."""
    chosen = select(checks if checks is not None else CHECKS, only)
    env = environment(device)
    problem = device_problem(device)
    echo(_environment_line(env, problem))
    results = [Result(ENVIRONMENT, "fail" if problem else "pass", 0.0, problem or "", figures={})]
    with tempfile.TemporaryDirectory(prefix="grpoplus-selftest-") as scratch:
        for item in chosen:
            if problem is not None:
                result = Result(item.name, "skip", 0.0, f"not run: {device} cannot run it (see environment)")
            else:
                ctx = Context(torch.device(device), Path(scratch) / item.name, quick)
                ctx.scratch.mkdir()
                result = run_one(item, ctx)
            results.append(result)
            echo(result.line())
    report = Report(env, results)
    echo(report.summary())
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "selftest.json").write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n")
    return report


def select(checks: list[Check], only: list[str] | None) -> list[Check]:
    if not only:
        return list(checks)
    known = [c.name for c in checks]
    unknown = [name for name in only if name not in known]
    if unknown:
        raise ValueError(f"unknown selftest check(s) {', '.join(unknown)}; choose from: {', '.join(known)}")
    return [c for c in checks if c.name in only]


def run_one(item: Check, ctx: Context) -> Result:
    """One check, isolated: its outcome, time and peak memory; any exception becomes a one-line failure."""
    gpu = ctx.on_gpu
    if gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(ctx.device)
    t0 = time.perf_counter()
    status, message, figures = "pass", "", {}
    try:
        figures = item.fn(ctx) or {}
    except CheckSkipped as err:
        status, message = "skip", str(err)
    except CheckFailed as err:
        status, message = "fail", str(err)
    except torch.OutOfMemoryError as err:
        status, message = "fail", _oom_line(ctx, err)
    except Exception as err:  # noqa: BLE001 - the boundary: one line per failed check, the next one still runs
        status, message = "fail", _error_line(err)
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(ctx.device) / 1e6 if gpu else None
    if gpu:
        torch.cuda.empty_cache()
    return Result(item.name, status, round(seconds, 2), message, None if peak is None else round(peak, 1), figures)


def _error_line(err: BaseException) -> str:
    """``Type: first line of the message (at file:line)``: where inside grpoplus or torch it was raised; a missing
    package: the ``pip install`` that adds it."""
    if isinstance(err, ImportError):
        from grpoplus.core.packages import install_hint

        return install_hint(err)
    first = (str(err).strip().splitlines() or [""])[0]
    frames = traceback.extract_tb(err.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(err).__name__}: {first}{where}"


def _oom_line(ctx: Context, err: BaseException) -> str:
    if ctx.on_gpu:
        free, total = torch.cuda.mem_get_info(ctx.device)
        where = f"{ctx.device} ({free / 1e9:.1f} GB free of {total / 1e9:.1f} GB)"
    else:
        where = "the CPU"
    return f"out of memory on {where}: {(str(err).splitlines() or [''])[0][:160]}"


def _environment_line(env: dict, problem: str | None) -> str:
    if problem:
        return f"FAIL environment  {problem}"
    if env["device"] == "cpu":
        flags = " ".join(env["cpu_flags"]) or "none of " + " ".join(("avx2", "avx512_bf16", "amx"))
        return (f"PASS environment  torch {env['torch']}, transformers {env['transformers']}, CPU {env['cpu_cores']} "
                f"cores ({flags}), bf16 {'native' if env['bf16_native'] else 'emulated'}, float32 products by "
                f"{env['fp32_products']} (learner.cpu_matmul=auto)")
    return (f"PASS environment  torch {env['torch']} (CUDA {env['cuda']}, driver {env['driver'] or '?'}, NCCL "
            f"{env['nccl'] or 'missing'}), transformers {env['transformers']}, {env['device_name']} "
            f"{env['memory_total_gb']} GB ({env['memory_free_gb']} GB free), capability {env['capability']}, bf16 "
            f"{'yes' if env['bf16_native'] else 'no'}, TF32 {'yes' if env['tf32'] else 'no'}")


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if math.isfinite(value) and value != 0 else str(value)
    return str(value)
