"""Doctor checks of off-policy training: updates per rollout batch, asynchronous staleness,
and MoE expert routing. Registered in :data:`grpoplus.metrics.checks.CHECKS` on import."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..series import Series, Trace, rank_correlation
from .base import CHECKS, DoctorThresholds, Finding, natural_layer_keys


def bounds_a_ratio(loss: str | None) -> bool:
    """The loss declares parameters that act only through the ratio to pi_old (its clip or trust region:
    ``grpoplus.algo.losses.ratio_dependent``, ALGORITHMS.md section 2); an unknown loss does not."""
    from grpoplus.algo.losses import LOSSES

    if not loss or loss not in LOSSES:  # e.g. a user's loss registered by code this process has not imported
        return False
    return bool(getattr(LOSSES.get(loss), "ratio_params", ()))


@CHECKS.register("inert_clipping")
def check_inert_clipping(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """With one optimizer step per rollout batch the policy is its own pi_old: the ratio is
    1 on every token and the clip / trust region never acts (PPO, Schulman et al. 2017,
    needs several updates per batch for it to matter; DAPO and CISPO use 16)."""
    loss = info.get("loss")
    ratio = trace.get("loss/ratio_max").finite()
    if not bounds_a_ratio(loss) or len(ratio) < th.structural_min_steps:
        return None
    if np.abs(ratio.values - 1.0).max() > th.inert_ratio_tol:
        return None
    clipped = [trace.get(k).finite() for k in ("loss/clip_frac_low", "loss/clip_frac_high")]
    if any(len(c) and c.values.max() > 0 for c in clipped):
        return None
    updates = info.get("updates_per_batch")
    per_batch = f" with {int(updates)} update(s) per rollout batch" if updates else ""
    return Finding(
        "inert_clipping", "warning", "clipping cannot act: every update is on-policy",
        f"loss/ratio_max = 1 (within {th.inert_ratio_tol:g}) and no clipped token on every "
        f"step of {ratio.span()}{per_batch}; algo.loss={loss} bounds a ratio that never "
        "leaves 1",
        "take several optimizer steps per rollout batch so the ratio can move "
        "(algo.num_minibatches=16 as DAPO and CISPO do, or algo.num_iterations=2), "
        "or accept that eps_low/eps_high/dual_clip_c change nothing in this run",
    )


def _on_common_steps(a: Series, b: Series) -> tuple[np.ndarray, np.ndarray]:
    """Values of two series at the steps both logged: ([n], [n])."""
    steps, ia, ib = np.intersect1d(a.steps, b.steps, return_indices=True)
    return a.values[ia], b.values[ib]


@CHECKS.register("mismatch_with_staleness")
def check_mismatch_with_staleness(trace: Trace, th: DoctorThresholds,
                                  info: Mapping) -> Finding | None:
    """Asynchronous rollouts: the staler the sampling policy, the larger the sampler/learner
    mismatch (off-policy drift on top of numerical mismatch; Yao et al. 2025, AReaL, Fu
    et al. 2025). Steps are split at the median staleness; the staler half is compared
    with the fresher half."""
    stale = trace.get("async/staleness_mean").finite()
    mismatch = trace.first_present("mismatch/k3", "mismatch/abs_p_diff_mean")
    if mismatch is None:
        return None
    s, m = _on_common_steps(stale, mismatch)
    if len(s) < th.min_steps:
        return None
    corr = rank_correlation(s, m)
    staler = s > np.median(s)
    if not np.isfinite(corr) or staler.all() or not staler.any():
        return None
    old, fresh = float(m[staler].mean()), float(m[~staler].mean())
    growth = old / fresh if fresh > 0 else float("inf")
    if corr < th.staleness_corr_min or growth < th.staleness_mismatch_ratio \
            or old < th.mismatch_floor:
        return None
    return Finding(
        "mismatch_with_staleness", "warning", "sampler/learner mismatch grows with staleness",
        f"{mismatch.key} vs async/staleness_mean over {len(s)} steps: rank correlation "
        f"{corr:.2f} >= {th.staleness_corr_min}; staler half (staleness > {np.median(s):.2g}) "
        f"{old:.3g} vs fresher half {fresh:.3g}, x{growth:.1f} >= {th.staleness_mismatch_ratio}",
        _staleness_fix(info),
    )


def _staleness_fix(info: Mapping[str, Any]) -> str:
    bound = info.get("max_staleness")
    lower = (f"lower rollout.max_staleness (now {bound})" if bound is not None
             else "lower rollout.max_staleness")
    return (f"{lower}; correct the off-policy gap with truncated importance sampling or a "
            "geometric-mean mask (algo.corrections=[tis_token] or [geo_mask]); compute pi_old "
            "with the learner (learner.logp_old=recompute)")


@CHECKS.register("routing_mismatch")
def check_routing_mismatch(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """MoE policies: the learner's top-k experts differ from those that sampled the token, so
    the ratio compares two different networks and training becomes unstable (Routing
    Replay: GSPO, Zheng et al. 2025; Rollout Routing Replay R3: Ma et al. 2025, "Stabilizing
    MoE Reinforcement Learning by Aligning Training and Inference Routers")."""
    series = trace.get("moe/routing_mismatch").finite()
    if len(series) < th.structural_min_steps:
        return None
    recent = series.tail(th.window)
    if recent.mean() < th.routing_mismatch_max:
        return None
    evidence = (f"moe/routing_mismatch {recent.mean():.3f} over {recent.span()} "
                f">= {th.routing_mismatch_max}")
    layers = natural_layer_keys(trace, "moe/routing_mismatch/layer")
    if layers:
        means = {k: trace.get(k).finite().tail(th.window).mean() for k in layers}
        worst = max(means, key=lambda k: means[k])
        evidence += f"; worst layer {worst.rsplit('/', 1)[-1]} {means[worst]:.3f}"
    replay = info.get("routing_replay")
    fix = ("replay the sampler's routing in the learner: rollout routing replay "
           "(algo.routing_replay=r3) or the old policy's routing (algo.routing_replay=r2); a "
           "sequence-level ratio (--preset gspo); fewer updates per rollout batch")
    if replay not in (None, "none", "off", False):
        fix += f"; routing replay {replay} is on: check that it covers every MoE layer"
    return Finding("routing_mismatch", "warning", "MoE expert routing differs between sampler "
                   "and learner", evidence, fix)
