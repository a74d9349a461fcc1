"""What a ``data.env`` factory may return, and how each kind is recognised (in this order):

1. an object with ``step``: a native environment (:mod:`grpoplus.envs.base`) or a Gymnasium-style text
   environment (``reset`` answering ``(observation, info)``, ``step`` answering ``(observation, reward,
   terminated, truncated, info)``), played as it is;
2. a kind a registered adapter recognises (:data:`ADAPTERS`: OpenEnv environments and clients, textarena games),
   wrapped by it;
3. a list of functions: tools (:class:`~grpoplus.envs.tools.ToolEnv`);
4. any other object with public methods: a TRL-style tool environment (``reset(**row)``, its public methods the
   tools, an optional ``get_reward()``), wrapped as a :class:`~grpoplus.envs.tools.ToolEnv`.
"""

from __future__ import annotations

from typing import Any, Callable

from grpoplus.envs.tools import ToolEnv, tool_class_env

# (recognise(obj) -> bool, wrap(obj) -> environment), tried in order before the tool kinds
ADAPTERS: list[tuple[Callable[[Any], bool], Callable[[Any], Any]]] = []


def adapt(obj: Any) -> Any:
    """The environment ``obj`` is, wrapped where it needs to be (see the module docstring)."""
    for recognise, wrap in ADAPTERS:
        if recognise(obj):
            return wrap(obj)
    if callable(getattr(obj, "step", None)):
        return obj
    if isinstance(obj, (list, tuple)) and obj and all(callable(fn) for fn in obj):
        return ToolEnv(list(obj))
    if obj is None:
        raise ValueError("the environment factory returned None: return an environment")
    return tool_class_env(obj)
