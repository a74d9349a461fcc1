"""``python -m grpoplus.tasks.function_calling_rows rows.jsonl``: the ``function_calling`` task's problems written as
a function-calling data set (:mod:`grpoplus.data.functions`: tools with their full schemas, messages, the expected
calls, ``parallel``, mock ``tool_results``), for a chat model to read through its template
(``grpoplus train --data rows.jsonl``) or to start a data set of one's own from."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from grpoplus.tasks.function_calling import draw_row
from grpoplus.tasks.synthetic import check_int


def write_rows(path: str | Path, rows: int, difficulty: int = 2, seed: int = 0) -> int:
    """Write ``rows`` problems of ``difficulty`` drawn with ``seed`` to ``path`` (JSONL); returns how many."""
    check_int("difficulty", difficulty, 1, 4)
    rng = random.Random(seed)
    drawn = [{k: v for k, v in draw_row(rng, difficulty).items() if k != "prompt"} for _ in range(rows)]
    Path(path).write_text("".join(json.dumps(row) + "\n" for row in drawn))
    return len(drawn)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write function_calling problems as a function-calling data set.")
    parser.add_argument("out", help="the .jsonl file to write")
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--difficulty", type=int, default=2, help="tools offered per row (1..4)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"{args.out}: {write_rows(args.out, args.rows, args.difficulty, args.seed)} rows")


if __name__ == "__main__":
    main()
