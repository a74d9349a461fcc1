"""``AlgoConfig``: every switch of ALGORITHMS.md, validated once, plus the named recipes (section 9).

Build one with ``AlgoConfig(...)``, ``AlgoConfig.from_dict(d)``, ``AlgoConfig.preset(name,
**overrides)`` or ``cfg.replace(**overrides)``; all validate in ``__post_init__`` and raise
``ValueError`` naming the key and the allowed values.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from grpoplus.algo.advantages import ADVANTAGES
from grpoplus.algo.aggregation import AGGREGATIONS
from grpoplus.algo.corrections import CORRECTIONS
from grpoplus.algo.filters import overlong_cache_len
from grpoplus.algo.kl import KL_ESTIMATORS
from grpoplus.algo.losses import LOSSES
from grpoplus.registry import Registry

PRESETS: Registry[dict[str, Any]] = Registry("algorithm preset")

_CHOICES = {"kl_placement": ("in_loss", "in_reward"), "gfpo_metric": ("length", "reward_per_token")}
_REGISTRIES = {"adv_estimator": ADVANTAGES, "loss": LOSSES, "aggregation": AGGREGATIONS, "kl_estimator": KL_ESTIMATORS}
_OPTIONAL = {"dual_clip_c", "correction_low", "correction_high", "overlong_cache"}
# Losses whose trust region is [1-eps_low, 1+eps_high] on the ratio: eps_low must stay below 1.
_RATIO_CLIP_LOSSES = ("clip", "gspo", "gspo_token")


@dataclass(frozen=True)
class AlgoConfig:
    """All algorithm switches (ALGORITHMS.md). Defaults: GRPO advantages, PPO clip 0.2,
    token-mean aggregation, no KL, no correction, every sampling trick off."""

    adv_estimator: str = "grpo"  # section 1: grpo | dr_grpo | rloo | batch_std | reinforce_pp
    adv_eps: float = 1e-6  # eps of the std division
    loss: str = "clip"  # section 2: clip | gspo | gspo_token | gmpo | cispo | tis_pg | reinforce
    eps_low: float = 0.2  # lower clip 1-eps_low (log space for gmpo)
    eps_high: float = 0.2  # upper clip 1+eps_high; > eps_low is clip-higher (DAPO)
    dual_clip_c: float | None = None  # dual clip for A<0 (Ye et al. 2020), c > 1; None = off
    pg_cap: float = 2.0  # C of tis_pg
    aggregation: str = "token_mean"  # section 3
    max_len: int = 512  # L_max: max new tokens (Dr. GRPO denominator, overlong rules)
    beta: float = 0.0  # KL coefficient; 0 skips the reference model entirely
    kl_estimator: str = "k3"  # section 4: k1 | k2 | k3 | k3_is
    kl_placement: str = "in_loss"  # in_loss | in_reward (in_reward always uses k1)
    corrections: tuple[str, ...] = ()  # section 5, applied in order
    correction_cap: float = 2.0  # C of tis_token / tis_seq
    correction_low: float | None = 0.5  # C_low of mis_* / geo_mask; None = open
    correction_high: float | None = 2.0  # C_high of mis_* / geo_mask; None = open
    v32_mask_delta: float = 0.1  # delta of deepseek_v32_mask
    dynamic_sampling: bool = False  # section 6: DAPO over-sample and refill
    max_sampling_rounds: int = 3  # generation rounds dynamic sampling may spend per step
    zero_variance_filter: bool = False  # drop all-equal groups without refill
    overlong_filter: bool = False  # m = 0 for responses cut by the length limit
    overlong_shaping: bool = False  # DAPO soft overlong punishment added to the reward
    overlong_cache: int | None = None  # L_cache; None = max(1, max_len // 4)
    gfpo_keep: int = 0  # GFPO: k responses kept per group; 0 = off
    gfpo_metric: str = "length"  # length (shortest) | reward_per_token (highest)
    entropy_mask_rho: float = 1.0  # top-rho entropy tokens carry loss; 1.0 = off
    ref_reset_every: int = 0  # ProRL reference reset every N optimizer steps; 0 = never
    ref_reset_optimizer: bool = False  # also clear the optimizer state at a reset
    num_iterations: int = 1  # section 7: passes over each rollout batch
    num_minibatches: int = 1  # optimizer steps per pass

    def __post_init__(self):
        if isinstance(self.corrections, str):
            names = tuple(c.strip() for c in self.corrections.split(",") if c.strip())
            object.__setattr__(self, "corrections", names)
        elif isinstance(self.corrections, list):
            object.__setattr__(self, "corrections", tuple(self.corrections))
        self._check_types()
        self._check_names()
        self._check_values()

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def _check_keys(cls, keys) -> None:
        valid = cls.field_names()
        for key in keys:
            if key not in valid:
                raise ValueError(f"unknown AlgoConfig key {key!r}; valid keys: {', '.join(valid)}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AlgoConfig":
        """Build from a plain dict (e.g. the ``algo:`` section of a YAML config)."""
        cls._check_keys(d)
        return cls(**d)

    @classmethod
    def preset(cls, name: str, **overrides) -> "AlgoConfig":
        """A named recipe of ALGORITHMS.md section 9, with optional overrides."""
        base = dict(PRESETS.get(name))
        cls._check_keys(overrides)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def preset_names(cls) -> list[str]:
        return PRESETS.names()

    def replace(self, **overrides) -> "AlgoConfig":
        """A copy with some fields changed (validated again)."""
        self._check_keys(overrides)
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["corrections"] = list(self.corrections)
        return d

    # -- derived values handed to the pure functions ----------------------------------------

    @property
    def updates_per_batch(self) -> int:
        """Optimizer steps per rollout batch (ALGORITHMS.md section 7)."""
        return self.num_iterations * self.num_minibatches

    @property
    def cache_len(self) -> int:
        """L_cache of the soft overlong punishment."""
        return overlong_cache_len(self.max_len, self.overlong_cache)

    def loss_kwargs(self) -> dict[str, Any]:
        return {"eps_low": self.eps_low, "eps_high": self.eps_high, "dual_clip_c": self.dual_clip_c, "pg_cap": self.pg_cap}

    def correction_kwargs(self) -> dict[str, Any]:
        return {"cap": self.correction_cap, "low": self.correction_low, "high": self.correction_high, "delta": self.v32_mask_delta}

    # -- validation -------------------------------------------------------------------------

    def _check_types(self) -> None:
        for f in dataclasses.fields(self):
            value, default = getattr(self, f.name), f.default
            if value is None and f.name in _OPTIONAL:
                continue
            if f.name == "corrections":
                if not all(isinstance(c, str) for c in value):
                    raise ValueError(f"AlgoConfig.corrections must be a list of names, got {value!r}")
                continue
            kind = type(default) if default is not None else (int if f.name == "overlong_cache" else float)
            ok = isinstance(value, bool) if kind is bool else (
                isinstance(value, kind) or (kind is float and isinstance(value, int))
            ) and not isinstance(value, bool)
            if not ok:
                raise ValueError(f"AlgoConfig.{f.name} must be a {kind.__name__}, got {value!r}")
            if kind is float and not math.isfinite(value):
                raise ValueError(f"AlgoConfig.{f.name} must be finite, got {value!r}")

    def _check_names(self) -> None:
        for key, registry in _REGISTRIES.items():
            value = getattr(self, key)
            if value not in registry:
                raise ValueError(f"AlgoConfig.{key}={value!r} is not valid; choose one of: {', '.join(registry.names())}")
        for key, choices in _CHOICES.items():
            if getattr(self, key) not in choices:
                raise ValueError(f"AlgoConfig.{key}={getattr(self, key)!r} is not valid; choose one of: {', '.join(choices)}")
        for name in self.corrections:
            if name not in CORRECTIONS:
                raise ValueError(
                    f"AlgoConfig.corrections: unknown correction {name!r}; choose from: {', '.join(CORRECTIONS.names())}"
                )
        if len(set(self.corrections)) != len(self.corrections):
            raise ValueError(f"AlgoConfig.corrections lists a correction twice: {list(self.corrections)}")

    def _check_values(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(f"AlgoConfig.{msg}")

        need(self.adv_eps > 0, f"adv_eps must be > 0, got {self.adv_eps}")
        need(self.eps_low >= 0 and self.eps_high >= 0, f"eps_low/eps_high must be >= 0, got {self.eps_low}/{self.eps_high}")
        if self.loss in _RATIO_CLIP_LOSSES:
            need(self.eps_low < 1, f"eps_low must be < 1 for loss={self.loss!r} (ratio clip 1-eps_low), got {self.eps_low}")
        need(self.dual_clip_c is None or self.dual_clip_c > 1, f"dual_clip_c must be > 1 (or None = off), got {self.dual_clip_c}")
        need(self.pg_cap > 0, f"pg_cap must be > 0, got {self.pg_cap}")
        need(self.max_len >= 1, f"max_len must be >= 1, got {self.max_len}")
        need(self.beta >= 0, f"beta must be >= 0, got {self.beta}")
        need(
            not (self.kl_estimator == "k3_is" and self.kl_placement == "in_reward"),
            "kl_estimator='k3_is' needs kl_placement='in_loss' (in_reward always uses k1)",
        )
        need(self.correction_cap > 0, f"correction_cap must be > 0, got {self.correction_cap}")
        need(self.correction_low is None or self.correction_low >= 0, f"correction_low must be >= 0, got {self.correction_low}")
        need(
            self.correction_low is None or self.correction_high is None or self.correction_low <= self.correction_high,
            f"correction_low ({self.correction_low}) must be <= correction_high ({self.correction_high})",
        )
        need(self.max_sampling_rounds >= 1, f"max_sampling_rounds must be >= 1, got {self.max_sampling_rounds}")
        need(
            not (self.dynamic_sampling and self.zero_variance_filter),
            "dynamic_sampling and zero_variance_filter are exclusive (dynamic sampling already drops all-equal groups, with refill)",
        )
        need(
            self.overlong_cache is None or 0 < self.overlong_cache <= self.max_len,
            f"overlong_cache must be in [1, max_len={self.max_len}], got {self.overlong_cache}",
        )
        need(self.gfpo_keep >= 0, f"gfpo_keep must be >= 0 (0 = off), got {self.gfpo_keep}")
        need(0 < self.entropy_mask_rho <= 1, f"entropy_mask_rho must be in (0, 1], got {self.entropy_mask_rho}")
        need(self.ref_reset_every >= 0, f"ref_reset_every must be >= 0 (0 = never), got {self.ref_reset_every}")
        need(
            not (self.ref_reset_every > 0 and self.beta == 0),
            "ref_reset_every > 0 needs beta > 0 (with beta = 0 there is no reference model to reset)",
        )
        need(self.num_iterations >= 1, f"num_iterations must be >= 1, got {self.num_iterations}")
        need(self.num_minibatches >= 1, f"num_minibatches must be >= 1, got {self.num_minibatches}")


# -- section 9: named recipes --------------------------------------------------------------

PRESETS.add("grpo", dict(adv_estimator="grpo", loss="clip", eps_low=0.2, eps_high=0.2,
                         aggregation="seq_mean_token_mean", kl_estimator="k3", kl_placement="in_loss", beta=0.04))
PRESETS.add("dapo", dict(adv_estimator="grpo", loss="clip", eps_low=0.2, eps_high=0.28, aggregation="token_mean",
                         dynamic_sampling=True, overlong_shaping=True, beta=0.0))
PRESETS.add("dr_grpo", dict(adv_estimator="dr_grpo", loss="clip", eps_low=0.2, eps_high=0.2,
                            aggregation="seq_mean_token_sum_norm", beta=0.0))
PRESETS.add("gspo", dict(adv_estimator="grpo", loss="gspo", eps_low=3e-4, eps_high=4e-4,
                         aggregation="seq_mean_token_mean", beta=0.0))
PRESETS.add("gmpo", dict(adv_estimator="grpo", loss="gmpo", eps_low=0.4, eps_high=0.4, beta=0.0))
PRESETS.add("cispo", dict(adv_estimator="grpo", loss="cispo", eps_low=1.0, eps_high=4.0, aggregation="token_mean", beta=0.0))
PRESETS.add("rloo", dict(adv_estimator="rloo"))
PRESETS.add("reinforce_pp", dict(adv_estimator="reinforce_pp"))
PRESETS.add("lite_ppo", dict(adv_estimator="batch_std", aggregation="token_mean"))
PRESETS.add("olmo3", dict(adv_estimator="dr_grpo", loss="clip", eps_low=0.2, eps_high=0.28, aggregation="token_mean",
                          dynamic_sampling=True, corrections=("tis_token",), beta=0.0))
PRESETS.add("deepseek_v32", dict(adv_estimator="dr_grpo", loss="clip", eps_low=0.2, eps_high=0.2, kl_estimator="k3_is",
                                 kl_placement="in_loss", beta=1e-3, corrections=("deepseek_v32_mask",)))
PRESETS.add("prorl", dict(adv_estimator="grpo", loss="clip", eps_low=0.2, eps_high=0.4, kl_estimator="k3",
                          kl_placement="in_loss", beta=1e-4, ref_reset_every=200, ref_reset_optimizer=True))
PRESETS.add("gfpo", dict(PRESETS.get("grpo"), gfpo_keep=4, gfpo_metric="length"))  # keep 4 of the group (8 by default; the paper keeps 8 of 16)
