"""The docstring examples of the reward modules are run as tests."""

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", ["extract", "format", "length", "math_answer", "pipeline", "code", "sandbox",
                                    "function_call", "tool_calls"])
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(f"grpoplus.rewards.{module}"))
    assert result.attempted > 0 and result.failed == 0
