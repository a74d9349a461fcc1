"""OpenEnv (``openenv-core``) environments played as grpoplus environments: an in-process ``Environment``, or a
client of one served over WebSocket (an ``EnvClient`` subclass, a ``GenericEnvClient``, or their ``.sync()``
wrapper).

A ``data.env`` factory may return any of them; :func:`grpoplus.envs.adapters.adapt` wraps it in :class:`OpenEnv`:

- the policy's turn becomes the environment's Action: the action type's one string field holds the text. The type
  comes from the most derived class that names one, by its ``step`` / ``_step_payload`` annotation or its generic
  parameters (``Environment[MyAction, ...]``, ``EnvClient[MyAction, ...]``); a ``GenericEnvClient`` (dict actions)
  reads it from the server's ``/schema``. An action type with no string field, several, or another required field
  needs a converter: return ``OpenEnv(env, action_from_text=...)`` from the factory;
- an Observation becomes text (:func:`observation_text`, or ``observation_to_text``): its string fields when it
  has nothing else, else a JSON object of its fields; ``reward``, ``done`` and ``metadata`` are not text;
- the turn's reward and the episode's end are the Observation's ``reward`` and ``done``.

``reset`` gets the data row's fields: those the environment's ``reset`` names (all of them when it takes
``**kwargs``); a client sends them all and the server keeps those its environment takes, so they must be JSON. Its
observation is the prompt (one with no text: the row's prompt); a step's observation with no text is none. A
client's methods are coroutines: they run on the episode runner's event loop, which holds each trajectory's
WebSocket session. A server needs a session per concurrent trajectory: ``create_app(env_class, action_class,
observation_class, max_concurrent_envs=N)`` with ``SUPPORTS_CONCURRENT_SESSIONS = True`` on the environment class.

Importing this module does not import ``openenv`` (its import takes seconds): objects are recognised only once
their classes are loaded, which they must be for such an object to exist.
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
import typing
import urllib.request
from typing import Any, Callable

from grpoplus.envs.adapters import ADAPTERS
from grpoplus.envs.calls import awaited

NOT_TEXT = ("reward", "done", "metadata")  # Observation fields that are the step's result, not its text
_ENVIRONMENT = ("openenv.core.env_server.interfaces", "Environment")
_CLIENTS = (("openenv.core.env_client", "EnvClient"), ("openenv.core.sync_client", "SyncEnvClient"))


def _loaded(module: str, name: str) -> type | None:
    """The class ``module.name`` when that module is already imported, else None (no import: see the docstring)."""
    return getattr(sys.modules.get(module), name, None)


def is_environment(obj: Any) -> bool:
    """An in-process OpenEnv ``Environment``."""
    cls = _loaded(*_ENVIRONMENT)
    return cls is not None and isinstance(obj, cls)


def is_client(obj: Any) -> bool:
    """An OpenEnv client (``EnvClient`` or its ``SyncEnvClient`` wrapper)."""
    classes = tuple(c for c in (_loaded(*spec) for spec in _CLIENTS) if c is not None)
    return bool(classes) and isinstance(obj, classes)


def is_openenv(obj: Any) -> bool:
    """An OpenEnv environment or client: what :class:`OpenEnv` wraps."""
    return is_environment(obj) or is_client(obj)


class OpenEnv:
    """One OpenEnv environment or client as a grpoplus environment (see the module docstring).

    ``action_from_text(text) -> Action`` (a dict for a ``GenericEnvClient``) and ``observation_to_text(observation)
    -> str`` replace the defaults.
    """

    def __init__(self, target: Any, action_from_text: Callable[[str], Any] | None = None,
                 observation_to_text: Callable[[Any], str] | None = None):
        if not is_openenv(target):
            raise TypeError(f"OpenEnv wraps an openenv Environment or EnvClient, not {type(target).__name__}")
        self.target, self.client = target, is_client(target)
        self.to_text = observation_to_text or observation_text
        self._to_action = action_from_text

    def reset(self, **row) -> str | None:
        fields = row if self.client else _accepted(self.target.reset, row)
        observation, _, _ = self._result(awaited(self.target.reset(**fields)))
        return self.to_text(observation) or None

    def step(self, action: str) -> tuple[str | None, float | None, bool, dict]:
        observation, reward, done = self._result(awaited(self.target.step(self._action(action))))
        return self.to_text(observation) or None, reward, done, {}

    def close(self) -> None:
        awaited(self.target.close())

    def _action(self, text: str) -> Any:
        """The text as the environment's action (the converter is found on the first turn: it may ask the server)."""
        if self._to_action is None:
            self._to_action = action_converter(self.target)
        return self._to_action(text)

    def _result(self, value: Any) -> tuple[Any, float | None, bool]:
        """(observation, reward, done) of an Observation (an environment's answer) or a client's StepResult."""
        observation = value.observation if self.client else value
        reward = value.reward if self.client else getattr(value, "reward", None)
        done = value.done if self.client else getattr(value, "done", False)
        return observation, None if reward is None else float(reward), bool(done)


def observation_text(observation: Any) -> str:
    """An Observation (a pydantic model, or a client's dict) as text: its string fields, one per line, when it has
    no other field; else its fields as a JSON object. ``reward``, ``done``, ``metadata`` and private fields are left
    out (they are the step's result, not what the policy reads)."""
    if observation is None or isinstance(observation, str):
        return observation or ""
    data = observation.model_dump() if hasattr(observation, "model_dump") else dict(observation)
    data = {k: v for k, v in data.items() if k not in NOT_TEXT and not k.startswith("_")}
    if all(isinstance(v, str) for v in data.values()):
        return "\n".join(v for v in data.values() if v)
    return json.dumps(data, ensure_ascii=False, default=str)


def action_converter(target: Any) -> Callable[[str], Any]:
    """text -> the action ``target`` takes: its action type with the one string field set to the text, or for a
    client of dict actions, ``{field: text}`` with the field the server's ``/schema`` names."""
    action_type = find_action_type(target)
    if action_type is not None:
        field = text_field(action_type)
        if field is None:
            raise ValueError(f"the OpenEnv action type {action_type.__name__} does not have exactly one string field "
                             f"(and no other required one): pass OpenEnv(env, action_from_text=...) that builds a "
                             f"{action_type.__name__} from the policy's text")
        return lambda text: action_type(**{field: text})
    if not is_client(target):
        raise ValueError(f"the action type of OpenEnv environment {type(target).__name__} is unknown: subclass "
                         "Environment[YourAction, YourObservation, State], annotate step(self, action: YourAction), "
                         "or pass OpenEnv(env, action_from_text=...)")
    url = schema_url(target)
    field = schema_text_field(url)
    if field is None:
        raise ValueError(f"the action schema at {url} does not have exactly one string field (and no other required "
                         "one): pass OpenEnv(client, action_from_text=...) that builds the action dict from the text")
    return lambda text: {field: text}


def find_action_type(target: Any) -> type | None:
    """The Action subclass ``target`` takes, from the most derived class that names one: the annotation of
    ``action`` in the ``step`` (environment) or ``_step_payload`` (client) it defines, else a generic parameter of
    its bases (``Environment[A, O, S]``, ``EnvClient[A, O, S]``); None when none does (a ``GenericEnvClient`` takes
    dicts)."""
    from openenv.core.env_server.types import Action  # loaded already: target is an openenv object

    target = getattr(target, "async_client", target)  # a SyncEnvClient: the client it wraps
    method = "_step_payload" if is_client(target) else "step"
    for cls in type(target).__mro__:
        candidates = [_annotation(cls.__dict__[method])] if method in cls.__dict__ else []
        candidates += [arg for base in cls.__dict__.get("__orig_bases__", ()) for arg in typing.get_args(base)]
        for candidate in candidates:
            if isinstance(candidate, type) and issubclass(candidate, Action):
                return candidate
    return None


def _annotation(fn: Callable) -> Any:
    """The annotation of ``fn``'s ``action`` parameter (a postponed one looked up in ``fn``'s module), or None."""
    parameter = inspect.signature(fn).parameters.get("action")
    annotation = None if parameter is None else parameter.annotation
    if isinstance(annotation, str):
        annotation = vars(sys.modules[fn.__module__]).get(annotation)
    return annotation


def text_field(action_type: type) -> str | None:
    """The action type's one string field (``str`` or ``str | None``) when it has exactly one and no other required
    field (``metadata`` aside), else None."""
    fields = {name: f for name, f in action_type.model_fields.items() if name != "metadata"}
    strings = [name for name, f in fields.items() if f.annotation in (str, str | None)]
    required = [name for name, f in fields.items() if f.is_required() and name not in strings]
    return strings[0] if len(strings) == 1 and not required else None


def schema_url(client: Any) -> str:
    """The ``/schema`` address of the server a client talks to (its WebSocket address, ``ws://host:port/ws``)."""
    ws = getattr(client, "async_client", client)._ws_url
    http = "https://" + ws[len("wss://"):] if ws.startswith("wss://") else "http://" + ws[len("ws://"):]
    return http.removesuffix("/ws") + "/schema"


@functools.lru_cache(maxsize=32)
def schema_text_field(url: str, timeout_s: float = 10.0) -> str | None:
    """The one string property of the action schema a server publishes at ``url`` (asked once per server), when it
    has exactly one and no other required property (``metadata`` aside); else None."""
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:
        schema = json.load(answer)["action"]
    properties = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
    strings = [k for k, v in properties.items() if _is_string(v)]
    required = [k for k in schema.get("required", []) if k not in strings and k != "metadata"]
    return strings[0] if len(strings) == 1 and not required else None


def _is_string(prop: dict) -> bool:
    """A JSON-schema property of type string (``str | None`` is ``anyOf`` string and null)."""
    kinds = [prop.get("type")] + [p.get("type") for p in prop.get("anyOf", [])]
    return "string" in kinds and all(k in ("string", "null", None) for k in kinds)


def _accepted(fn: Callable, row: dict) -> dict:
    """The fields of ``row`` that ``fn`` names, or all of them when it takes ``**kwargs``."""
    parameters = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return row
    return {k: v for k, v in row.items() if k in parameters}


ADAPTERS.append((is_openenv, OpenEnv))
