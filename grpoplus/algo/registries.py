"""The algorithm registries, importable without torch: the config validates names against them, and each registry
imports the module of its built-in functions (which need torch) at its first lookup. A user registers a function
of their own with the decorator, as before (``@ADVANTAGES.register("mine")``)."""

from __future__ import annotations

from typing import Any, Callable

from grpoplus.core.registry import Registry

Fn = Callable[..., Any]

ADVANTAGES: Registry[Fn] = Registry("advantage estimator", builtins=("grpoplus.algo.advantages",))
LOSSES: Registry[Fn] = Registry("policy loss", builtins=("grpoplus.algo.losses",))
AGGREGATIONS: Registry[Fn] = Registry("loss aggregation", builtins=("grpoplus.algo.aggregation",))
KL_ESTIMATORS: Registry[Fn] = Registry("KL estimator", builtins=("grpoplus.algo.kl",))
CORRECTIONS: Registry[Fn] = Registry("correction", builtins=("grpoplus.algo.corrections",))
DISTILL_LOSSES: Registry[Fn] = Registry("distillation loss", builtins=("grpoplus.algo.distill",))
