"""The named recipes of ALGORITHMS.md sections 9 and 10 (``AlgoConfig.preset(name)``).

Each preset sets only what its paper (or the named reference implementation) specifies;
everything else keeps ``AlgoConfig``'s default. Update structure: the recipes take several
optimizer steps per rollout batch (DAPO 512 prompts in mini-batches of 32 = 16 updates;
MiniMax-M1 16; the GSPO paper 4 mini-batches; verl's recipes for SAPO, DPPO, Clip-/KL-Cov
256 prompts in mini-batches of 32 = 8). At grpoplus's default batch (32 prompts x 8
responses) a mini-batch of 2-4 prompts is too noisy, so the presets that follow such a
recipe take ``num_minibatches=4`` (8 prompts = 64 responses per update), ``dapo`` included
(its demo learns as much as with one update: docs/concepts/algorithms.md, "Presets").
"""

from __future__ import annotations

from typing import Any

from grpoplus.core.registry import Registry

PRESETS: Registry[dict[str, Any]] = Registry("algorithm preset")

# -- section 9 -------------------------------------------------------------------------------
# DeepSeekMath takes one update per exploration stage; in practice the batch is split (verl's
# GRPO example: 1024 prompts in mini-batches of 256 = 4 updates).
PRESETS.add("grpo", dict(adv_estimator="grpo", loss="clip", eps_low=0.2, eps_high=0.2, aggregation="seq_mean_token_mean",
                         kl_estimator="k3", kl_placement="in_loss", beta=0.04, num_minibatches=4))
# DAPO: 512 prompts in mini-batches of 32 = 16 updates per batch in the paper; 4 here.
PRESETS.add("dapo", dict(adv_estimator="grpo", loss="clip", eps_low=0.2, eps_high=0.28, aggregation="token_mean",
                         dynamic_sampling=True, overlong_shaping=True, beta=0.0, num_minibatches=4))
PRESETS.add("dr_grpo", dict(adv_estimator="dr_grpo", loss="clip", eps_low=0.2, eps_high=0.2,
                            aggregation="seq_mean_token_sum_norm", beta=0.0))
# GSPO paper: each rollout batch is split into 4 mini-batches.
PRESETS.add("gspo", dict(adv_estimator="grpo", loss="gspo", eps_low=3e-4, eps_high=4e-4,
                         aggregation="seq_mean_token_mean", beta=0.0, num_minibatches=4))
PRESETS.add("gmpo", dict(adv_estimator="grpo", loss="gmpo", eps_low=0.4, eps_high=0.4, beta=0.0))
# MiniMax-M1: 16 updates per batch; 4 at grpoplus's default batch (see the module docstring).
PRESETS.add("cispo", dict(adv_estimator="grpo", loss="cispo", eps_low=1.0, eps_high=4.0, aggregation="token_mean", beta=0.0,
                          num_minibatches=4))
PRESETS.add("rloo", dict(adv_estimator="rloo"))
PRESETS.add("reinforce_pp", dict(adv_estimator="reinforce_pp"))
PRESETS.add("lite_ppo", dict(adv_estimator="batch_std", aggregation="token_mean"))
PRESETS.add("olmo3", dict(adv_estimator="dr_grpo", loss="clip", eps_low=0.2, eps_high=0.28, aggregation="token_mean",
                          dynamic_sampling=True, corrections=("tis_token",), beta=0.0))
PRESETS.add("deepseek_v32", dict(adv_estimator="dr_grpo", loss="clip", eps_low=0.2, eps_high=0.2, kl_estimator="k3_is",
                                 kl_placement="in_loss", beta=1e-3, corrections=("deepseek_v32_mask",)))
PRESETS.add("prorl", dict(adv_estimator="grpo", loss="clip", eps_low=0.2, eps_high=0.4, kl_estimator="k3",
                          kl_placement="in_loss", beta=1e-4, ref_reset_every=200, ref_reset_optimizer=True))
# GFPO keeps 4 of the group (8 by default; the paper keeps 8 of 16)
PRESETS.add("gfpo", dict(PRESETS.get("grpo"), gfpo_keep=4, gfpo_metric="length"))

# -- section 10 ------------------------------------------------------------------------------
# SAPO: tau 1.0 / 1.05 and sequence-mean aggregation (the paper; TRL and verl force
# seq_mean_token_mean for it); verl's example: 256 prompts / mini-batch 32.
PRESETS.add("sapo", dict(adv_estimator="grpo", loss="sapo", tau_pos=1.0, tau_neg=1.05,
                         aggregation="seq_mean_token_mean", beta=0.0, num_minibatches=4))
# DPPO (verl's example for the paper): Dr. GRPO advantages and aggregation, TV threshold 0.15 /
# binary-KL threshold 0.05, truncation C = 20 (verl's default), 256 prompts / mini-batch 32; the
# paper recommends the ratio against the sampler (learner.logp_old=rollout, verl's bypass mode).
_DPPO = dict(adv_estimator="dr_grpo", aggregation="seq_mean_token_sum_norm", pg_cap=20.0, beta=0.0, num_minibatches=4)
PRESETS.add("dppo_tv", dict(_DPPO, loss="dppo_tv", eps_low=0.15, eps_high=0.15))
PRESETS.add("dppo_kl", dict(_DPPO, loss="dppo_kl", eps_low=0.05, eps_high=0.05))
# Clip-Cov / KL-Cov (the paper's 7B recipes in verl): GRPO advantages, token-mean, DAPO's dynamic
# sampling, no KL; Clip-Cov 2e-4 of the tokens with covariance in (1, 5) and the PPO clip opened
# to [0, 2]; KL-Cov 2e-3 of the tokens (2e-4 for 32B) with a |log r| coefficient of 1.
_COV = dict(adv_estimator="grpo", aggregation="token_mean", dynamic_sampling=True, beta=0.0, num_minibatches=4)
PRESETS.add("clip_cov", dict(_COV, loss="clip_cov", eps_low=1.0, eps_high=1.0, cov_ratio=2e-4, cov_lb=1.0, cov_ub=5.0))
PRESETS.add("kl_cov", dict(_COV, loss="kl_cov", cov_ratio=2e-3, kl_cov_coef=1.0))
# Skywork-OR1 (MAGIC): GRPO advantages, token-level loss, no KL, groups with zero advantage
# rejected, strictly on-policy (one update per batch), adaptive entropy control with target 0.2
# and step 0.005 (the initial coefficient 0 and the bounds [0, 1] are TRL's defaults).
PRESETS.add("skywork_or1", dict(adv_estimator="grpo", loss="clip", aggregation="token_mean", beta=0.0,
                                zero_variance_filter=True, entropy_adaptive=True, entropy_coef=0.0,
                                entropy_target=0.2, entropy_coef_delta=0.005, entropy_coef_min=0.0,
                                entropy_coef_max=1.0))

# The paper (or reference implementation) each preset follows, shown by ``grpoplus presets``.
PAPERS: dict[str, str] = {
    "grpo": "GRPO: Shao et al. 2024, DeepSeekMath, arXiv:2402.03300",
    "dapo": "DAPO: Yu et al. 2025, arXiv:2503.14476",
    "dr_grpo": "Dr. GRPO: Liu et al. 2025, Understanding R1-Zero-Like Training, arXiv:2503.20783",
    "gspo": "GSPO: Zheng et al. 2025, Group Sequence Policy Optimization, arXiv:2507.18071",
    "gmpo": "GMPO: Zhao et al. 2025, Geometric-Mean Policy Optimization, arXiv:2507.20673",
    "cispo": "CISPO: MiniMax 2025, MiniMax-M1, arXiv:2506.13585",
    "rloo": "RLOO: Ahmadian et al. 2024, Back to Basics, arXiv:2402.14740",
    "reinforce_pp": "REINFORCE++: Hu 2025, arXiv:2501.03262",
    "lite_ppo": "Lite PPO: Liu et al. 2025, Tricks or Traps? A Deep Dive into RL for LLM Reasoning",
    "olmo3": "OLMo 3's RL recipe (Ai2 2025)",
    "deepseek_v32": "DeepSeek-V3.2's RL recipe (DeepSeek-AI 2025)",
    "prorl": "ProRL: Liu et al. 2025, Prolonged Reinforcement Learning, arXiv:2505.24864",
    "gfpo": "GFPO: Shrivastava et al. 2025, Sample More to Think Less",
    "sapo": "SAPO: soft adaptive policy optimization, arXiv:2511.20347 (TRL, verl)",
    "dppo_tv": "DPPO, total-variation trust region, arXiv:2602.04879 (verl)",
    "dppo_kl": "DPPO, binary-KL trust region, arXiv:2602.04879 (verl)",
    "clip_cov": "Clip-Cov: Cui et al. 2025, The Entropy Mechanism of RL for Reasoning LMs, arXiv:2505.22617 (verl)",
    "kl_cov": "KL-Cov: Cui et al. 2025, The Entropy Mechanism of RL for Reasoning LMs, arXiv:2505.22617 (verl)",
    "skywork_or1": "Skywork-OR1 (MAGIC): He et al. 2025, arXiv:2505.22312",
}


def describe(name: str) -> str:
    """One line: what the preset sets (from the registry itself, so it cannot drift) and whose recipe it is."""
    values = ", ".join(f"{key}={_text(value)}" for key, value in PRESETS.get(name).items())
    return f"{name}: {values or 'AlgoConfig defaults'} ({PAPERS.get(name, 'no paper named')})"


def _text(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)

