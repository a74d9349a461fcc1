"""Field docstrings (the string literal under each field of a dataclass), read from the source: the one reader behind
the config reference (``--help-config``, the docs' config page) and the doctor's thresholds."""

from __future__ import annotations

import ast
import inspect
import textwrap


def field_docs(cls: type) -> dict[str, str]:
    """``{field name: its docstring, whitespace collapsed}`` of ``cls``; {} when its source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())  # type: ignore[union-attr]
    return docs
