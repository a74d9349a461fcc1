"""Code reward: run a completion's program against test cases in the sandbox.

Tests come in either form, per sample (the ``tests`` field):

- stdin/stdout pairs: ``[{"input": "1 2\\n", "output": "3\\n"}, ...]`` or
  ``{"inputs": [...], "outputs": [...]}`` (APPS / LiveCodeBench layout); output compared
  line by line after stripping trailing whitespace;
- assert-style: ``["assert add(1, 2) == 3", ...]``, each run after the program.

Each test runs in its own sandboxed process, so a test that hangs costs only itself.
"""

from __future__ import annotations

from grpoplus.rewards.registry import REWARDS
from grpoplus.rewards.sandbox import check_limits, run_python

_FENCE = "```"


def extract_code(completion: str) -> str:
    """The last fenced code block (```python or plain ```), else the whole completion.

    >>> extract_code("Here:\\n```python\\nprint(1)\\n```\\nDone.")
    'print(1)\\n'
    """
    end = completion.rfind(_FENCE)
    start = completion.rfind(_FENCE, 0, end) if end >= 0 else -1
    if start < 0:
        return completion
    block = completion[start + len(_FENCE) : end]
    first_newline = block.find("\n")
    return block[first_newline + 1 :] if first_newline >= 0 else block


def _normalise_output(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def _as_cases(tests) -> list[tuple[str, str | None, str]]:
    """``(stdin, expected_stdout | None, extra_code)`` per test case."""
    if isinstance(tests, dict) and "inputs" in tests and "outputs" in tests:
        return [(str(i), str(o), "") for i, o in zip(tests["inputs"], tests["outputs"], strict=True)]
    if not isinstance(tests, (list, tuple)):
        raise ValueError(f"code tests must be a list or an inputs/outputs dict, got {type(tests).__name__}")
    cases = []
    for case in tests:
        if isinstance(case, str):
            cases.append(("", None, case))
        elif isinstance(case, dict) and "input" in case and "output" in case:
            cases.append((str(case["input"]), str(case["output"]), ""))
        else:
            raise ValueError(f"code test case must be an assert string or an input/output dict, got {case!r}")
    return cases


def code_reward(completion: str, tests, *, timeout_s: float = 5.0, memory_mb: int = 1024) -> float:
    """Fraction of the test cases the completion's program passes (0.0 when there are none).

    >>> code_reward("```python\\nprint(sum(map(int, input().split())))\\n```",
    ...             [{"input": "1 2", "output": "3"}, {"input": "2 2", "output": "5"}])
    0.5
    """
    cases = _as_cases(tests)
    if not cases:
        return 0.0
    program = extract_code(completion)
    passed = 0
    for stdin, expected, extra in cases:
        source = program + ("\n\n" + extra + "\n" if extra else "")
        result = run_python(source, stdin=stdin, timeout_s=timeout_s, memory_mb=memory_mb)
        if result.status != "ok":
            continue
        passed += expected is None or _normalise_output(result.stdout) == _normalise_output(expected)
    return passed / len(cases)


@REWARDS.register("code")
def code_batch(
    prompts: list[str], completions: list[str], *, tests: list, timeout_s: float = 5.0, memory_mb: int = 1024, **fields
) -> list[float | None]:
    """Registered form of :func:`code_reward`; a sample whose ``tests`` is None gets None."""
    return [
        None if t is None else code_reward(c, t, timeout_s=timeout_s, memory_mb=memory_mb)
        for c, t in zip(completions, tests, strict=True)
    ]


code_batch.check_options = check_limits  # timeout_s, memory_mb: refused as the specs are parsed
