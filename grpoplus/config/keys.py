"""The keys' documentation: every key with its value, choices and docstring (``--help-config``, the reference page)."""

from __future__ import annotations

import dataclasses

from grpoplus.config.load import build_config, choices
from grpoplus.config.sections import SECTIONS, Config
from grpoplus.core.fielddocs import field_docs


def describe_keys(cfg: Config | None = None) -> str:
    """Every key with its value in ``cfg`` (default: the default config, the dapo preset's algo
    section) and its doc (for ``--help-config``)."""
    import textwrap

    cfg = cfg or build_config()
    lines = []
    for section, cls in SECTIONS.items():
        lines.append(f"[{section}]")
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            value = getattr(getattr(cfg, section), f.name)
            allowed = choices(section, f.name)
            shown = f"  {f.name} = {list(value) if isinstance(value, tuple) else value!r}"
            lines.append(shown + (f"  ({' | '.join(allowed)})" if allowed else ""))
            if docs.get(f.name):
                lines += textwrap.wrap(docs[f.name], width=100, initial_indent=" " * 6, subsequent_indent=" " * 6,
                                   break_on_hyphens=False)
    return "\n".join(lines)
