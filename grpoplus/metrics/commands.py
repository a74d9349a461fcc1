"""The ``report``, ``compare``, ``doctor`` and ``traces`` sub-commands of the ``grpoplus`` CLI.

``register_commands(subparsers)`` adds them to an argparse sub-parser set; each parser's
``func(args) -> int`` returns the exit code: 0 success (doctor: healthy or warnings only),
1 doctor found something severe, 2 bad input (missing run directory or metrics file, bad
threshold, a run without traces or without the step asked for).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from grpoplus.core.rundir import RunDir

from .doctor import Finding, batch_info_from_config, diagnose, parse_thresholds
from .style import shorten
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


def run_label(run_dir: str, config: dict[str, Any]) -> str:
    """``"<run name>: <preset> <overrides>"``, the full description of a run."""
    run = config.get("run") or {}
    preset = run.get("preset") or (config.get("algo") or {}).get("preset") or "(no preset)"
    overrides = " ".join(str(o) for o in run.get("overrides") or [])
    return f"{Path(run_dir).resolve().name}: {preset} {overrides}".rstrip()


# Overrides that say where or how a run was written, not what it trained.
_LABEL_SKIP = {"out", "overwrite", "progress", "tensorboard", "loggers", "threads"}
VALUE_WIDTH = 16


def _settings(config: dict[str, Any]) -> dict[str, str]:
    """``{key: value}`` of a run's preset and key=value overrides (later wins)."""
    run = config.get("run") or {}
    settings = {"preset": str(run.get("preset") or (config.get("algo") or {}).get("preset"))}
    for item in run.get("overrides") or []:
        key, _, value = str(item).partition("=")
        if key.split(".")[-1] not in _LABEL_SKIP:
            settings[key] = value
    return settings


def _spelled_in(name: str, key: str, value: str) -> bool:
    """The directory name already says this setting (e.g. ``dapo_eps_high_0.3``)."""
    norm = lambda text: re.sub(r"[^a-z0-9.]+", "_", text.lower())  # noqa: E731
    return norm(value) in norm(name) and (key == "preset" or norm(key) in norm(name))


def run_labels(run_dirs: Sequence[str], configs: Sequence[dict[str, Any]]) -> list[str]:
    """Short names for compare's legend: each run's directory name, plus the preset and the
    overrides whose values differ between the runs (keys cut to their last part, values to
    16 characters; settings the name already spells, and keys a run did not override, left
    out), at most 48 characters."""
    paths = [Path(d).resolve() for d in run_dirs]
    names = [p.name for p in paths]
    names = [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in paths]
    settings = [_settings(c) for c in configs]
    keys = list(dict.fromkeys(k for s in settings for k in s))
    differ = [k for k in keys if len({s.get(k) for s in settings}) > 1]
    last = [k.split(".")[-1] for k in differ]
    short = {k: k.split(".")[-1] if last.count(k.split(".")[-1]) == 1 else k for k in differ}
    labels = []
    for name, setting in zip(names, settings):
        parts = []
        for key in (k for k in differ if k in setting):  # absent: the preset's value
            value = shorten(setting[key], VALUE_WIDTH)
            if not _spelled_in(name, short[key], value):
                parts.append(value if key == "preset" else f"{short[key]}={value}")
        labels.append(shorten(f"{name}: {' '.join(parts)}" if parts else name))
    return labels


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

    runs, configs = [], []
    for run in args.runs:
        try:
            records, config = load_run(run)
        except (FileNotFoundError, ValueError) as err:
            return _fail(str(err))
        runs.append(records)
        configs.append(config)
    descriptions = [run_label(run, config) for run, config in zip(args.runs, configs)]
    written = write_compare(runs, run_labels(args.runs, configs), args.out, smooth=args.smooth,
                            descriptions=descriptions)
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


def cmd_traces(args: argparse.Namespace) -> int:
    from .tracepage import write_trace_page

    try:
        path = write_trace_page(args.run, args.step, args.out, decode=not args.ids)
    except FileNotFoundError as err:
        return _fail(str(err))
    print(f"wrote {path}")
    return EXIT_OK


def register_commands(subparsers: Any) -> None:
    """Add ``report``, ``compare``, ``doctor`` and ``traces`` to an argparse sub-parsers object."""
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

    traces = subparsers.add_parser("traces", help="write one step's rollout trace as a self-contained HTML page")
    traces.add_argument("run", help="run directory (holding traces/)")
    traces.add_argument("--step", type=int, default=None, help="the step to show (default: the newest traced one)")
    traces.add_argument("--out", default=None, help="the page to write (default RUN/traces/step-N.html)")
    traces.add_argument("--ids", action="store_true", help="show token ids, without loading the run's tokenizer")
    traces.set_defaults(func=cmd_traces)
