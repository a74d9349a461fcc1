"""A fidelity-lab experiment as a stored record: its verdicts, checks and context measures, for a results page.

Runs ``grpoplus lab NAME --out DIR --seeds S`` (every arm and seed in its own single-threaded process, as the lab
always runs them) and stores the experiment's ``verdict.json`` (the definition as run, per-seed effects, checks,
verdicts, context measures per arm, each run's wall time and load) as the record ``lab_NAME``::

    python benchmarks/lab.py std_normalisation --seeds 3 --record

``--out DIR`` keeps the runs, plots and verdict (default: a temporary folder). ``docs/results/lab.md`` renders the
records (:data:`VIEWS`).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from records import add_record_argument, store

from grpoplus.lab.verdict import _mean, _span  # the lab's own verdict.md formats


def run_lab(name: str, out: Path, seeds: int, steps: int | None, extra: list[str]) -> dict:
    """Run the experiment through the CLI and return its verdict, the run folders left out."""
    command = [sys.executable, "-m", "grpoplus", "lab", name, "--out", str(out), "--seeds", str(seeds),
               *(["--steps", str(steps)] if steps else []), *(a for kv in extra for a in ("--set", kv))]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    verdict = json.loads((out / "verdict.json").read_text())
    verdict["runs"] = [{k: v for k, v in run.items() if k != "dir"} for run in verdict["runs"]]
    verdict.pop("plots", None)
    return verdict


def verdicts_table(figures: dict) -> str:
    """One row per claim: the measure, control and treatment (mean over seeds), the effect, per seed, verdict."""
    lines = ["| claim | measure | control -> treatment | effect: mean [min, max] | per seed | verdict |",
             "|---|---|---|---:|---|---|"]
    for c in figures["comparisons"]:
        effects = [e for e in c["effects"] if math.isfinite(e)]
        mean = f"{statistics.fmean(effects):+.3g} [{min(effects):+.3g}, {max(effects):+.3g}]" if effects else "nan"
        arms = f"`{c['control']}` {_mean(c['control_values'])} -> `{c['treatment']}` {_mean(c['treatment_values'])}"
        lines.append(f"| {c['claim']} | {c['measure']} | {arms} | {mean} | "
                     f"{', '.join(f'{e:+.3g}' for e in c['effects'])} | **{c['status']}** |")
    return "\n".join(lines) + "\n"


def checks_list(figures: dict) -> str:
    """Each claim's rule, reason and checks (whether the failure showed in the control, whether the switch acted)."""
    lines = []
    for c in figures["comparisons"]:
        lines += [f"- **{c['claim']}**: {c['status']} ({c['reason']}). Rule, stated in advance: {c['rule']}."]
        lines += [f"  - {'held' if ch['passed'] else 'FAILED'} ({ch['kind']}): {ch['statement']}; per seed "
                  f"{', '.join(f'{v:.3g}' for v in ch['values'])}" for ch in c["checks"]]
    return "\n".join(lines) + "\n"


def context_table(figures: dict) -> str:
    """Context measures per arm (mean [min, max] over seeds), and each arm's mean seconds per run."""
    arms = list(figures["arms"])
    lines = ["| measure | " + " | ".join(f"`{a}`" for a in arms) + " |", "|---|" + "---:|" * len(arms)]
    lines += [f"| {r['measure']} | " + " | ".join(_span(r["arms"].get(a, [])) for a in arms) + " |"
              for r in figures["report"]]
    walls = {a: [r["wall_s"] for r in figures["runs"] if r["arm"] == a] for a in arms}
    lines.append("| seconds per run | " + " | ".join(_span(walls[a]) for a in arms) + " |")
    return "\n".join(lines) + "\n"


VIEWS = {"verdicts": verdicts_table, "checks": checks_list, "context": context_table}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="a lab experiment (grpoplus lab list)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per arm (default 3)")
    p.add_argument("--steps", type=int, default=None, help="steps per run (default: the experiment's)")
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                   help="an override for every arm")
    p.add_argument("--out", help="keep the runs, plots and verdict here (default: a temporary folder)")
    add_record_argument(p)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        verdict = run_lab(args.name, Path(args.out or tmp), args.seeds, args.steps, args.extra)
    print(verdicts_table(verdict))
    store(f"lab_{args.name}", verdict, args.record)


if __name__ == "__main__":
    main()
