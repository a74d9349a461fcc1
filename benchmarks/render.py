"""The results on the site rendered from the stored records: tables, stamps and plots, never typed by hand.

A page holds one block per rendered view of a record (``docs/results/records/NAME.json``)::

    <!-- record: demo-20261129-0533-amd table -->
    | step | held-out accuracy (greedy) | ...        (written by this module; an edit by hand is found)
    <!-- /record -->

The view ``table`` is the benchmark module's own ``VIEWS["table"]`` (``benchmarks/demo.py``), a function of the
record's figures; ``stamp`` is the machine, date, commit and command the record names, and says when a newer
record of the same benchmark on the same kind of machine exists; ``plot:NAME`` is an SVG drawn from the module's
``PLOTS[NAME]`` (:mod:`plots`), stored in ``docs/results/plots/`` so that the page reads on GitHub too.

    python benchmarks/render.py           # re-render every block of README.md and docs/ (and the plots)
    python benchmarks/render.py --check   # list the blocks that differ from their records; exit 1 if any

``tests/test_records.py`` runs the check, and the site's build renders the blocks and plots afresh from the records
(``docs/hooks.py``), so what the site shows is what the records hold.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from records import RECORDS, ROOT  # noqa: E402

PLOTS_DIR = ROOT / "docs" / "results" / "plots"
BLOCK = re.compile(r"<!-- record: (?P<name>[\w.+-]+) (?P<view>[\w:-]+) -->\n(?P<body>.*?)<!-- /record -->", re.S)
FLAGS_SHOWN = ("avx2", "avx512f", "avx512_bf16", "avx512_vp2intersect", "amx_bf16", "amx_tile")


def load(name: str, folder: Path = RECORDS) -> dict:
    """The stored record ``name`` (its file name without ``.json``), with a line naming the fix when it is missing."""
    path = folder / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"no record {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: a page names a "
                         f"record that is not stored (run the benchmark with --record, or fix the block's name)")
    return json.loads(path.read_text())


def machine_text(record: dict) -> str:
    """The machine and versions, as a stamp says them."""
    found, versions = record["machine"], record["versions"]
    if found.get("gpu"):
        where = f"one {found['gpu']} ({found['gpu_memory_gb']:g} GB)"
    else:
        flags = [f for f in FLAGS_SHOWN if f in found["cpu_flags"]]
        amx = [] if any(f.startswith("amx") for f in flags) else ["no AMX"]
        where = f"{found['cores']}-core {found['cpu']} ({', '.join(flags + amx)})"
    shown = [f"torch {versions['torch']}", f"transformers {versions['transformers']}"]
    shown += [f"{k} {v}" for k, v in versions.items() if k not in ("python", "torch", "transformers")]
    return ", ".join([where, *shown])


def command(record: dict) -> str:
    """The command that made a record, the folder it was stored in left out (``--record``, ``--folder``)."""
    return re.sub(r" --folder \S+| (--record)(?: (?!-)\S+)?", lambda m: f" {m[1]}" if m[1] else "", record["command"])


def _kind(record: dict) -> tuple:
    """What makes two records the same measurement: the benchmark, its command, and the kind of machine (the GPU
    model, or the CPU vendor)."""
    return record["benchmark"], command(record), record["machine"].get("gpu") or record["machine"]["cpu_vendor"]


def newer(name: str, folder: Path = RECORDS) -> str | None:
    """The newest record of the same measurement (:func:`_kind`) stored after ``name``, if any."""
    kind = _kind(load(name, folder))
    later = [p.stem for p in folder.glob("*.json") if p.stem > name and _kind(json.loads(p.read_text())) == kind]
    return max(later) if later else None


def stamp(name: str, link: str, folder: Path = RECORDS) -> str:
    """``> **Machine:** ... · **Date:** ... · **Commit:** ... · **Record:** ...`` for the record ``name``."""
    record = load(name, folder)
    commit = f"`{record['commit'][:7]}`" + (" (with uncommitted changes)" if record["commit"].endswith("+dirty") else "")
    text = (f"> **Machine:** {machine_text(record)} · **Date:** {record['date'][:10]} · **Commit:** {commit} · "
            f"**Record:** [`records/{name}.json`]({link}{name}.json), from `{command(record)}`")
    later = newer(name, folder)
    if later:
        text += (f" · **Newer record:** [`records/{later}.json`]({link}{later}.json), on the same kind of machine; "
                 f"this section is not rendered from it")
    return text


def module_of(benchmark: str) -> str:
    """The module in ``benchmarks/`` that made a record: its benchmark's name, or the longest ``_``-prefix of it that
    names one (``bench_vs_trl``: ``bench.py``'s ``vs-trl``)."""
    parts = benchmark.split("_")
    for end in range(len(parts), 0, -1):
        if (HERE / f"{'_'.join(parts[:end])}.py").exists():
            return "_".join(parts[:end])
    raise SystemExit(f"no benchmarks/{benchmark}.py: a record's benchmark names the module that made it")


def view(benchmark: str, name: str):
    """The function ``VIEWS[name]`` (or ``PLOTS[name]``) of the module that made the record."""
    table, key = ("PLOTS", name[5:]) if name.startswith("plot:") else ("VIEWS", name)
    module = module_of(benchmark)
    known = getattr(importlib.import_module(module), table, {})
    if key not in known:
        raise SystemExit(f"benchmarks/{module}.py has no {table}[{key!r}]: a page asks for a view its benchmark "
                         f"does not render (known: {sorted(known)})")
    return known[key]


def plot_path(name: str, plot: str) -> Path:
    return PLOTS_DIR / f"{name}--{plot}.svg"


def plot_spec(name: str, plot: str, folder: Path = RECORDS) -> dict:
    record = load(name, folder)
    return view(record["benchmark"], f"plot:{plot}")(record["figures"])


def render_block(name: str, name_of_view: str, page: Path, folder: Path = RECORDS) -> str:
    """The text between a block's two comment lines (ending in a newline)."""
    records_dir = os.path.relpath(RECORDS, page.parent).replace(os.sep, "/") + "/"
    if name_of_view == "stamp":
        return stamp(name, records_dir, folder) + "\n"
    if name_of_view.startswith("plot:"):
        spec = plot_spec(name, name_of_view[5:], folder)
        where = os.path.relpath(plot_path(name, name_of_view[5:]), page.parent).replace(os.sep, "/")
        return f"![{spec['title']}]({where})\n"
    record = load(name, folder)
    return view(record["benchmark"], name_of_view)(record["figures"]).rstrip("\n") + "\n"


def render_text(text: str, page: Path, folder: Path = RECORDS) -> str:
    """``text`` with every block re-rendered from its record."""
    def one(match: re.Match) -> str:
        body = render_block(match["name"], match["view"], page, folder)
        return f"<!-- record: {match['name']} {match['view']} -->\n{body}<!-- /record -->"

    return BLOCK.sub(one, text)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def plots_named() -> list[tuple[str, str]]:
    """(record, plot) of every plot block of every page."""
    return sorted({(m["name"], m["view"][5:]) for page in pages() for m in BLOCK.finditer(page.read_text())
                   if m["view"].startswith("plot:")})


def stale() -> list[str]:
    """Every block that differs from its record's rendering, and every plot whose stored SVG was not drawn from the
    record's current figures: ``page: record view``."""
    from plots import digest, stored_digest

    out = []
    for page in pages():
        text = page.read_text()
        for match in BLOCK.finditer(text):
            if render_text(match[0], page) != match[0]:
                out.append(f"{page.relative_to(ROOT)}: {match['name']} {match['view']}")
    for name, plot in plots_named():
        if stored_digest(plot_path(name, plot)) != digest(plot_spec(name, plot)):
            out.append(f"{plot_path(name, plot).relative_to(ROOT)}: {name} plot:{plot}")
    return out


def write_all() -> list[Path]:
    """Re-render every page's blocks and every plot in place; the files changed."""
    from plots import draw

    changed = []
    for page in pages():
        text = page.read_text()
        done = render_text(text, page)
        if done != text:
            page.write_text(done)
            changed.append(page)
    for name, plot in plots_named():
        path, drawn = plot_path(name, plot), draw(plot_spec(name, plot))
        if not path.exists() or path.read_bytes() != drawn:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(drawn)
            changed.append(path)
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="list the blocks that differ from their records")
    args = parser.parse_args()
    if args.check:
        found = stale()
        print("\n".join(found) or "every block and plot is its record's rendering")
        raise SystemExit(1 if found else 0)
    for path in write_all():
        print(f"rendered {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
