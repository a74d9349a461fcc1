"""Cost of hiding the host's files from sandboxed code, per call: the same programs run with the files
hidden (a mount namespace with a root of its own, the default) and in view (GRPOPLUS_SANDBOX_HOST_FILES=1),
alternated so that drift in the machine's speed falls on both::

    python benchmarks/sandbox_cost.py --calls 30

One JSON line per program: median wall seconds per call either way, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from grpoplus.rewards.sandbox import HOST_FILES_OPT_IN, run_python

PROGRAMS = {"print": "print(1)", "imports": "import json, re, math, collections, itertools\nprint(json.dumps([1]))",
            "subprocess": "import subprocess\nprint(subprocess.run(['true']).returncode)"}


def timed(code: str, hidden: bool) -> float:
    if hidden:
        os.environ.pop(HOST_FILES_OPT_IN, None)
    else:
        os.environ[HOST_FILES_OPT_IN] = "1"
    started = time.perf_counter()
    result = run_python(code, timeout_s=30)
    wall = time.perf_counter() - started
    if result.status != "ok" or result.files_isolated != hidden:
        sys.exit(f"sandbox_cost: {code!r} gave {result.status} (files hidden: {result.files_isolated}): {result.stderr}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    for name, code in PROGRAMS.items():
        hidden, shown = [], []
        for _ in range(args.calls):
            hidden.append(timed(code, True))
            shown.append(timed(code, False))
        print(json.dumps({"program": name, "calls": args.calls, "hidden_s": round(statistics.median(hidden), 4),
                          "in_view_s": round(statistics.median(shown), 4),
                          "ratio": round(statistics.median(hidden) / statistics.median(shown), 3)}))


if __name__ == "__main__":
    main()
