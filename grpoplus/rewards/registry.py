"""The reward registry. Every entry: ``fn(prompts, completions, **fields) -> list[float | None]``.

``fields`` are per-sample lists (``answer=[...]``, ``completion_length=[...]`` in
tokens, ``finished=[...]``, ``tests=[...]``); parameters of a parametrised reward
(``max_len=...``) arrive as plain keyword arguments from the spec's ``kwargs``.
None means "does not apply to this sample".
"""

from grpoplus.core.registry import Registry

REWARDS: Registry = Registry("reward")
