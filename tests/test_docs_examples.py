"""Every `grpoplus train` command in README and the docs is a valid command: its config builds and checks, and its
dry run plans it (grpoplus train --dry-run: nothing loaded, what this machine lacks listed as needs). The files an
example names as the user's own (a config, an environment, a run to resume) are made here first. The Python quick
start trains for real (tests/test_readme_python.py)."""

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from grpoplus.config import build_config
from grpoplus.entry.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[tuple[str, str]]:
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.split(r"\s+#\s", line)[0]
                found += [(str(page.relative_to(ROOT)), part.strip()) for part in line.split("&&")
                          if part.strip().startswith("grpoplus train")]
    return found


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
