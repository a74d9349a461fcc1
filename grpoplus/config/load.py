"""Reading a config: a preset, a YAML file (nested by section or flat), ``key=value`` overrides, Python values and a
saved run's config, merged (later wins), every value validated by pydantic against its field's annotation, then fitted
and checked by :mod:`grpoplus.config.rules`. A bare key (``eps_high=0.3``) names the one field of that name in any
section; a dotted key (``algo.eps_high=0.3``) names it explicitly. Unknown keys and values of the wrong type are errors
naming the key."""

from __future__ import annotations

import dataclasses
import functools
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, TypeAdapter, ValidationError

from grpoplus.algo.config import AlgoConfig
from grpoplus.config.rules import check, fit_defaults
from grpoplus.config.sections import BOOL_CHOICES, SECTIONS, Config, ConfigError, response_budget


def _field_index() -> dict[str, list[str]]:
    """Bare field name -> sections that have it."""
    index: dict[str, list[str]] = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            index.setdefault(f.name, []).append(section)
    return index


def _resolve_key(key: str) -> tuple[str, str]:
    index = _field_index()
    if "." in key:
        section, _, name = key.partition(".")
        if section not in SECTIONS:
            raise ConfigError(f"unknown config section {section!r} in {key!r}; sections: {', '.join(SECTIONS)}")
        if section not in index.get(name, []):
            valid = ", ".join(f.name for f in dataclasses.fields(SECTIONS[section]))
            raise ConfigError(f"unknown config key {key!r}; keys of {section}: {valid}")
        return section, name
    sections = index.get(key)
    if not sections:
        raise ConfigError(f"unknown config key {key!r}; see `grpoplus train --help-config` for the keys")
    if len(sections) > 1:
        raise ConfigError(f"config key {key!r} is ambiguous: write one of {', '.join(s + '.' + key for s in sections)}")
    return sections[0], key


@functools.cache
def _adapter(section: str, name: str) -> TypeAdapter:
    """pydantic's validator of one field's annotation (numbers are accepted as text: `out=2024`)."""
    hint = typing.get_type_hints(SECTIONS[section])[name]
    return TypeAdapter(hint, config=ConfigDict(coerce_numbers_to_str=True))


def choices(section: str, name: str) -> tuple | None:
    """The values a field takes (a ``Literal`` annotation's, or an ``algo`` field's registry or fixed choices), else
    None."""
    if SECTIONS[section] is AlgoConfig:
        return AlgoConfig.choices(name)
    hint = typing.get_type_hints(SECTIONS[section])[name]
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else None


def _validate(section: str, name: str, value: Any) -> Any:
    """``value`` as the field's type (pydantic, lax: "5e-4" -> 5e-4, 2 -> 2.0, "a,b" -> [a, b] for a list), or a
    one-line error naming the key and what it takes."""
    key = f"{section}.{name}"
    hint = typing.get_type_hints(SECTIONS[section])[name]
    if hint in (list, tuple) or typing.get_origin(hint) in (list, tuple):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]  # `loggers=tensorboard,wandb`
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]  # `eval_k=4`
    try:
        return _adapter(section, name).validate_python(value)
    except ValidationError:
        allowed = choices(section, name)
        expected = f"one of {', '.join(map(str, allowed))}" if allowed else f"a valid {getattr(hint, '__name__', hint)}"
        raise ConfigError(f"config key {key}: {value!r} is not {expected}") from None


def parse_override(text: str) -> tuple[str, Any]:
    """``"eps_high=0.3"`` -> ``("eps_high", 0.3)`` with YAML typing of the value."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    key, _, raw = text.partition("=")
    value = yaml.safe_load(raw) if raw.strip() else ""
    return key.strip(), value


def build_config(preset: str | None = None, yaml_path: str | None = None,
                 overrides: list[str] | None = None, base: dict | None = None, values: dict | None = None) -> Config:
    """Preset + YAML file + key=value overrides + ``values`` (later wins) -> a validated :class:`Config`.

    ``base`` is a saved resolved config (``config.yaml`` of a run, for resume); the preset
    then only fills what ``base`` does not say. ``values``: config keys (bare or dotted) and Python
    values, as :class:`grpoplus.Trainer` passes its keywords.
    """
    given, values = values, {name: {} for name in SECTIONS}
    if base:
        _merge_nested(values, base, source="saved config")
        values["algo"].pop("max_len", None)  # saved as derived from rollout.max_new_tokens: derived again
    if yaml_path:
        path = Path(yaml_path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {yaml_path!r} does not exist")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {yaml_path!r} must hold a mapping, not {type(loaded).__name__}")
        _merge_yaml(values, loaded)
    for key, value in [parse_override(text) for text in overrides or []] + list((given or {}).items()):
        section, name = _resolve_key(key)
        values[section][name] = value
    _one_length(values)
    preset = values["run"].get("preset") if preset is None else preset
    preset = preset or "dapo"
    values["run"]["preset"] = preset
    if overrides is not None:
        values["run"]["overrides"] = list(values["run"].get("overrides", [])) + list(overrides)
    return _materialise(preset, values)


def _merge_nested(values: dict, nested: dict, source: str) -> None:
    for section, items in nested.items():
        if section not in SECTIONS:
            raise ConfigError(f"{source}: unknown config section {section!r}; sections: {', '.join(SECTIONS)}")
        if not isinstance(items, dict):
            raise ConfigError(f"{source}: section {section!r} must be a mapping")
        for name, value in items.items():
            _resolve_key(f"{section}.{name}")
            values[section][name] = value


def _merge_yaml(values: dict, loaded: dict) -> None:
    """A YAML file may be nested by section or flat (bare or dotted keys), or mix both."""
    for key, value in loaded.items():
        if key in SECTIONS and isinstance(value, dict):
            _merge_nested(values, {key: value}, source="config file")
        else:
            section, name = _resolve_key(key)
            values[section][name] = value


def _one_length(values: dict[str, dict[str, Any]]) -> None:
    """algo.max_len and rollout.max_new_tokens are one length: the one given sets the other."""
    algo, rollout = values["algo"], values["rollout"]
    if "max_len" in algo and "max_new_tokens" in rollout and algo["max_len"] != rollout["max_new_tokens"]:
        raise ConfigError(f"algo.max_len={algo['max_len']!r} and rollout.max_new_tokens={rollout['max_new_tokens']!r} "
                         "name one length (the longest response) but disagree: set only rollout.max_new_tokens "
                         "(algo.max_len follows it)")
    if "max_len" in algo:
        rollout["max_new_tokens"] = algo["max_len"]
    elif "max_new_tokens" in rollout:
        algo["max_len"] = rollout["max_new_tokens"]


def _materialise(preset: str, values: dict[str, dict[str, Any]]) -> Config:
    # every section's values through the fields' types (pydantic); each section then checks its own ranges
    typed = {section: {name: _validate(section, name, _from_bool(f"{section}.{name}", v)) for name, v in items.items()}
             for section, items in values.items()}
    sections = {section: cls(**typed[section]) for section, cls in SECTIONS.items() if cls is not AlgoConfig}
    algo_values = typed["algo"]
    algo_values["max_len"] = response_budget(sections["data"], sections["rollout"])  # one length (_one_length)
    try:
        sections["algo"] = AlgoConfig.preset(preset, **algo_values)
    except ValueError as err:  # the algo section's own checks name the class's fields: say the user's keys
        raise ConfigError(str(err).replace("AlgoConfig.", "algo.")) from None
    cfg = Config(**sections)
    fit_defaults(cfg, given={f"{section}.{name}" for section, items in values.items() for name in items})
    check(cfg)
    return cfg


def _from_bool(key: str, value: Any) -> Any:
    return BOOL_CHOICES[key].get(value, value) if isinstance(value, bool) and key in BOOL_CHOICES else value


def resumed_config(run_dir: str | Path, overrides: list[str] | tuple = ()) -> Config:
    """The config a resumed run takes, the one reader of a run's saved ``config.yaml``: the saved config with
    ``overrides`` on top (e.g. a larger ``max_steps``) and ``run.out`` the run's directory (an override naming
    another is dropped: a resumed run stays where it is)."""
    from grpoplus.core.rundir import RunDir

    path = RunDir(str(run_dir)).config
    if not path.is_file():
        raise FileNotFoundError(f"cannot resume: {path} does not exist (is {str(run_dir)!r} a grpoplus run directory?)")
    saved = yaml.safe_load(path.read_text())
    kept = [o for o in overrides if not o.startswith(("run.out=", "out="))]
    return build_config(overrides=kept, base=saved, values={"run.out": str(run_dir)})
