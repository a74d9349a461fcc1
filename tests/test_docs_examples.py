"""Every command line of README's and the docs' ```bash blocks is a valid one. Each `grpoplus <command> ...` (also
as `python -m grpoplus`, `torchrun ... -m grpoplus`) parses with the CLI's own parser (grpoplus.entry.cli.parse, running
nothing): an unknown command or flag fails with its page and line. Each `python -m grpoplus.<module>` names a module
that exists. Each `grpoplus train` command is also planned: its config builds and checks, and its dry run plans it
(grpoplus train --dry-run: nothing loaded, what this machine lacks listed as needs). The files an example names as the
user's own (a config, an environment, a run to resume) are made here first. The Python blocks run in
tests/test_docs_python.py; the README's Python quick start trains for real (tests/test_readme_python.py)."""

import contextlib
import importlib.util
import io
import re
import shlex
from pathlib import Path

import pytest

from grpoplus.config import build_config
from grpoplus.entry.cli import main, parse

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _shell_lines() -> list[tuple[str, str]]:
    """``(page:line, command)`` for every command of every ```bash block: continuations joined, comments dropped,
    commands split at ``&&``, ``||``, ``;`` and ``|``."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in re.finditer(r"```bash\n(.*?)```", text, re.S):
            line_no = text[:block.start(1)].count("\n") + 1
            for line in re.sub(r"\\\n", lambda m: " \x00", block.group(1)).splitlines():
                where = f"{page.relative_to(ROOT)}:{line_no}"
                line_no += 1 + line.count("\x00")
                line = re.split(r"\s+#\s", line.replace("\x00", ""))[0]
                found += [(where, part.strip()) for part in re.split(r"&&|\|\||;|\|", line) if part.strip()]
    return found


def _cli_words(command: str) -> list[str] | None:
    """The words after ``grpoplus`` of a command that runs the grpoplus CLI, else None."""
    start = re.match(r"(?:python3? -m |torchrun .*?-m )?grpoplus(?:\s|$)", command)
    return shlex.split(command[start.end():]) if start else None


def _commands() -> list[tuple[str, str]]:
    return [(where.split(":")[0], command) for where, command in _shell_lines() if command.startswith("grpoplus train")]


SHELL = _shell_lines()
CLI = [(where, command) for where, command in SHELL if _cli_words(command) is not None]
MODULES = [(where, m.group(1)) for where, command in SHELL for m in re.finditer(r"python -m (grpoplus\.[\w.]+)", command)]


def test_the_docs_have_command_line_examples_of_every_kind():
    assert len(CLI) >= 50 and len(MODULES) >= 3
    used = {_cli_words(command)[0] for _, command in CLI}
    assert {"train", "sft", "report", "compare", "doctor", "traces", "presets", "lab", "selftest"} <= used, used


@pytest.mark.parametrize("where,command", CLI, ids=[f"{w}:{c[9:50]}" for w, c in CLI])
def test_every_grpoplus_command_parses_with_the_cli_parser(where, command):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parse(_cli_words(command))
        except SystemExit as exit_:
            pytest.fail(f"{where}: {command}\n{err.getvalue()[-600:]} (exit {exit_.code})")


@pytest.mark.parametrize("where,module", MODULES, ids=[f"{w}:{m}" for w, m in MODULES])
def test_every_grpoplus_module_run_with_python_m_exists(where, module):
    assert importlib.util.find_spec(module) is not None, f"{where}: python -m {module}: no such module"


def test_a_wrong_command_or_flag_fails_the_parse():
    for words in (["trian", "--out", "x"], ["train", "--outt", "x"], ["report", "runs/demo", "steps=3"]):
        with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            parse(words)
    assert _cli_words("torchrun --standalone -m grpoplus train --out x") == ["train", "--out", "x"]
    assert _cli_words("python -m grpoplus.sft.warmstart --task countdown") is None


COMMANDS = _commands()


def test_the_docs_have_training_examples():
    assert len(COMMANDS) >= 30


@pytest.mark.parametrize("page,command", COMMANDS, ids=[f"{p}:{c[15:60]}" for p, c in COMMANDS])
def test_every_training_example_is_a_valid_command(page, command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    (tmp_path / "my.yaml").write_text("rollout:\n  group_size: 4\n")
    (tmp_path / "my_env.py").write_text("def make(**row):\n    return None\n")
    brevity = "def brevity(prompts, completions, **fields):\n    return [0.0] * len(completions)\n"
    (tmp_path / "my_rewards.py").write_text(brevity)  # a reward named by its file
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "rewards.py").write_text(brevity)  # and by its module
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    build_config().save(tmp_path / "runs" / "demo" / "config.yaml")
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main([*shlex.split(command)[1:], "--dry-run"])
    assert code == 0, f"{page}: {command}\n{err.getvalue()[-600:]}"


BENCHMARKS = [(where, re.sub(r"^(?:\w+=\S*\s+)+", "", command)) for where, command in SHELL
              if re.match(r"(?:\w+=\S*\s+)*python3? benchmarks/\w+\.py", command)]  # environment variables aside


class _Parsed(Exception):
    """Raised in place of running a benchmark, once its own parser accepted the command's arguments."""


def test_the_docs_show_benchmark_commands():
    assert len(BENCHMARKS) >= 20 and len({c.split()[1] for _, c in BENCHMARKS}) >= 10


def _benchmark_parse_error(command: str, monkeypatch) -> str | None:
    """None when ``python benchmarks/X.py ARGS``'s X exists and its argparse parser takes ARGS (nothing runs), else
    what is wrong."""
    import argparse
    import sys

    words = shlex.split(re.split(r"\s\d?>>?\s", command)[0])  # the output redirections left out
    script = ROOT / words[1]
    if not script.exists():
        return f"no {words[1]}"
    monkeypatch.syspath_prepend(str(script.parent))
    spec = importlib.util.spec_from_file_location(f"_docs_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    depth = [0]  # parse_args calls parse_known_args: only the outer call ends the benchmark
    for name in ("parse_args", "parse_known_args"):
        original = getattr(argparse.ArgumentParser, name)

        def parsed(self, *args, _original=original, **kwargs):
            depth[0] += 1
            try:
                result = _original(self, *args, **kwargs)
            finally:
                depth[0] -= 1
            if self.prog == script.name and depth[0] == 0:  # the benchmark's own parser (prog: the script's name)
                raise _Parsed
            return result

        monkeypatch.setattr(argparse.ArgumentParser, name, parsed)
    monkeypatch.setattr(sys, "argv", [str(script), *words[2:]])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            module.main()
        except _Parsed:
            return None
        except SystemExit as exit_:
            return f"{err.getvalue()[-600:]} (exit {exit_.code})"
    return "its main() returned without parsing its arguments"


@pytest.mark.parametrize("where,command", BENCHMARKS, ids=[f"{w}:{c[7:60]}" for w, c in BENCHMARKS])
def test_every_benchmark_command_parses_with_the_benchmarks_own_parser(where, command, monkeypatch):
    assert _benchmark_parse_error(command, monkeypatch) is None, f"{where}: {command}"


def test_a_wrong_benchmark_or_flag_fails_the_parse(monkeypatch):
    assert "unrecognized arguments: --modle" in _benchmark_parse_error("python benchmarks/engines.py --modle tiny",
                                                                        monkeypatch)
    assert _benchmark_parse_error("python benchmarks/nope.py", monkeypatch) == "no benchmarks/nope.py"


def test_every_extra_an_install_line_names_is_one_the_package_has():
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = [(where, extra) for where, command in SHELL if "pip install" in command
             for group in re.findall(r"\.\[([\w,-]+)\]", command) for extra in group.split(",")]
    assert len(named) >= 5
    assert [(where, extra) for where, extra in named if extra not in extras] == []


def _json_blocks() -> list[tuple[str, str]]:
    return [(f"{page.relative_to(ROOT)}:{page.read_text()[:block.start()].count(chr(10)) + 1}", block.group(1))
            for page in PAGES for block in re.finditer(r"```json\n(.*?)```", page.read_text(), re.S)]


JSON_BLOCKS = _json_blocks()


@pytest.mark.parametrize("where,text", JSON_BLOCKS, ids=[w for w, _ in JSON_BLOCKS])
def test_every_json_block_is_json(where, text):
    """A ```json block (a data row, a printed record) is one or more JSON values, as a .jsonl file holds them."""
    import json

    decoder, at, values = json.JSONDecoder(), 0, 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        try:
            _, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as err:
            pytest.fail(f"{where}: not JSON: {err}")
        values += 1
    assert values >= 1
