"""Name -> object registries: the one extension mechanism of grpoplus.

Every pluggable piece (advantage estimators, per-token losses, corrections, aggregations,
rewards, tasks, rollout engines) lives in a :class:`Registry`. A user adds one with the
decorator, in their own module, without editing the library::

    from grpoplus.algo import ADVANTAGES

    @ADVANTAGES.register("my_estimator")
    def my_estimator(rewards, group_ids, eps):
        ...
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A dict of named objects of one kind with a registering decorator.

    Duplicate names are rejected; a lookup miss lists the names that exist. ``builtins`` names modules whose import
    registers built-in entries and that the registry's own module cannot import (they import it): they are imported
    at the first lookup.
    """

    def __init__(self, kind: str, builtins: tuple[str, ...] = ()):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._builtins = list(builtins)

    def _load_builtins(self) -> None:
        while self._builtins:
            importlib.import_module(self._builtins.pop(0))

    def register(self, name: str, *, overwrite: bool = False) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            self.add(name, obj, overwrite=overwrite)
            return obj

        return decorator

    def add(self, name: str, obj: T, *, overwrite: bool = False) -> None:
        if not overwrite and name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = obj

    def get(self, name: str) -> T:
        self._load_builtins()
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.kind} {name!r}; choose one of: {', '.join(sorted(self._items))}"
            ) from None

    def names(self) -> list[str]:
        self._load_builtins()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def import_object(spec: str) -> object:
    """Load ``module:attribute`` (the user-code escape hatch), or ``path/to/file.py:attribute``.

    Raises ``ValueError`` naming the spec when the module or attribute cannot be found.
    """
    if ":" not in spec:
        raise ValueError(f"{spec!r} is not of the form 'module:function' or 'file.py:function'")
    module_name, _, attr = spec.rpartition(":")
    try:
        if module_name.endswith(".py"):
            path = pathlib.Path(module_name)
            if not path.is_file():
                raise ValueError(f"{spec!r}: file {module_name!r} does not exist")
            mod_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{spec!r}: cannot import module {module_name!r} ({err})") from err
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{spec!r}: module {module_name!r} has no attribute {attr!r}") from None
