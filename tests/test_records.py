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


def test_the_visual_tasks_table_is_its_records():
    page = (ROOT / "docs" / "results" / "vision.md").read_text()
    name = re.search(r"\*\*Record:\*\* \[`records/(shapes_vlm-[\w-]+\.json)`\]", page).group(1)
    record = json.loads((RECORDS / name).read_text())
    assert record["commit"][:7] in page and record["date"][:10] in page
    for row in record["figures"]["seeds"]:
        greedy = f"{100 * row['greedy_before']:.1f}% -> {100 * row['greedy_after']:.1f}% ({row['greedy_gain_points']:+.1f})"
        sampled = f"{100 * row['sampled_before']:.1f}% -> {100 * row['sampled_after']:.1f}% " \
                  f"({row['sampled_gain_points']:+.1f})"
        assert f"| {row['seed']} | {greedy} | {sampled} | {row['sft_s']:.1f} | {row['rl_s']:.1f} |" in page, row["seed"]


def test_the_demos_tables_are_its_record():
    from demo import seed_lines, table

    page = (ROOT / "docs" / "results" / "demo.md").read_text()
    name = re.search(r"\*\*Record:\*\* \[`records/(demo-[\w-]+\.json)`\]", page).group(1)
    record = json.loads((RECORDS / name).read_text())
    assert record["commit"][:7] in page and record["date"][:10] in page and record["command"] in page
    assert table(record["figures"]) in page
    assert all(line in page for line in seed_lines(record["figures"]))
    assert len(record["figures"]["seeds"]) == 3  # the page says three seeds


def test_the_smollm2_side_by_side_table_is_its_record():
    pytest.importorskip("torch")
    from smollm2_vs_trl import vs_trl_table

    page = (ROOT / "docs" / "results" / "vs-trl.md").read_text()
    name = re.search(r"\*\*Record:\*\* \[`records/(smollm2_vs_trl-[\w-]+\.json)`\]", page).group(1)
    record = json.loads((RECORDS / name).read_text())
    assert record["commit"][:7] in page and record["date"][:10] in page
    assert vs_trl_table(record["figures"]) in page
