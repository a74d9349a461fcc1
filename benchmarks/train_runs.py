"""What the benchmarks that run ``grpoplus train`` as a user does share (:mod:`seeds`, :mod:`arms`): one call in
its own process, and a command line whose words after ``--`` are the training command's."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def train(args: list[str], out: Path, env: dict | None = None) -> tuple[list[dict], str, float]:
    """``grpoplus train ARGS --out OUT`` in a subprocess: its metrics records, its stderr and its wall seconds; a
    failed run stops the benchmark with its output."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "grpoplus", "train", *args, "--out", str(out)], capture_output=True,
                          text=True, env=env)
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"grpoplus train {' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], done.stderr, wall


def parse_with_train_args(parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, list[str]]:
    """The benchmark's own arguments, and the words after ``--``: the arguments of ``grpoplus train``."""
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    return parser.parse_args(argv[:cut]), argv[cut + 1:]


def add_record_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--record", nargs="?", const="", default=None,
                        help="store a record (command, figures, machine, commit, date) in this folder "
                             "(default docs/results/records)")


def store(benchmark: str, figures: dict, folder: str | None) -> None:
    """Write the record when ``--record`` was given, and print where it went."""
    if folder is None:
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from records import write_record

    print(json.dumps({"record": str(write_record(benchmark, figures, folder or None))}))
