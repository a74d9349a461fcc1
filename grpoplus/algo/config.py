"""``AlgoConfig``: every switch of ALGORITHMS.md, validated once, plus the named recipes (``presets.py``).

Build one with ``AlgoConfig(...)``, ``AlgoConfig.from_dict(d)``, ``AlgoConfig.preset(name,
**overrides)`` or ``cfg.replace(**overrides)``; all validate in ``__post_init__`` and raise
``ValueError`` naming the key and the allowed values. Each field's docstring (the string
after it) is what ``grpoplus train --help-config`` prints.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from grpoplus.algo.checks import check_values
from grpoplus.algo.presets import PRESETS
from grpoplus.algo.registries import ADVANTAGES, AGGREGATIONS, CORRECTIONS, DISTILL_LOSSES, KL_ESTIMATORS, LOSSES

_CHOICES = {
    "kl_placement": ("in_loss", "in_reward"),
    "gfpo_metric": ("length", "reward_per_token"),
    "adv_whiten": ("response", "token"),
    "reward_aggregation": ("sum", "gdpo"),
    "turn_credit": ("off", "process", "return_to_go"),
    "routing_replay": ("off", "r2", "r3"),
}
_REGISTRIES = {"adv_estimator": ADVANTAGES, "loss": LOSSES, "aggregation": AGGREGATIONS, "kl_estimator": KL_ESTIMATORS}
_OPTIONAL = {"dual_clip_c", "correction_low", "correction_high", "correction_cap_low", "overlong_cache", "rs_sum_threshold"}


def overlong_cache_len(max_len: int, cache: int | None) -> int:
    """``L_cache`` of the soft overlong punishment: ``cache`` when given, else ``max(1, max_len // 4)``."""
    return cache if cache is not None else max(1, max_len // 4)


@dataclass(frozen=True)
class AlgoConfig:
    """All algorithm switches (ALGORITHMS.md). Defaults: GRPO advantages, PPO clip 0.2,
    token-mean aggregation, no KL, no correction, every sampling trick off, one update per batch."""

    # -- section 1: advantages ----------------------------------------------------------------
    adv_estimator: str = "grpo"
    """Advantage estimator (section 1): grpo (DeepSeekMath, arXiv:2402.03300) | dr_grpo (Dr. GRPO,
    arXiv:2503.20783) | rloo (arXiv:2402.14740) | batch_std (Lite PPO, arXiv:2508.08221) |
    reinforce_pp (REINFORCE++, arXiv:2501.03262) | a name registered in ADVANTAGES."""
    adv_eps: float = 1e-6
    """eps of the std divisions of the estimators and of the batch whitening over responses; > 0."""
    adv_whiten: str = "response"
    """Population of the batch whitening of reinforce_pp and of GDPO: response (each response
    counts once) | token (each valid token counts once, as the REINFORCE++ paper, arXiv:2501.03262,
    and verl: a long response weighs more; advantages become [N, T])."""
    reward_aggregation: str = "sum"
    """How several reward components become advantages: sum (the weighted total, then the
    estimator) | gdpo (each component normalised within its group by the estimator, weighted sum,
    then batch-whitened; GDPO, arXiv:2601.05242)."""
    turn_credit: str = "off"
    """Multi-turn credit (sections 1 and 12): off (one outcome advantage per trajectory, from adv_estimator) |
    process (DeepSeekMath's process estimator, arXiv:2402.03300 sec. 4.1.3: each turn's reward is a step reward
    ending at the turn's last token, all step rewards of the group normalised together, A_t = the sum of the
    normalised rewards of the turns from t on; biased toward more turns when the mean step reward is negative and
    fewer when positive, since a trajectory subtracts one mean per turn it takes: verl RFC #7244) | return_to_go
    (A_t = G_t - mean_g G_0, G_t the sum of the rewards of the turns from t on: one baseline per group, so no
    bonus or cost for taking a turn). The reward functions' score of the transcript counts as
    the last turn's reward."""

    # -- section 2: the policy loss -------------------------------------------------------------
    loss: str = "clip"
    """Per-token policy loss (sections 2, 10): clip | gspo | gspo_token | gmpo | cispo | tis_pg |
    tis_pg_seq | reinforce | sapo | dppo_tv | dppo_kl | clip_cov | kl_cov | a name registered in LOSSES."""
    eps_low: float = 0.2
    """Lower trust-region width, >= 0: ratio clip 1-eps_low for clip/gspo/gspo_token (< 1 there;
    PPO, arXiv:1707.06347), clip_cov and cispo; log-space bound for gmpo; the TV / binary-KL threshold
    for A <= 0 of dppo_tv/dppo_kl (DPPO, arXiv:2602.04879)."""
    eps_high: float = 0.2
    """Upper trust-region width, >= 0: ratio clip 1+eps_high (eps_high > eps_low is clip-higher,
    DAPO, arXiv:2503.14476); log-space bound for gmpo; the threshold for A > 0 of dppo_tv/dppo_kl."""
    dual_clip_c: float | None = None
    """Dual clip for A < 0 of clip, gspo, gspo_token, clip_cov: the loss is capped at -c*A
    (Ye et al. 2020, arXiv:1912.09729); > 1, None = off."""
    pg_cap: float = 2.0
    """Truncation C of the truncated-IS policy-gradient losses, > 0: tis_pg (token ratio),
    tis_pg_seq (sequence ratio), dppo_tv/dppo_kl (verl's clip_ratio_c; 20 in the DPPO preset)
    (IMPALA, arXiv:1802.01561)."""
    tau_pos: float = 1.0
    """SAPO gate temperature for A > 0 (SAPO, arXiv:2511.20347: 1.0); > 0."""
    tau_neg: float = 1.05
    """SAPO gate temperature for A <= 0 (SAPO: 1.05; a larger tau makes the gradient of an
    off-policy token fade faster); > 0."""
    cov_ratio: float = 2e-4
    """Fraction of the batch's tokens restrained by clip_cov (a random subset of the candidates)
    or kl_cov (the largest covariances), in (0, 1] (Cui et al., arXiv:2505.22617: 2e-4 Clip-Cov,
    2e-3 KL-Cov at 7B)."""
    cov_lb: float = 1.0
    """clip_cov: a candidate token's covariance must exceed this (the paper's recipe: 1.0)."""
    cov_ub: float = 5.0
    """clip_cov: ...and stay below this (recipe: 5.0); > cov_lb."""
    kl_cov_coef: float = 1.0
    """kl_cov: coefficient of the |log r| penalty on the selected tokens (recipe: 1.0); >= 0."""
    aggregation: str = "token_mean"
    """Loss aggregation (section 3): token_mean (DAPO) | seq_mean_token_mean (GRPO) |
    seq_mean_token_sum_norm (Dr. GRPO) | seq_mean_token_sum | a name registered in AGGREGATIONS."""
    max_len: int = 512
    """L_max, the max new tokens (the Dr. GRPO denominator, the overlong rules); >= 1. The
    trainer sets it to rollout.max_new_tokens unless given."""

    # -- entropy bonus ----------------------------------------------------------------------------
    entropy_coef: float = 0.0
    """Entropy bonus: -c * agg(H) is added to the loss (same aggregation as the policy term);
    c >= 0, 0 = off; with entropy_adaptive, the starting c (TRL entropy_coef)."""
    entropy_adaptive: bool = False
    """Adapt c after every optimizer step toward entropy_target (Skywork-OR1, arXiv:2505.22312;
    TRL use_adaptive_entropy): c += delta when the entropy is at or below the target, else c -= delta;
    the bonus applies only while the last entropy is at or below the target."""
    entropy_target: float = 0.2
    """Target token-mean entropy in nats of adaptive control (Skywork-OR1: 0.2); >= 0."""
    entropy_coef_delta: float = 0.005
    """Step of c per optimizer step under adaptive control (Skywork-OR1: 0.005); > 0."""
    entropy_coef_min: float = 0.0
    """Lower bound of c under adaptive control; >= 0."""
    entropy_coef_max: float = 1.0
    """Upper bound of c under adaptive control; >= entropy_coef_min."""

    # -- section 4: KL to the reference ---------------------------------------------------------
    beta: float = 0.0
    """KL coefficient, >= 0; 0 skips the reference model entirely (not loaded, not run)."""
    kl_estimator: str = "k3"
    """Per-token KL estimator (Schulman 2020): k1 | k2 | k3 (DeepSeekMath) | k3_is (DeepSeek-V3.2,
    unbiased off-policy; needs in_loss) | a name registered in KL_ESTIMATORS."""
    kl_placement: str = "in_loss"
    """in_loss (beta * aggregated KL added to the loss) | in_reward (R - beta * sum k1, InstructGPT)."""
    ref_reset_every: int = 0
    """Period N of the reference update: every N steps pi_ref <- a*pi + (1-a)*pi_ref with
    a = ref_update_alpha (ProRL's reset when a = 1, arXiv:2505.24864); 0 = never; needs beta > 0."""
    ref_update_alpha: float = 1.0
    """a of the reference update, in (0, 1]: 1 = ProRL's hard reset; < 1 = the TR-DPO soft update
    (arXiv:2404.09656; TRL ref_model_mixup_alpha, 0.6 there)."""
    ref_reset_optimizer: bool = False
    """Also clear the optimizer state at a hard reset (ProRL); needs ref_update_alpha = 1."""

    # -- section 11: on-policy distillation (needs learner.teacher) ---------------------------------
    lambda_opd: float = 0.0
    """Weight of the teacher's token advantage (section 11; Thinking Machines' on-policy distillation, prime-rl
    opd, verl distillation): A_{i,t} = A_i + lambda_opd * (-(logp_old - logp_T)), through any loss of section 2;
    >= 0, 0 = off. Needs learner.teacher."""
    opd_outcome: bool = True
    """Keep the outcome advantage A_i in the opd advantage; false: the teacher's term alone (pure distillation,
    the rewards are still scored and logged)."""
    distill_loss: str = "off"
    """A full-vocabulary divergence to the teacher added to the loss (section 11): off | reverse_kl (GKD,
    arXiv:2306.13649) | gjsd (TRL's generalized_jsd_loss, beta = gjsd_beta) | a name registered in
    DISTILL_LOSSES. Aggregated like the policy term. Needs a local learner.teacher with the policy's vocabulary."""
    distill_coef: float = 1.0
    """Coefficient of distill_loss in the loss; >= 0."""
    gjsd_beta: float = 0.5
    """beta of gjsd in [0, 1]: 0 = forward KL(teacher || student), 1 = reverse KL(student || teacher) (TRL)."""

    # -- section 5: training-inference mismatch ---------------------------------------------------
    corrections: tuple[str, ...] = ()
    """Rollout corrections, applied in order (section 5): tis_token | tis_seq | mis_token | mis_seq |
    geo_mask | deepseek_v32_mask | rs_token_k2 | rs_token_k3 | rs_seq_{sum,mean,max}_{k2,k3} | a name
    registered in CORRECTIONS. A list or a comma-separated string."""
    correction_cap: float = 2.0
    """C (upper bound) of tis_token / tis_seq (Yao et al. 2025, TIS); > 0."""
    correction_cap_low: float | None = None
    """C_min (lower bound) of tis_token / tis_seq: w clamped to [C_min, C]; in (0, C], None = no
    lower bound (TRL vllm_importance_sampling_clip_min)."""
    correction_low: float | None = 0.5
    """C_low of mis_token / mis_seq / geo_mask: tokens or responses with w below are dropped; None = open."""
    correction_high: float | None = 2.0
    """C_high of mis_token / mis_seq / geo_mask; None = open."""
    v32_mask_delta: float = 0.1
    """delta of deepseek_v32_mask: drop a negative-advantage response whose mean log(mu / pi) exceeds it."""
    rs_threshold: float = 0.01
    """Upper bound of the per-token-scale k2/k3 divergence between the sampler and pi_old in
    rs_token_*, rs_seq_mean_*, rs_seq_max_* (verl rollout_rs_threshold; 0.01 is verl's seq_mean_k3
    default); > 0."""
    rs_sum_threshold: float | None = None
    """Upper bound of the summed k2/k3 of a response in rs_seq_sum_* (whole-response scale); > 0;
    required by those corrections."""

    # -- section 6: sampling-side tricks --------------------------------------------------------
    dynamic_sampling: bool = False
    """DAPO dynamic sampling (arXiv:2503.14476): over-sample and refill until the batch holds groups
    with reward spread."""
    max_sampling_rounds: int = 3
    """Generation rounds dynamic sampling may spend per step; >= 1."""
    zero_variance_filter: bool = False
    """Drop groups whose rewards are all equal, without refill (Reinforce-Rej, arXiv:2504.11343)."""
    overlong_filter: bool = False
    """m = 0 for responses cut by the length limit (DAPO overlong filtering)."""
    overlong_shaping: bool = False
    """DAPO soft overlong punishment added to the reward."""
    overlong_cache: int | None = None
    """L_cache of the soft overlong punishment, in [1, max_len]; None = max(1, max_len // 4)."""
    gfpo_keep: int = 0
    """GFPO (arXiv:2508.09726): k responses kept per group; 0 = off; below rollout.group_size."""
    gfpo_metric: str = "length"
    """GFPO ranking: length (the shortest) | reward_per_token (the highest)."""
    entropy_mask_rho: float = 1.0
    """Only the top-rho entropy tokens carry loss (Beyond the 80/20 rule, arXiv:2506.01939); in (0, 1], 1.0 = off."""

    # -- section 7: updates per batch ------------------------------------------------------------
    num_iterations: int = 1
    """Passes over each rollout batch; >= 1."""
    num_minibatches: int = 1
    """Optimizer steps per pass (groups stay whole); >= 1, at most rollout.prompts_per_step. With one
    iteration and one mini-batch r = 1 exactly and every ratio-dependent rule is inert (inert_switches)."""

    # -- section 8: mixture-of-experts routing replay ----------------------------------------------
    routing_replay: str = "off"
    """MoE routing replay (section 8): off | r2 (record the learner's top-k experts while computing
    logp_old and replay them in every training forward of the batch; forces learner.logp_old=recompute;
    the Routing Replay of GSPO, arXiv:2507.18071) | r3 (replay the rollout engine's top-k experts in
    every learner forward; Ma et al. 2025, arXiv:2510.11370; rollout.engine=hf). The gate weights stay
    the learner router's softmax over the replayed experts, so the router keeps learning. Needs an MoE
    policy (--model tiny-moe)."""

    def __post_init__(self):
        if isinstance(self.corrections, str):
            names = tuple(c.strip() for c in self.corrections.split(",") if c.strip())
            object.__setattr__(self, "corrections", names)
        elif isinstance(self.corrections, list):
            object.__setattr__(self, "corrections", tuple(self.corrections))
        for key in ("routing_replay", "turn_credit", "distill_loss"):  # YAML 1.1 reads a bare `off` (CLI, config file) as false
            if getattr(self, key) is False:
                object.__setattr__(self, key, "off")
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
        """A named recipe of ALGORITHMS.md sections 9-10, with optional overrides."""
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
        """Optimizer steps per rollout batch, ``num_iterations * num_minibatches`` (ALGORITHMS.md section 7)."""
        return self.num_iterations * self.num_minibatches

    @property
    def cache_len(self) -> int:
        """L_cache of the soft overlong punishment."""
        return overlong_cache_len(self.max_len, self.overlong_cache)

    @property
    def entropy_bonus(self) -> bool:
        """True when the loss needs the token entropy with its gradient."""
        return self.entropy_coef != 0 or self.entropy_adaptive

    def loss_kwargs(self) -> dict[str, Any]:
        return {"eps_low": self.eps_low, "eps_high": self.eps_high, "dual_clip_c": self.dual_clip_c, "pg_cap": self.pg_cap,
                "tau_pos": self.tau_pos, "tau_neg": self.tau_neg, "cov_ratio": self.cov_ratio, "cov_lb": self.cov_lb,
                "cov_ub": self.cov_ub, "kl_cov_coef": self.kl_cov_coef}

    def correction_kwargs(self) -> dict[str, Any]:
        return {"cap": self.correction_cap, "cap_low": self.correction_cap_low, "low": self.correction_low,
                "high": self.correction_high, "delta": self.v32_mask_delta, "rs_threshold": self.rs_threshold,
                "rs_sum_threshold": self.rs_sum_threshold}

    # -- update structure (section 7) ---------------------------------------------------------

    def clipping_can_act(self, pi_old_is_sampler: bool = False) -> bool:
        """Whether any ratio-dependent rule (clip eps, dual clip, gspo/gmpo clip, cispo cap, tis_pg
        caps, DPPO region, SAPO gate, KL-Cov penalty, k3_is ratio) can act.

        With one update per batch ``pi_theta == pi_old`` at the update, so ``r = 1`` exactly and
        none can; with ``updates_per_batch > 1`` the later updates move away from ``pi_old``.
        ``pi_old_is_sampler``: ``learner.logp_old=rollout`` (the ratio is against the sampler's
        ``mu``), where the rules act on the training-inference mismatch even with one update.
        """
        return self.updates_per_batch > 1 or pi_old_is_sampler

    def inert_switches(self, pi_old_is_sampler: bool = False) -> list[str]:
        """``key=value`` of the configured switches that cannot act (``clipping_can_act`` is False), else [].

        The trainer prints them as a one-line notice. Rollout corrections are never listed: they
        act on the sampler-vs-learner mismatch, which exists with one update too.
        """
        if self.clipping_can_act(pi_old_is_sampler):
            return []
        params = getattr(LOSSES.get(self.loss), "ratio_params", ())
        inert = [f"{p}={getattr(self, p)!r}" for p in params
                 if getattr(self, p, None) is not None and not (p == "pg_cap" and self.pg_cap < 1)]
        if self.beta > 0 and self.kl_placement == "in_loss" and getattr(KL_ESTIMATORS.get(self.kl_estimator),
                                                                         "ratio_dependent", False):
            inert.append(f"kl_estimator={self.kl_estimator!r}")
        return inert

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

    @classmethod
    def choices(cls, name: str) -> tuple[str, ...] | None:
        """The values field ``name`` takes (a registry's names as registered now, or the field's fixed choices; for
        ``corrections``, the names its list takes), or None for a field of any number or free text."""
        if name in _REGISTRIES:
            return tuple(_REGISTRIES[name].names())
        if name == "distill_loss":
            return ("off", *DISTILL_LOSSES.names())
        if name == "corrections":
            return tuple(CORRECTIONS.names())
        return _CHOICES.get(name)

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
            for param in getattr(CORRECTIONS.get(name), "needs", ()):
                if self.correction_kwargs()[param] is None:
                    raise ValueError(f"AlgoConfig.corrections: {name!r} needs {param} (set it to a number)")
        if self.distill_loss != "off" and self.distill_loss not in DISTILL_LOSSES:
            raise ValueError(f"AlgoConfig.distill_loss={self.distill_loss!r} is not valid; choose one of: off, "
                             f"{', '.join(DISTILL_LOSSES.names())}")
        if len(set(self.corrections)) != len(self.corrections):
            raise ValueError(f"AlgoConfig.corrections lists a correction twice: {list(self.corrections)}")

    def _check_values(self) -> None:
        check_values(self)

    @property
    def uses_teacher(self) -> bool:
        """True when a teacher model scores the samples (the opd advantage or a distillation loss)."""
        return self.lambda_opd > 0 or self.distill_loss != "off"
