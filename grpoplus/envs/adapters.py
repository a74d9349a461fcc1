"""What a ``data.env`` factory may return, and how each kind is recognised (in this order):

1. a kind a registered adapter recognises (:data:`ADAPTERS`: OpenEnv environments and clients, textarena games),
   wrapped by it (first: those objects have a ``step`` too, taking other arguments);
2. an object with ``step``: a native environment (:mod:`grpoplus.envs.base`) or a Gymnasium-style text
   environment (``reset`` answering ``(observation, info)``, ``step`` answering ``(observation, reward,
   terminated, truncated, info)``), played as it is;
3. a list of functions: tools (:class:`~grpoplus.envs.tools.ToolEnv`);
4. any other object with public methods: a TRL-style tool environment (``reset(**row)``, its public methods the
   tools, an optional ``get_reward()``), wrapped as a :class:`~grpoplus.envs.tools.ToolEnv`."""

from __future__ import annotations

import importlib
import importlib.util
import threading
from typing import Any, Callable

from grpoplus.envs.tools import ToolEnv, tool_class_env

# (recognise(obj) -> bool, wrap(obj) -> environment), tried in order before the tool kinds
ADAPTERS: list[tuple[Callable[[Any], bool], Callable[[Any], Any]]] = []

# library -> the grpoplus module whose import appends that library's adapters to ADAPTERS
PACKAGE_ADAPTERS = {"openenv": "grpoplus.envs.openenv", "textarena": "grpoplus.envs.textarena"}
_registered = threading.Event()
_registering = threading.Lock()


def _package_adapters() -> None:
    """Import the adapter modules of the environment libraries that are installed, once (environments are made
    in threads of their own, so the first caller registers while the others wait); a library that is not
    installed has no objects to recognise. The modules do not import their library (some take seconds)."""
    if _registered.is_set():
        return
    with _registering:
        if not _registered.is_set():
            for package, module in PACKAGE_ADAPTERS.items():
                if importlib.util.find_spec(package) is not None:
                    importlib.import_module(module)
            _registered.set()


def adapt(obj: Any) -> Any:
    """The environment ``obj`` is, wrapped where it needs to be (see the module docstring)."""
    _package_adapters()
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
