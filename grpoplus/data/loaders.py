"""Load prompt/answer records from JSONL, JSON, Parquet or a ``datasets`` save directory.

Every loader yields ``(line_no, row)``; :func:`load_records` maps fields, extracts the
reference answer and decides, per ``on_bad_row``, whether a malformed row is skipped
(and reported with its line number) or stops the load. A file whose first row carries
its own tools (``tools``, or BFCL's ``function``) is a function-calling data set: every
row is read by :func:`grpoplus.data.functions.function_call_record`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from grpoplus.data.functions import function_call_record, is_function_call_row
from grpoplus.data.images import IMAGE_FIELD, image_sources
from grpoplus.rewards.extract import reference_answer

ANSWER_FORMATS = ("raw", "gsm8k", "math", "auto")
BAD_ROW_POLICIES = ("skip", "error")


@dataclass
class LoadedData:
    records: list[dict]  # each {"prompt": str, "answer": str, "fields": {other columns}, "line": line/row number}
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line/row number, reason)
    function_calls: bool = False  # the rows carry tools and expected calls (grpoplus.data.functions)


class _BadRow(Exception):
    """A row that cannot be used; carries the reason shown to the user."""


def _decoded(raw: bytes, first: bool) -> str:
    """A line's text; a byte that is not UTF-8 is a ``_BadRow`` naming it and its column (a byte-order mark opening
    the file is dropped)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _BadRow(f"not UTF-8 ({_bad_byte(raw, err.start)}); save the file as UTF-8") from None
    return text.removeprefix("\ufeff") if first else text


def _bad_byte(raw: bytes, start: int) -> str:
    """``byte 0xff at column 12``: the column counts the characters before it, as an editor shows them."""
    column = len(raw[:start].decode("utf-8", errors="replace")) + 1
    return f"byte 0x{raw[start]:02x} at column {column}"


def _jsonl_rows(path: Path) -> Iterator[tuple[int, object]]:
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                line = _decoded(raw, line_no == 1)
            except _BadRow as bad:
                yield line_no, bad
                continue
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as err:
                yield line_no, _BadRow(f"invalid JSON ({err.msg} at column {err.colno})")


def _json_rows(path: Path) -> Iterator[tuple[int, object]]:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:  # the line and column of the byte, not its offset in the file
        line, line_start = raw.count(b"\n", 0, err.start) + 1, raw.rfind(b"\n", 0, err.start) + 1
        raise ValueError(f"{path}: line {line}: not UTF-8 "
                         f"({_bad_byte(raw[line_start:], err.start - line_start)}); save the file as UTF-8") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON at line {err.lineno}: {err.msg}") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: a .json data file must hold a list of objects, got {type(data).__name__}")
    yield from enumerate(data, start=1)


def _table_rows(tables) -> Iterator[tuple[int, object]]:
    row_no = 0
    for table in tables:
        for row in table.to_pylist():
            row_no += 1
            yield row_no, row


def _parquet_rows(path: Path) -> Iterator[tuple[int, object]]:
    import pyarrow.parquet as pq

    yield from _table_rows([pq.read_table(path)])


def _arrow_dir_rows(path: Path) -> Iterator[tuple[int, object]]:
    """A directory written by ``datasets.Dataset.save_to_disk``: ``data-*.arrow`` IPC streams."""
    import pyarrow as pa

    files = sorted(path.glob("*.arrow"))
    if not files:
        raise ValueError(
            f"{path}: no .arrow files; expected a directory saved by datasets.Dataset.save_to_disk "
            "(a DatasetDict: point at one split's sub-directory)"
        )
    tables = []
    for file in files:
        with pa.memory_map(str(file)) as source:
            try:
                tables.append(pa.ipc.open_stream(source).read_all())
            except pa.ArrowInvalid:  # the file (random access) format instead of the stream format
                tables.append(pa.ipc.open_file(source).read_all())
    yield from _table_rows(tables)


def read_rows(path: Path) -> Iterator[tuple[int, object]]:
    """``(line or row number, row)`` of a JSONL, JSON, Parquet file or ``datasets`` directory; a JSONL line that is
    not UTF-8 or not JSON comes as a ``_BadRow`` carrying the reason (a ``.json`` file that is neither stops with its
    line)."""
    if path.is_dir():
        return _arrow_dir_rows(path)
    readers = {".jsonl": _jsonl_rows, ".json": _json_rows, ".parquet": _parquet_rows}
    reader = readers.get(path.suffix.lower())
    if reader is None:
        raise ValueError(f"{path}: unsupported data file type {path.suffix!r}; use .jsonl, .json, .parquet or a "
                         "datasets directory")
    return reader(path)


def _record(row, prompt_field: str, answer_field: str, answer_format: str, calls: bool = False,
            base: Path | None = None) -> dict:
    if isinstance(row, _BadRow):
        raise row
    if not isinstance(row, dict):
        raise _BadRow(f"expected an object, got {type(row).__name__}")
    if calls:
        try:
            return function_call_record(row, prompt_field, answer_field)
        except ValueError as err:
            raise _BadRow(str(err)) from None
    for name in (prompt_field, answer_field):
        if name not in row:
            raise _BadRow(f"missing field {name!r}")
    prompt, solution = row[prompt_field], row[answer_field]
    if not isinstance(prompt, str) or not prompt.strip():
        raise _BadRow(f"field {prompt_field!r} must be a non-empty string")
    answer = reference_answer(str(solution), answer_format)
    if answer is None:
        raise _BadRow(f"no {answer_format} answer found in field {answer_field!r}")
    fields = {k: v for k, v in row.items() if k not in (prompt_field, answer_field)}
    if fields.get(IMAGE_FIELD) is not None:  # checked now: a missing or broken image makes a bad row
        try:
            fields[IMAGE_FIELD] = image_sources(fields[IMAGE_FIELD], base)
        except ValueError as err:
            raise _BadRow(str(err)) from None
    return {"prompt": prompt, "answer": answer, "fields": fields}


def load_records(
    path: str | Path,
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    answer_format: str = "raw",
    on_bad_row: str = "skip",
) -> LoadedData:
    """Read a data set into ``{"prompt", "answer", "fields"}`` records.

    ``answer_format``: ``raw`` (the field as is), ``gsm8k`` (text after ``####``,
    commas removed), ``math`` (last ``\\boxed{}``), ``auto`` (the first that applies).
    ``on_bad_row``: ``skip`` (default; reported in ``LoadedData.skipped`` with the line
    number) or ``error`` (``ValueError`` naming the line). A field missing from every row
    is a configuration mistake and raises ``ValueError`` listing the fields that exist.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"unknown answer_format {answer_format!r}; choose one of: {', '.join(ANSWER_FORMATS)}")
    if on_bad_row not in BAD_ROW_POLICIES:
        raise ValueError(f"on_bad_row must be 'skip' or 'error', got {on_bad_row!r}")
    data = LoadedData(records=[])
    seen_fields: set[str] = set()
    used = {prompt_field: False, answer_field: False}
    for line_no, row in read_rows(path):
        if isinstance(row, dict):
            if not seen_fields:
                data.function_calls = is_function_call_row(row)
            seen_fields.update(row)
            for name in used:
                used[name] = used[name] or name in row or data.function_calls  # those rows name them their way
        try:
            data.records.append({**_record(row, prompt_field, answer_field, answer_format, data.function_calls,
                                           path.parent), "line": line_no})
        except _BadRow as bad:
            if (on_bad_row == "error" and not data.function_calls and isinstance(row, dict) and "messages" in row
                    and prompt_field not in row):
                raise ValueError(_missing_fields(path, [prompt_field], set(row), prompt_field)) from None
            if on_bad_row == "error":
                raise ValueError(f"{path}: line {line_no}: {bad}") from None
            data.skipped.append((line_no, str(bad)))
    missing = [name for name, found in used.items() if not found]
    if missing and seen_fields:
        raise ValueError(_missing_fields(path, missing, seen_fields, prompt_field))
    return data


def _missing_fields(path: Path, missing: list[str], seen: set[str], prompt_field: str) -> str:
    """The one line that says a field is in no row: chat rows (``messages``, no prompt) are demonstrations, which
    ``grpoplus sft --demos`` takes; other rows need their columns mapped."""
    if "messages" in seen and prompt_field in missing:
        return (f"{path}: the rows hold chat messages ('messages') and no {prompt_field!r}: they are demonstrations, "
                "not prompts with answers; pass them as `grpoplus sft --demos FILE` (sft.demos), and give --data "
                "(data.data) rows with a prompt and an answer (or set prompt_field to a column of prompt text)")
    return (f"{path}: field(s) {missing} appear in no row; the rows have: {', '.join(sorted(seen))}. "
            "Set prompt_field / answer_field to map them.")
