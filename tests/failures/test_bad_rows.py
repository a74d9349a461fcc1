"""Bad data rows reach the user: a line that is not UTF-8 is skipped and named in the command's report (or stops it
in one line under data.on_bad_row=error), and chat rows given as --data are named demonstrations for --demos."""

import json

from grpoplus.entry.cli import main
from grpoplus.sft.source import file_demos

NO_WARM_START = ["--model", "tiny-untrained"]
"""A data set's run names its model: the built-in tiny one is warm-started on a built-in task (the config rule models),
but for tiny-untrained."""


def _bad_utf8_file(tmp_path, rows: list[dict], bad_line: int):
    path = tmp_path / "d.jsonl"
    lines = [json.dumps(r).encode() for r in rows]
    lines.insert(bad_line - 1, b'{"prompt": "3+4=\xff", "answer": "7"}')  # 0xff: never UTF-8
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


def test_a_line_that_is_not_utf8_is_skipped_and_reported_by_the_dry_run(tmp_path, capsys):
    data = _bad_utf8_file(tmp_path, [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(12)], bad_line=7)
    assert main(["train", "--dry-run", "--data", data, *NO_WARM_START, "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "skipped 1 malformed rows (line 7: not UTF-8 (byte 0xff at column 17)" in out


def test_a_line_that_is_not_utf8_stops_the_run_in_one_line_under_error(tmp_path, capsys):
    data = _bad_utf8_file(tmp_path, [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(12)], bad_line=7)
    assert main(["train", "--data", data, *NO_WARM_START, "on_bad_row=error", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"grpoplus train: error: {data}: line 7: not UTF-8 (byte 0xff at column 17); "
                                        "save the file as UTF-8"]


def test_a_demonstration_that_is_not_utf8_is_skipped_with_its_line(tmp_path, tok):
    path = tmp_path / "demos.jsonl"
    good = json.dumps({"prompt": "1+1=", "completion": "2"}).encode()
    path.write_bytes(good + b"\n" + b'{"prompt": "\xfe", "completion": "2"}\n' + good + b"\n")
    demos, skipped = file_demos(path, tok, "messages", 0, "skip")
    assert len(demos) == 2 and skipped[0][0] == 2 and "not UTF-8 (byte 0xfe at column 13)" in skipped[0][1]


def test_chat_rows_given_as_data_are_named_demonstrations(tmp_path, capsys):
    path = tmp_path / "demos.jsonl"
    chat = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    path.write_text(json.dumps(chat) + "\n" + json.dumps(chat) + "\n")
    for command, policy in (("train", "skip"), ("train", "error")):
        assert main([command, "--data", str(path), *NO_WARM_START, "--out", str(tmp_path / command),
                     f"on_bad_row={policy}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "they are demonstrations" in err[0] and "grpoplus sft --demos FILE" in err[0]
        assert "appear in no row" not in err[0]
    # a supervised stage takes no data set's rows at all: refused with the config, before any row is read
    assert main(["sft", "--data", str(path), *NO_WARM_START, "--out", str(tmp_path / "sft")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hold answers, not worked demonstrations" in err[0] and "grpoplus sft --demos FILE" in err[0]
