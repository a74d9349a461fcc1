"""The ``report``, ``compare`` and ``doctor`` sub-commands of the ``grpoplus`` CLI.

``register_commands(subparsers)`` adds them to an argparse sub-parser set; each parser's
``func(args) -> int`` returns the exit code: 0 success (doctor: healthy or warnings only),
1 doctor found something severe, 2 bad input (missing run directory or metrics file, bad
threshold).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grpoplus.rundir import RunDir

from .doctor import Finding, diagnose, parse_thresholds
from .writer import read_metrics

EXIT_OK, EXIT_SEVERE, EXIT_BAD_INPUT = 0, 1, 2


def load_run(run_dir: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(metric records, resolved config or {}) of a run directory.

    Raises:
        FileNotFoundError: the directory or its metrics.jsonl is missing.
        ValueError: the metrics file holds no record, or config.yaml is not a mapping.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"run directory {path} does not exist")
    records = read_metrics(path)
    if not records:
        raise ValueError(f"{path / 'metrics.jsonl'} holds no records yet")
    config: dict[str, Any] = {}
    config_path = RunDir(path).config
    if config_path.is_file():
        import yaml

        config = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
        if not isinstance(config, dict):
            raise ValueError(f"{config_path} is not a YAML mapping")
    return records, config


def batch_info_from_config(config: dict[str, Any]) -> dict[str, Any]:
    """Batch facts the doctor uses when the records lack ``batch/responses``."""
    rollout = config.get("rollout") or {}
    return {k: rollout[k] for k in ("group_size",) if k in rollout}


def run_label(run_dir: str, config: dict[str, Any]) -> str:
    """``"<run name>: <preset> <overrides>"`` for compare's legend."""
    run = config.get("run") or {}
    preset = run.get("preset") or (config.get("algo") or {}).get("preset") or "(no preset)"
    overrides = " ".join(str(o) for o in run.get("overrides") or [])
    return f"{Path(run_dir).resolve().name}: {preset} {overrides}".rstrip()


def _smooth(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"--smooth must be in [0, 1), got {value}")
    return value


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def cmd_report(args: argparse.Namespace) -> int:
    from .plots import write_report

    try:
        records, config = load_run(args.run)
    except (FileNotFoundError, ValueError) as err:
        return _fail(str(err))
    out = Path(args.out) if args.out else RunDir(args.run).report
    findings = diagnose(records, batch_info=batch_info_from_config(config))
    written = write_report(records, out, f"grpoplus report: {run_label(args.run, config)}",
                           findings, smooth=args.smooth)
    print(f"wrote {len(written)} panels and {out / 'index.html'}")
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from .plots import write_compare

    runs, labels = [], []
    for run in args.runs:
        try:
            records, config = load_run(run)
        except (FileNotFoundError, ValueError) as err:
            return _fail(str(err))
        runs.append(records)
        labels.append(run_label(run, config))
    written = write_compare(runs, labels, args.out, smooth=args.smooth)
    print(f"wrote {len(written)} panels and {Path(args.out) / 'index.html'}")
    return EXIT_OK


def format_findings(findings: list[Finding]) -> str:
    """Severe findings first, each with its evidence and fix; "healthy" when none."""
    if not findings:
        return "healthy: no finding fired"
    ordered = sorted(findings, key=lambda f: f.severity != "severe")
    return "\n".join(
        f"{f.severity.upper():8s}{f.code}: {f.title}\n  evidence: {f.evidence}\n  fix: {f.fix}"
        for f in ordered
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    try:
        thresholds = parse_thresholds(args.threshold or [])
        records, config = load_run(args.run)
    except (FileNotFoundError, ValueError) as err:
        return _fail(str(err))
    findings = diagnose(records, thresholds, batch_info_from_config(config))
    if args.json:
        print(json.dumps([f.__dict__ for f in findings], indent=2))
    else:
        steps = [r["step"] for r in records]
        print(f"grpoplus doctor: {args.run} ({len(records)} records, "
              f"steps {min(steps)}-{max(steps)})")
        print(format_findings(findings))
    severe = any(f.severity == "severe" for f in findings)
    return EXIT_SEVERE if severe else EXIT_OK


def register_commands(subparsers: Any) -> None:
    """Add ``report``, ``compare`` and ``doctor`` to an argparse sub-parsers object."""
    smooth_help = (
        "EMA weight of the smoothed line, 0 (raw) to <1 (smoother); "
        "default: an effective window of 1/20 of the run"
    )

    report = subparsers.add_parser("report", help="write PNG panels + index.html for a run")
    report.add_argument("run", help="run directory (holding metrics.jsonl)")
    report.add_argument("--out", default=None, help="output directory (default RUN/report)")
    report.add_argument("--smooth", type=_smooth, default=None, help=smooth_help)
    report.set_defaults(func=cmd_report)

    compare = subparsers.add_parser("compare", help="overlay several runs' panels")
    compare.add_argument("runs", nargs="+", help="run directories")
    compare.add_argument("--out", required=True, help="output directory for PNGs + index.html")
    compare.add_argument("--smooth", type=_smooth, default=None, help=smooth_help)
    compare.set_defaults(func=cmd_compare)

    doctor = subparsers.add_parser(
        "doctor", help="diagnose a run; exit 1 on a severe finding, 2 on bad input"
    )
    doctor.add_argument("run", help="run directory (holding metrics.jsonl)")
    doctor.add_argument(
        "--threshold", action="append", metavar="NAME=VALUE",
        help="override a DoctorThresholds field (repeatable), e.g. zero_variance_frac=0.7",
    )
    doctor.add_argument("--json", action="store_true", help="print findings as JSON")
    doctor.set_defaults(func=cmd_doctor)
