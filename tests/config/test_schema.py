"""The config schema is a package with no ML dependency: importing it loads neither torch nor transformers (a
launcher, a sweep tool or the docs build reads and validates configs without them), and the choices it lists are
the ones the leaves that act on them accept."""

import subprocess
import sys
import typing

import pytest

from grpoplus.config import Config


def test_importing_the_schema_loads_no_torch():
    code = ("import sys, grpoplus.config, grpoplus.algo.config\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'numpy', 'vllm', 'ray') if m in sys.modules)\n"
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_the_algo_package_still_hands_out_its_functions():
    # the algo core's names load on first use; every name it lists resolves, from the module that defines it
    import grpoplus.algo as algo
    from grpoplus.algo.advantages import compute_advantages

    assert algo.compute_advantages is compute_advantages
    assert all(getattr(algo, name) is not None for name in algo.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        algo.nope  # noqa: B018


def choices(section: str, key: str) -> tuple[str, ...]:
    hints = typing.get_type_hints(type(getattr(Config(), section)))
    return typing.get_args(hints[key])


def test_the_schema_lists_the_choices_the_leaves_accept():
    from grpoplus.data.lengths import LONG_PROMPTS
    from grpoplus.data.loaders import ANSWER_FORMATS, BAD_ROW_POLICIES
    from grpoplus.learner.precision import PRECISIONS

    assert choices("data", "answer_format") == ANSWER_FORMATS
    assert choices("data", "on_bad_row") == BAD_ROW_POLICIES
    assert choices("data", "long_prompts") == LONG_PROMPTS
    assert choices("learner", "precision") == PRECISIONS


def test_a_registry_loads_its_builtins_at_the_first_lookup():
    from grpoplus.algo.registries import ADVANTAGES, LOSSES

    assert {"grpo", "dr_grpo", "rloo"} <= set(ADVANTAGES.names())
    assert "clip" in LOSSES and callable(LOSSES.get("clip"))


def test_the_algo_packages_type_checking_imports_name_what_it_hands_out():
    # the TYPE_CHECKING imports (what editors and type checkers see) and the names __getattr__ hands out agree
    import ast
    from pathlib import Path

    import grpoplus.algo as algo

    tree = ast.parse(Path(algo.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    imported = {a.name: n.module for n in block.body for a in n.names}
    assert imported == algo._HOMES
