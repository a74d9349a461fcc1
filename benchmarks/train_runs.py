"""What the benchmarks that run ``grpoplus train`` as a user does share (:mod:`seeds`, :mod:`arms`, :mod:`demo`): one
call in its own process, one seed's run with a cold warm-start cache, and a command line whose words after ``--`` are
the training command's."""

from __future__ import annotations

import argparse
import json
import os
import re
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


def cold_seed(args: list[str], out: Path, seed: int) -> tuple[list[dict], int | None, float]:
    """``grpoplus train ARGS --seed SEED`` with a cache of its own beside ``out`` (``GRPOPLUS_CACHE``), so it builds
    its warm start as a new user's first run does: its metrics records, the warm start's seconds (None when it
    built none) and its wall seconds."""
    cache = out.with_name(out.name + "-cache")
    rows, stderr, wall = train([*args, "--seed", str(seed)], out, env=dict(os.environ, GRPOPLUS_CACHE=str(cache)))
    warm = re.search(r"warm start: done in (\d+) s", stderr)
    return rows, int(warm.group(1)) if warm else None, wall


def parse_with_train_args(parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, list[str]]:
    """The benchmark's own arguments, and the words after ``--``: the arguments of ``grpoplus train``."""
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    return parser.parse_args(argv[:cut]), argv[cut + 1:]

