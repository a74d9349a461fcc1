"""A benchmark's stored record: the command that made it, its figures, the machine, the versions, the commit and the
date, as one JSON file in ``docs/results/records/`` (what a results page quotes, and names).

    from records import write_record
    write_record("activation_memory", figures, args.record)   # -> docs/results/records/activation_memory-....json

A benchmark without ``--record`` of its own is recorded by running it through this module: every JSON value each
command printed, per command, becomes the figures::

    python benchmarks/records.py sharded_memory "python benchmarks/sharded_memory.py --model M --strategy replicate" \
        "python benchmarks/sharded_memory.py --model M --strategy fsdp2"

The machine is the CPU's vendor, model and vector flags (AVX-512 BF16 and AMX change the speed figures), or the GPU's
name and memory where one ran; the commit is ``git rev-parse HEAD`` with ``+dirty`` when the tree had changes.
"""

from __future__ import annotations

import datetime
import json
import platform
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "results" / "records"
FIELDS = ("benchmark", "command", "figures", "machine", "versions", "commit", "date")
"""What every record holds (tests/test_records.py checks the stored ones)."""


def machine(device: str = "cpu") -> dict:
    """The CPU (vendor, model, the flags that change speed figures, cores), and the GPU where ``device`` is one."""
    from grpoplus.models.device import cpuinfo

    flags = sorted(f for f in set(cpuinfo("flags").split()) if f.startswith(("avx2", "avx512", "amx")))
    vendor = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}.get(cpuinfo("vendor_id"), platform.machine())
    found = {"cpu": cpuinfo("model name") or platform.processor(), "cpu_vendor": vendor, "cpu_flags": flags,
             "cores": len(__import__("os").sched_getaffinity(0))}
    if device.startswith("cuda"):
        import torch

        props = torch.cuda.get_device_properties(0)
        found |= {"gpu": props.name, "gpu_memory_gb": round(props.total_memory / 1e9, 1)}
    return found


def versions() -> dict:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


def add_record_argument(parser, which: str = "") -> None:
    """A benchmark's ``--record [DIR]``: store its figures as a record (``which``: the sub-commands that can)."""
    parser.add_argument("--record", nargs="?", const="", default=None,
                        help=f"{which + ': ' if which else ''}store a record (command, figures, machine, commit, date) "
                             "in this folder (default docs/results/records)")


def store(benchmark: str, figures, folder: str | None, device: str = "cpu") -> Path | None:
    """Write the record when ``--record`` was given (``folder`` None: it was not; "": the default folder) and print
    where it went."""
    if folder is None:
        return None
    path = write_record(benchmark, figures, folder or None, device)
    print(json.dumps({"record": str(path)}))
    return path


def package_version(name: str) -> str | None:
    """An installed package's version, None where it is not installed (TRL and vLLM are optional)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def commit() -> str:
    """HEAD's id, ``+dirty`` when the working tree differed from it; ``unknown`` outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty else "")


def write_record(benchmark: str, figures, folder: Path | str | None = None, device: str = "cpu") -> Path:
    """Write one record of ``figures`` (what the benchmark printed) and return its path."""
    now = datetime.datetime.now(datetime.timezone.utc)
    record = {"benchmark": benchmark, "command": shlex.join(["python", _in_checkout(sys.argv[0]), *sys.argv[1:]]),
              "figures": figures,
              "machine": machine(device), "versions": versions(), "commit": commit(),
              "date": now.strftime("%Y-%m-%d %H:%M UTC")}
    folder = Path(folder or RECORDS)
    folder.mkdir(parents=True, exist_ok=True)
    where = record["machine"].get("gpu", record["machine"]["cpu_vendor"]).lower().replace(" ", "-")
    path = folder / f"{benchmark}-{now:%Y%m%d-%H%M}-{where}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def _in_checkout(script: str) -> str:
    """The script's path as run from the checkout's root (``benchmarks/x.py``), whatever folder it was run from."""
    path = Path(script).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else script


def printed_values(text: str) -> list:
    """Every JSON value a command printed at the start of a line (one line each, or indented over several)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) >= 0:
        if at and text[at - 1] != "\n":
            at += 1
            continue
        try:
            value, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            at += 1
            continue
        found.append(value)
        at = end
    return found


def run_recorded(benchmark: str, commands: list[str], folder: Path | str | None = None) -> Path:
    """Run each command (one at a time, from the checkout's root, its output shown as it comes) and store what they
    printed as one record: ``{"calls": [{"command": ..., "printed": [values]}]}``. A failed command stores nothing."""
    calls = []
    for command in commands:
        print(f"+ {command}", flush=True)
        done = subprocess.Popen(shlex.split(command), cwd=ROOT, stdout=subprocess.PIPE, text=True)
        lines = []
        for line in done.stdout:
            print(line, end="", flush=True)
            lines.append(line)
        out = "".join(lines)
        if done.wait():
            raise SystemExit(f"{command!r} exited with {done.returncode}: no record stored")
        calls.append({"command": command, "printed": printed_values(out)})
    return write_record(benchmark, {"calls": calls}, folder)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Run benchmark commands and store what they print as one record.")
    parser.add_argument("benchmark", help="the record's name (the module in benchmarks/ whose VIEWS render it)")
    parser.add_argument("commands", nargs="+", help="each command, quoted")
    parser.add_argument("--folder", default=None, help="where the record goes (default docs/results/records)")
    args = parser.parse_args()
    print(json.dumps({"record": str(run_recorded(args.benchmark, args.commands, args.folder))}))


if __name__ == "__main__":
    main()
