"""Stored benchmark records (docs/results/records/, benchmarks/records.py): each says what made it, where and when,
and a figure a page quotes from one is the record's."""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from records import FIELDS, RECORDS, write_record  # noqa: E402

STORED = sorted(RECORDS.glob("*.json"))


@pytest.mark.parametrize("path", STORED, ids=[p.name for p in STORED])
def test_a_stored_record_names_its_command_machine_commit_and_date(path):
    record = json.loads(path.read_text())
    assert [key for key in FIELDS if not record.get(key)] == []
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", record["commit"]) and record["command"].startswith("python ")
    assert record["machine"].get("gpu") or record["machine"]["cpu_vendor"] in ("amd", "intel")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", record["date"])


def test_the_activation_figures_on_the_page_are_the_records():
    page = (ROOT / "docs" / "concepts" / "rollout-engines.md").read_text()
    name = re.search(r"\((\.\./results/records/(activation_memory-[\w-]+\.json))\)", page).group(2)
    rows = json.loads((RECORDS / name).read_text())["figures"]["rows"]
    spans = {p: (min(r["ratio"] for r in rows if r["precision"] == p), max(r["ratio"] for r in rows
                                                                          if r["precision"] == p))
             for p in ("fp32", "bf16_mixed")}
    said = " ".join(page.split())
    assert f"{spans['fp32'][0]:.2f}-{spans['fp32'][1]:.2f} in float32" in said
    assert f"{spans['bf16_mixed'][0]:.2f}-{spans['bf16_mixed'][1]:.2f} under bfloat16 autocast" in said


def test_a_written_record_holds_every_field(tmp_path):
    path = write_record("a_test", {"x": 1}, tmp_path)
    record = json.loads(path.read_text())
    assert set(FIELDS) <= set(record) and record["figures"] == {"x": 1} and path.name.startswith("a_test-")


def test_every_block_and_plot_on_the_site_is_its_records_rendering():
    """Every ``<!-- record: NAME VIEW -->`` block of README and docs/ is what ``benchmarks/render.py`` draws from the
    record, and every stored plot was drawn from the record's current figures (``python benchmarks/render.py``
    re-renders them)."""
    import render

    blocks = [m for page in render.pages() for m in render.BLOCK.finditer(page.read_text())]
    assert {m["view"] for m in blocks} >= {"stamp", "table"} and len(blocks) >= 10
    assert render.stale() == []


def test_a_figure_edited_by_hand_in_a_block_is_found_and_rendered_back(tmp_path):
    import render

    page = ROOT / "docs" / "results" / "demo.md"
    text = page.read_text()
    block = next(m[0] for m in render.BLOCK.finditer(text) if m["view"] == "table")
    edited = block.replace("%", "0%", 1)
    assert render.render_text(edited, page) == block != edited


def test_a_stamp_says_its_machine_commit_and_command_and_names_a_newer_record(tmp_path):
    import render

    older = json.loads((RECORDS / "demo-20261129-0533-amd.json").read_text())
    (tmp_path / "demo-20261129-0533-amd.json").write_text(json.dumps(older))
    stamp = render.stamp("demo-20261129-0533-amd", "records/", tmp_path)
    assert stamp.startswith("> **Machine:** 2-core AMD EPYC (") and f"`{older['commit'][:7]}`" in stamp
    assert older["command"] in stamp and "Newer record" not in stamp
    other = dict(older, command=older["command"].replace("--seeds 0 1 2", "--seeds 3"))
    (tmp_path / "demo-20261130-0000-amd.json").write_text(json.dumps(other))
    assert "Newer record" not in render.stamp("demo-20261129-0533-amd", "records/", tmp_path)  # another measurement
    intel = dict(older, machine=dict(older["machine"], cpu_vendor="intel"))
    (tmp_path / "demo-20261201-0000-intel.json").write_text(json.dumps(intel))
    assert "Newer record" not in render.stamp("demo-20261129-0533-amd", "records/", tmp_path)  # another machine
    moved = older["command"].replace("--record", "--record /tmp/x")  # the same command, stored elsewhere
    (tmp_path / "demo-20261201-0000-amd.json").write_text(json.dumps(dict(older, command=moved)))
    assert "**Newer record:** [`records/demo-20261201-0000-amd.json`]" in render.stamp("demo-20261129-0533-amd",
                                                                                        "records/", tmp_path)


def test_a_block_naming_a_missing_record_or_view_says_so_in_one_line(tmp_path):
    import render

    page = ROOT / "docs" / "results" / "demo.md"
    with pytest.raises(SystemExit, match="no record .*demo-19990101.* is not stored"):
        render.render_text("<!-- record: demo-19990101-0000-amd table -->\n<!-- /record -->", page)
    with pytest.raises(SystemExit, match=r"benchmarks/demo.py has no VIEWS\['tabel'\].*known: \['seeds', 'table'\]"):
        render.render_text("<!-- record: demo-20261129-0533-amd tabel -->\n<!-- /record -->", page)


def test_a_stored_plot_carries_the_digest_of_what_it_draws(tmp_path):
    from plots import digest, draw, stored_digest

    spec = {"kind": "bars", "title": "t", "labels": ["a", "b"], "series": {"s": [1.0, 2.0]}, "unit": "x", "line": 1.0}
    (tmp_path / "p.svg").write_bytes(draw(spec))
    assert stored_digest(tmp_path / "p.svg") == digest(spec) != digest(dict(spec, series={"s": [1.0, 2.5]}))
    assert stored_digest(tmp_path / "missing.svg") is None


def test_printed_json_values_become_a_records_figures(tmp_path, monkeypatch):
    import records

    monkeypatch.chdir(tmp_path)
    script = tmp_path / "bench.py"
    script.write_text("import json\nprint('warming up')\nprint(json.dumps({'a': 1}))\n"
                      "print(json.dumps({'summary': {'b': 2}}, indent=1))\n")
    path = records.run_recorded("a_test", [f"{sys.executable} {script}"], tmp_path)
    assert json.loads(path.read_text())["figures"] == {
        "calls": [{"command": f"{sys.executable} {script}", "printed": [{"a": 1}, {"summary": {"b": 2}}]}]}
    (tmp_path / "fails.py").write_text("raise SystemExit(3)\n")
    with pytest.raises(SystemExit, match="exited with 3: no record stored"):
        records.run_recorded("a_test", [f"{sys.executable} {tmp_path / 'fails.py'}"], tmp_path)


LONG = "runs of an hour or more on 2 cores: to re-run with a record when the machine is free"
UNRECORDED = {
    ("multi-turn.md", "SmolLM2-135M-Instruct learns the calculator: a supervised warm start, then RL"): LONG,
    ("multi-turn.md", "A longer RL stage, measured on 128 problems"): LONG,
    ("multi-turn.md", "The same stage with a KL term to the warm start and one update per batch"): LONG,
    ("multi-turn.md", "With dynamic sampling, RL gains on every seed"): LONG,
    ("smollm2-wordproblems.md", "SmolLM2-135M-Instruct learns wordproblems"): LONG,
}
"""The results tables still typed by hand, by (page, section heading): measured before the records existed, each
under a stamp saying what was not recorded. Re-running a benchmark with a record and rendering the section takes it
off this list, which only shrinks."""


def figure_tables(text: str) -> list[tuple[str, bool]]:
    """(section heading, inside a record block) of every Markdown table of ``text`` whose rows hold a figure."""
    import render

    blocks = [(m.start(), m.end()) for m in render.BLOCK.finditer(text)]
    found, heading, offset, start, rows = [], "", 0, None, []
    for line in [*text.split("\n"), ""]:
        if line.startswith("|"):
            start, rows = (offset if start is None else start), [*rows, line]
        elif start is not None:
            if len(rows) > 2 and rows[1].startswith("|-") and any(re.search(r"\d", r) for r in rows[2:]):
                found.append((heading, any(a <= start < b for a, b in blocks)))
            start, rows = None, []
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        offset += len(line) + 1
    return found


def test_every_results_table_is_rendered_from_a_record_or_listed_as_typed_by_hand():
    typed = {(page.name, heading) for page in sorted((ROOT / "docs" / "results").glob("*.md"))
             for heading, rendered in figure_tables(page.read_text()) if not rendered}
    assert typed - set(UNRECORDED) == set(), "a results table typed by hand: render it from a record"
    assert set(UNRECORDED) - typed == set(), "rendered from a record now: take it off UNRECORDED"


def test_a_table_outside_a_block_is_found():
    text = "## A\n\n| x | s/step |\n|---|---:|\n| a | 0.5 |\n\n## B\n\n<!-- record: r table -->\n| x |\n|---|\n| 1 |\n" \
           "<!-- /record -->\n\n| name |\n|---|\n| no figure |\n"
    assert figure_tables(text) == [("A", False), ("B", True)]


def test_the_gpu_checks_record_renders_each_call_against_trls_of_its_setting():
    from gpu_vs_trl import calls_table

    base = {"shape": "qwen2.5-1.5b", "precision": "bf16", "gradient_checkpointing": True, "prompts": 32, "group": 8,
            "new_tokens": 256, "median_s_per_step": 14.0, "rollout_s": 12.0, "learner_s": 2.0, "learner_mfu": 0.34,
            "rollout_vs_floor": 0.03, "peak_mem_mb": 38912.0}
    calls = [dict(base, side="trl", micro_batch=256, steps_per_s=1 / 14.0),
             dict(base, side="grpoplus", overrides="learner.micro_batch_size=auto", micro_batch=0,
                  micro_batch_tokens=65536, steps_per_s=1 / 7.0, median_s_per_step=7.0)]
    rows = calls_table({"calls": calls}).splitlines()[2:]
    assert rows[0].startswith("| qwen2.5-1.5b | trl | 256 | 14.00 | 1.00x |") and rows[0].endswith("| 38.0 GB |")
    assert "| grpoplus learner.micro_batch_size=auto | auto (65536 tokens) | 7.00 | 2.00x |" in rows[1]


def test_the_gpu_checks_lora_calls_pair_with_trls_lora_call_and_meet_the_lora_target(tmp_path, capsys):
    from gpu_vs_trl import calls_table, summary

    base = {"shape": "qwen2.5-7b", "precision": "bf16", "gradient_checkpointing": "on", "prompts": 32, "group": 8,
            "new_tokens": 256, "rollout_s": 9.0, "learner_s": 3.0, "learner_mfu": 0.3, "rollout_vs_floor": 0.1,
            "peak_mem_mb": 40960.0, "micro_batch": 64}
    calls = [{"side": "trl", **base, "median_s_per_step": 12.0, "steps_per_s": 1 / 12.0},
             {"side": "trl", **base, "lora_rank": 16, "median_s_per_step": 10.0, "steps_per_s": 1 / 10.0},
             {"side": "grpoplus", **base, "lora_rank": 16, "median_s_per_step": 8.0, "steps_per_s": 1 / 8.0}]
    rows = calls_table({"calls": calls}).splitlines()[2:]
    assert rows[2].startswith("| qwen2.5-7b LoRA 16 | grpoplus | 64 | 8.00 | 1.25x |")  # against TRL's LoRA call
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in calls))  # as the calls print them: "side" first
    summary(str(path))
    assert "PASS  qwen2.5-7b bf16 gc=on 32x8x256 lora=16  grpoplus: steps/s >= 1x TRL" in capsys.readouterr().out
