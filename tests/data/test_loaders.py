"""Data loading: formats, field mapping, answer extraction, malformed rows."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpoplus.data import load_records

ROWS = [
    {"question": "What is 2+3?", "solution": "2+3=5\n#### 5", "level": 1},
    {"question": "What is 10*100?", "solution": "10*100 = 1,000\n#### 1,000", "level": 2},
]


def _write_jsonl(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_with_field_mapping_and_gsm8k_extraction(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [json.dumps(r) for r in ROWS])
    data = load_records(path, prompt_field="question", answer_field="solution", answer_format="gsm8k")
    assert [(r["prompt"], r["answer"]) for r in data.records] == [("What is 2+3?", "5"), ("What is 10*100?", "1000")]
    assert data.records[1]["fields"] == {"level": 2} and data.skipped == []


def test_malformed_rows_are_skipped_with_their_line_numbers(tmp_path):
    lines = [json.dumps({"prompt": "p1", "answer": "1"}), "{not json", "", json.dumps({"prompt": "p2"}),
             json.dumps([1, 2]), json.dumps({"prompt": "p3", "answer": "3"})]
    data = load_records(_write_jsonl(tmp_path / "d.jsonl", lines))
    assert [r["prompt"] for r in data.records] == ["p1", "p3"]
    assert [line for line, _ in data.skipped] == [2, 4, 5]
    assert "invalid JSON" in data.skipped[0][1] and "missing field 'answer'" in data.skipped[1][1]


def test_malformed_row_is_an_error_when_configured(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [json.dumps({"prompt": "p", "answer": "1"}), "{oops"])
    with pytest.raises(ValueError, match="line 2: invalid JSON"):
        load_records(path, on_bad_row="error")


def test_math_answer_format_takes_the_last_box_with_nested_braces(tmp_path):
    row = {"problem": "Half?", "solution": r"First \boxed{1}, then \boxed{\frac{1}{2}}."}
    path = tmp_path / "d.json"
    path.write_text(json.dumps([row, {"problem": "No box", "solution": "none"}]))
    data = load_records(path, prompt_field="problem", answer_field="solution", answer_format="math")
    assert [r["answer"] for r in data.records] == [r"\frac{1}{2}"]
    assert data.skipped == [(2, "no math answer found in field 'solution'")]


def test_parquet(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    data = load_records(path, prompt_field="question", answer_field="solution", answer_format="auto")
    assert [r["answer"] for r in data.records] == ["5", "1000"]


def test_datasets_save_to_disk_directory(tmp_path):
    # the layout datasets.Dataset.save_to_disk writes: data-*.arrow IPC streams + json metadata
    table = pa.Table.from_pylist(ROWS)
    with pa.OSFile(str(tmp_path / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    (tmp_path / "state.json").write_text("{}")
    data = load_records(tmp_path, prompt_field="question", answer_field="solution", answer_format="gsm8k")
    assert [r["prompt"] for r in data.records] == ["What is 2+3?", "What is 10*100?"]


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_records(tmp_path / "nope.jsonl")


def test_field_missing_from_every_row_lists_the_fields_that_exist(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [json.dumps(r) for r in ROWS])
    with pytest.raises(ValueError, match=r"\['prompt', 'answer'\] appear in no row.*level, question, solution"):
        load_records(path)


def test_bad_options_are_rejected(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [json.dumps({"prompt": "p", "answer": "1"})])
    with pytest.raises(ValueError, match="answer_format"):
        load_records(path, answer_format="latex")
    with pytest.raises(ValueError, match="unsupported data file type"):
        load_records(_write_jsonl(tmp_path / "d.csv", ["a,b"]))


def test_a_jsonl_line_that_is_not_utf8_is_a_bad_row_named_by_line_and_column(tmp_path):
    path = tmp_path / "d.jsonl"
    good = [json.dumps({"prompt": f"p{i}", "answer": str(i)}).encode() for i in range(3)]
    bad = b'{"prompt": "caf\xc3\xa9 \xff", "answer": "1"}'  # é is two bytes but one column; 0xff is never UTF-8
    path.write_bytes(b"\n".join([good[0], bad, good[1], good[2]]) + b"\n")
    data = load_records(path)
    assert [r["prompt"] for r in data.records] == ["p0", "p1", "p2"]
    assert data.skipped == [(2, "not UTF-8 (byte 0xff at column 18); save the file as UTF-8")]
    with pytest.raises(ValueError, match=r"d.jsonl: line 2: not UTF-8 \(byte 0xff at column 18\)"):
        load_records(path, on_bad_row="error")


def test_a_byte_order_mark_opening_a_jsonl_file_is_not_a_bad_row(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"prompt": "p", "answer": "1"}).encode() + b"\n")
    assert load_records(path).skipped == []


def test_a_json_file_that_is_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "d.json"
    path.write_bytes(b'[\n{"prompt": "a", "answer": "1"},\n{"prompt": "b\xfe", "answer": "2"}\n]\n')
    with pytest.raises(ValueError, match=r"d.json: line 3: not UTF-8 \(byte 0xfe at column 14\)"):
        load_records(path)


def test_chat_rows_given_as_prompts_are_named_demonstrations(tmp_path):
    rows = [{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}] * 2
    path = _write_jsonl(tmp_path / "d.jsonl", [json.dumps(r) for r in rows])
    with pytest.raises(ValueError, match=r"chat messages.*demonstrations.*grpoplus sft --demos FILE") as err:
        load_records(path)
    assert "\n" not in str(err.value)
