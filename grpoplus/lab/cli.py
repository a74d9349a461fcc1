"""``grpoplus lab``: list the experiments, run one (or all) and print its verdict.

    grpoplus lab list
    grpoplus lab NAME --out DIR [--seeds 3] [--steps N] [--set key=value ...] [--dry-run]
    grpoplus lab all --out DIR [--seeds 3]

Exit code 0 when the runs finished and the verdict was written (whatever it says); errors
(unknown experiment, a key the experiment needs is missing, bad override) are one line and
exit code 2, as every ``grpoplus`` command.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from grpoplus.lab.experiment import EXPERIMENTS
from grpoplus.lab.runner import every_run, run_experiment, train_command
from grpoplus.lab.verdict import summary_table


def register_lab(subparsers) -> None:
    """Add the ``lab`` sub-command to an argparse sub-parsers object."""
    p = subparsers.add_parser(
        "lab", help="run a claim of the literature as paired runs with a measured verdict",
        description="Each experiment runs paired configurations with several seeds and judges the claim by a rule "
                    "stated in its definition. `grpoplus lab list` shows them.")
    p.add_argument("name", help="an experiment name, `list`, or `all`")
    p.add_argument("--out", help="output directory (runs/, plots/, verdict.json, verdict.md)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per arm (0..S-1; default 3)")
    p.add_argument("--steps", type=int, default=None,
                   help="step budget of every run instead of the definition's (a quick look, not the defined verdict)")
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every run, e.g. --set threads=1 (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="print the grpoplus train command of every run and exit")
    p.set_defaults(func=cmd_lab)


def cmd_lab(args: argparse.Namespace) -> int:
    if args.name == "list":
        print(list_experiments())
        return 0
    if not args.out:
        raise ValueError("grpoplus lab needs --out DIR (where the runs, plots and verdict go)")
    names = EXPERIMENTS.names() if args.name == "all" else [EXPERIMENTS.get(args.name).name]
    if args.dry_run:
        for name in names:
            experiment = EXPERIMENTS.get(name)
            out = Path(args.out) / name if args.name == "all" else Path(args.out)
            for arm, _, overrides in every_run(experiment, out, args.seeds, args.steps, tuple(args.extra)):
                print(train_command(experiment, arm, overrides))
        return 0
    verdicts = []
    for name in names:
        experiment = EXPERIMENTS.get(name)
        missing = experiment.missing_keys()
        if args.name == "all" and missing:
            print(f"[lab] skipping {name}: it needs {', '.join(missing)}, which this grpoplus does not have yet")
            continue
        out = Path(args.out) / name if args.name == "all" else Path(args.out)
        verdict = run_experiment(experiment, out, args.seeds, args.steps, tuple(args.extra))
        print((out / "verdict.md").read_text())
        verdicts.append(verdict)
    if args.name == "all":
        (Path(args.out) / "summary.md").write_text(summary_table(verdicts))
        print(summary_table(verdicts))
    return 0


def list_experiments() -> str:
    """One block per experiment: name, title, source, arms, and what it still needs."""
    blocks = []
    for name in EXPERIMENTS.names():
        e = EXPERIMENTS.get(name)
        missing = e.missing_keys()
        status = f"  needs {', '.join(missing)} (not in this grpoplus yet): skipped\n" if missing else ""
        blocks.append(f"{name}: {e.title}\n  source: {e.source}\n  arms: {', '.join(a.name for a in e.arms)}\n"
                      + "".join(f"  claim: {c.claim}\n" for c in e.comparisons) + status)
    return "\n".join(blocks).rstrip()
