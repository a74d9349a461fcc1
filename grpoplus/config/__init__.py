"""One config tree for a training run, validated once at the edge: what a user may say (:mod:`.sections`), how it
is read (:mod:`.load`: preset, YAML, ``key=value``, Python values, a saved run's config), what it derives and refuses
(:mod:`.rules`) and the keys' documentation (:mod:`.keys`)."""

from grpoplus.config.keys import describe_keys, field_docs
from grpoplus.config.load import build_config, choices, parse_override, resumed_config
from grpoplus.config.sections import (
    BOOL_CHOICES,
    SECTIONS,
    Config,
    ConfigError,
    DataConfig,
    LearnerConfig,
    RayConfig,
    RolloutConfig,
    RunConfig,
    env_of,
    response_budget,
)

__all__ = ["BOOL_CHOICES", "SECTIONS", "Config", "ConfigError", "DataConfig", "LearnerConfig", "RayConfig",
           "RolloutConfig", "RunConfig", "build_config", "choices", "describe_keys", "env_of", "field_docs",
           "parse_override", "response_budget", "resumed_config"]
