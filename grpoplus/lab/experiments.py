"""The built-in experiments: claims of the literature, each as paired runs with a rule stated in advance.

Every experiment runs at the built-in scale (the warm-started tiny model on a built-in
task, a few minutes per run on 2 CPU cores) in the regime where its switch acts, and
checks that it did. Effect sizes and thresholds are in the units of the measure (nats,
tokens, accuracy fractions); ``regime`` says why the control arm can show the failure.
"""

from __future__ import annotations

from grpoplus.config.sections import RolloutConfig
from grpoplus.lab.experiment import Arm, Check, Comparison, Experiment, Measure, Rule, register


def tail(key: str, frac: float = 1 / 3) -> Measure:
    return Measure("tail_mean", f"mean {key} over the last {_third(frac)}", {"key": key, "frac": frac})


def tail_over_head(key: str) -> Measure:
    return Measure("tail_over_head", f"{key}: last third / first third", {"key": key})


def tail_ratio(num: str, den: str) -> Measure:
    return Measure("tail_ratio", f"{num} / {den} over the last third", {"num": num, "den": den})


def ratio_change(num: str, den: str) -> Measure:
    return Measure("ratio_change", f"growth of {num} / {den} (last third - first third)", {"num": num, "den": den})


def _third(frac: float) -> str:
    return "third" if abs(frac - 1 / 3) < 1e-9 else f"{frac:g} of the run"


ACCURACY = tail("eval/accuracy")

# -- (a) clip-higher vs the symmetric clip: token entropy (DAPO sec. 3.1) ---------------------------
register(Experiment(
    name="clip_higher",
    title="Clip-higher keeps the policy's token entropy up",
    source="DAPO (arXiv:2503.14476) sec. 3.1: with a symmetric clip the entropy collapses; eps_high=0.28 prevents it",
    preset="dapo",
    base=("num_minibatches=8", "num_iterations=2", "max_steps=150", "eval_every=10", "dynamic_sampling=false"),
    arms=(Arm("symmetric", ("eps_high=0.2",)), Arm("clip_higher", ("eps_high=0.28",))),
    comparisons=(Comparison(
        claim="clip-higher keeps token entropy higher than the symmetric clip",
        control="symmetric", treatment="clip_higher", effect=tail("policy/entropy_mean"),
        rule=Rule(direction=+1, min_effect=0.02),
        checks=(Check("switch", tail("loss/clip_frac_high"), arm="symmetric", minus="clip_higher", at_least=1e-3),
                Check("regime", tail_over_head("eval/accuracy"), arm="symmetric", at_least=1.0),
                Check("failure", tail_over_head("policy/entropy_mean"), arm="symmetric", at_most=0.8))),),
    regime="16 optimizer steps per rollout batch (8 mini-batches x 2 passes) at the preset's learning rate, so "
           "the policy moves away from pi_old within a batch and the upper clip bound can bind; the symmetric arm "
           "must keep learning (held-out accuracy over the last third at least that of the first: a run that "
           "collapses, as at lr 1e-3, is no evidence about clipping) and its entropy must fall by at least 20% for "
           "there to be a collapse to prevent",
    plots=("policy/entropy_mean", "policy/entropy_p10", "loss/clip_frac_high", "loss/clip_frac_low", "eval/accuracy"),
    report=(ACCURACY, tail("loss/clip_frac_high"), tail("loss/clip_frac_low"), tail_over_head("policy/entropy_mean")),
))

# -- (b) loss aggregation: length of incorrect vs correct responses (Dr. GRPO sec. 3.1, DAPO sec. 3.3)
_LENGTH_RATIO = ("length/incorrect_mean", "length/correct_mean")
_SPREAD = Measure("tail_ratio", "length/max / length/mean over the last third",
                  {"num": "length/max", "den": "length/mean"})
register(Experiment(
    name="aggregation",
    title="Sequence-mean aggregation lets incorrect responses grow longer than correct ones",
    source="Dr. GRPO (arXiv:2503.20783) sec. 3.1 and DAPO (arXiv:2503.14476) sec. 3.3: 1/|o_i| per response "
           "penalises long wrong answers less per token; token-mean and a constant normaliser do not",
    preset="dapo",
    base=("max_steps=60", "eval_every=10", "difficulty=8", "max_new_tokens=64", "dynamic_sampling=false",
          "overlong_shaping=false"),
    arms=(Arm("seq_mean", ("aggregation=seq_mean_token_mean",)), Arm("token_mean", ("aggregation=token_mean",)),
          Arm("constant_norm", ("aggregation=seq_mean_token_sum_norm",))),
    comparisons=tuple(Comparison(
        claim=f"{name} keeps incorrect responses shorter relative to correct ones than seq-mean",
        control="seq_mean", treatment=name, effect=tail_ratio(*_LENGTH_RATIO), rule=Rule(direction=-1, min_effect=0.1),
        checks=(Check("switch", _SPREAD, arm="seq_mean", at_least=1.3),
                Check("failure", ratio_change(*_LENGTH_RATIO), arm="seq_mean", at_least=0.1)))
        for name in ("token_mean", "constant_norm")),
    regime="problems of up to 8 operations with a 64-token budget, so worked answers are long and vary in "
           "length, and wrong ones can ramble; the seq-mean arm's incorrect/correct length ratio must grow by at "
           "least 0.1 for there to be a bias to remove",
    plots=("length/incorrect_mean", "length/correct_mean", "length/mean", "eval/accuracy"),
    report=(ACCURACY, tail_ratio(*_LENGTH_RATIO), tail("length/mean"), _SPREAD),
))

# -- (c) quantized rollouts, with and without truncated importance sampling (off-policy RL) --------
register(Experiment(
    name="int8_tis",
    title="Quantized (int8) rollouts make RL off-policy; truncated importance sampling corrects it",
    source="Yao et al. 2025, 'Your efficient RL framework secretly brings you off-policy RL training' (TIS); "
           "FlashRL (int8 rollouts + TIS)",
    preset="dapo",
    base=("max_steps=150", "eval_every=10", "dynamic_sampling=false"),
    arms=(Arm("fp32", ("quantization=none",)), Arm("int8", ("quantization=int8",)),
          Arm("int8_tis", ("quantization=int8", "corrections=[tis_token]"))),
    comparisons=(
        Comparison(
            claim="int8 rollouts without a correction learn less than full-precision rollouts",
            control="fp32", treatment="int8", effect=ACCURACY, rule=Rule(direction=-1, min_effect=0.03),
            checks=(Check("switch", tail("mismatch/k3"), arm="int8", minus="fp32", at_least=1e-4),)),
        Comparison(
            claim="TIS recovers what int8 rollouts lose",
            control="int8", treatment="int8_tis", effect=ACCURACY, rule=Rule(direction=+1, min_effect=0.03),
            checks=(Check("switch", tail("mismatch/k3"), arm="int8_tis", at_least=1e-4),
                    Check("failure", ACCURACY, arm="fp32", minus="int8", at_least=0.03))),
    ),
    regime="the hf engine samples with real CPU int8 kernels (dynamic quantization of every linear layer) while "
           "the learner trains in fp32; the int8 arms must show a mismatch (k3 >= 1e-4) for TIS to have "
           "something to correct, and int8 must lose accuracy for TIS to recover any",
    plots=("mismatch/k3", "mismatch/abs_p_diff_mean", "policy/entropy_mean", "eval/accuracy",
           "correction/tis_token/clipped_frac"),
    report=(ACCURACY, tail("mismatch/k3"), tail("policy/entropy_mean")),
))

# -- (d) dynamic sampling: accuracy per step and per wall-clock second (DAPO sec. 3.2) -------------
register(Experiment(
    name="dynamic_sampling",
    title="Dynamic sampling trains on groups with a gradient: more accuracy per step, at a sampling cost",
    source="DAPO (arXiv:2503.14476) sec. 3.2: zero-spread groups carry no gradient; over-sample and refill",
    preset="dapo",
    base=("max_steps=150", "eval_every=10", "group_size=4"),
    arms=(Arm("none", ("dynamic_sampling=false",)), Arm("dynamic", ("dynamic_sampling=true",))),
    comparisons=(
        Comparison(
            claim="dynamic sampling reaches higher held-out accuracy per step",
            control="none", treatment="dynamic", effect=ACCURACY, rule=Rule(direction=+1, min_effect=0.02),
            checks=(Check("switch", tail("sampling/rounds"), arm="dynamic", at_least=1.05),
                    Check("failure", tail("groups/zero_std_frac"), arm="none", at_least=0.3))),
        Comparison(
            claim="dynamic sampling gains more held-out accuracy per wall-clock second",
            control="none", treatment="dynamic",
            effect=Measure("gain_per_time", "held-out accuracy gained per 1000 s", {"key": "eval/accuracy"}),
            rule=Rule(direction=+1, min_effect=0.01),
            checks=(Check("switch", tail("sampling/rounds"), arm="dynamic", at_least=1.05),
                    Check("failure", tail("groups/zero_std_frac"), arm="none", at_least=0.3))),
    ),
    regime="the default task with groups of 4 responses, where a third or more of the groups have zero reward "
           "spread; the control must have at least 30% zero-spread groups over the last third for there to be "
           "anything to refill (with the preset's groups of 8 it had 10-20% over 150 steps: no result)",
    plots=("eval/accuracy", "groups/zero_std_frac", "sampling/rounds", "time/elapsed_s"),
    report=(ACCURACY, tail("groups/zero_std_frac"), tail("sampling/rounds"), tail("time/step_s")),
))

# -- (e) std normalisation of the advantage: per-difficulty advantage scale (Dr. GRPO sec. 3.1) ----
_EXTREME = Measure("adv_scale_ratio", "RMS advantage of too-easy/too-hard groups / of the others", {"edge": 0.25})
register(Experiment(
    name="std_normalisation",
    title="Std normalisation gives too-easy and too-hard questions as much weight as medium ones",
    source="Dr. GRPO (arXiv:2503.20783) sec. 3.1: dividing by the group's reward std up-weights low-spread "
           "(too easy or too hard) questions",
    preset="dapo",
    base=("max_steps=30", "eval_every=10", "difficulty=8", "dynamic_sampling=false", "overlong_shaping=false",
          "log_samples=256"),
    arms=(Arm("std", ("adv_estimator=grpo",)), Arm("no_std", ("adv_estimator=dr_grpo",))),
    comparisons=(Comparison(
        claim="without std normalisation the too-easy/too-hard groups get smaller advantages than medium ones",
        control="std", treatment="no_std", effect=_EXTREME, rule=Rule(direction=-1, min_effect=0.1),
        checks=(Check("switch", Measure("adv_rms", "RMS advantage of groups with reward spread"), arm="std",
                      minus="no_std", at_least=0.1),
                Check("failure", _EXTREME, arm="std", at_least=0.95))),),
    regime="problems of 1 to 8 operations, so each batch mixes groups the policy almost always solves, almost "
           "never solves, and solves half the time; every trained response is logged (log_samples=256) and its "
           "advantage recomputed with the run's estimator, grouped by the group's solve rate",
    plots=("eval/accuracy", "groups/zero_std_frac", "length/mean", "reward/std"),
    report=(ACCURACY,
            Measure("adv_rms", "RMS advantage, solve rate <= 1/4", {"low": 0.0, "high": 0.25}),
            Measure("adv_rms", "RMS advantage, solve rate in (1/4, 3/4)", {"low": 0.26, "high": 0.74}),
            Measure("adv_rms", "RMS advantage, solve rate >= 3/4", {"low": 0.75, "high": 1.0})),
))

# -- (f) MoE routing: token-level GRPO vs routing replay R2 / R3 vs GSPO ----------------------------
_MOE_ARM = ("aggregation=token_mean",)
_RATIO = tail("loss/ratio_max")
_FLIPS = tail("moe/routing_mismatch")


def _replay(arm: str) -> Comparison:
    return Comparison(
        claim=f"{arm[5:].upper()} routing replay lowers the token ratio's peak (loss/ratio_max)",
        control="grpo_token", treatment=arm, effect=_RATIO, rule=Rule(direction=-1, min_effect=0.05), relative=True,
        checks=(Check("switch", _FLIPS, arm=arm, at_least=1e-3),
                Check("failure", _FLIPS, arm="grpo_token", at_least=1e-3)))


register(Experiment(
    name="moe_routing",
    title="Routing replay (R2, R3) or a sequence-level ratio (GSPO) tames the token ratio of an MoE policy",
    source="GSPO (arXiv:2507.18071) sec. 5.3 (Routing Replay); R3 (Ma et al. 2025, 'Stabilizing MoE RL by "
           "aligning training and inference routers', arXiv:2510.11370)",
    preset="grpo",
    base=("model=tiny-moe", "task=arithmetic", "beta=0", "quantization=int8", "num_minibatches=8", "num_iterations=2",
          "max_steps=30", "eval_every=10"),
    arms=(Arm("grpo_token", _MOE_ARM), Arm("grpo_r2", (*_MOE_ARM, "routing_replay=r2")),
          Arm("grpo_r3", (*_MOE_ARM, "routing_replay=r3")), Arm("gspo", preset="gspo")),
    comparisons=(
        _replay("grpo_r2"),
        _replay("grpo_r3"),
        Comparison(
            claim="GSPO's sequence-level ratio lowers the token ratio's peak (loss/ratio_max)",
            control="grpo_token", treatment="gspo", effect=_RATIO, rule=Rule(direction=-1, min_effect=0.05),
            relative=True,
            checks=(Check("switch", tail("loss/clip_frac_low"), arm="gspo", minus="grpo_token", absolute=True,
                          at_least=1e-3),
                    Check("failure", _FLIPS, arm="grpo_token", at_least=1e-3))),
    ),
    regime="the tiny Qwen3-MoE (4 experts, top-2) with 16 optimizer steps per rollout batch (8 mini-batches x 2 "
           "passes, every arm), so routing can flip between pi_old and the later updates, and a sampler with int8 "
           "kernels (its router too), so the sampler's routing differs from the learner's and R3 (the sampler's "
           "experts) differs from R2 (the learner's at pi_old); the control must flip at least 0.1% of its "
           "token-layer expert choices (moe/routing_mismatch) for replay to have anything to fix, and each replay "
           "arm must override as many. (With bf16-rounded sampler weights and 4 updates per batch, 40 steps, the "
           "control flipped 0.09-0.29%: too few in one seed.)",
    plots=("loss/ratio_max", "loss/approx_kl", "loss/clip_frac_low", "moe/routing_mismatch",
           "moe/routing_mismatch_first", "eval/accuracy"),
    report=(ACCURACY, tail("loss/ratio_mean"), tail("loss/clip_frac_low"), tail("loss/clip_frac_high"),
            tail("loss/approx_kl"), _FLIPS, tail("moe/routing_mismatch_first"), tail("moe/load_max_frac")),
))

# -- (g) distillation vs RL on a small student (DeepSeek-R1 sec. 4; on-policy distillation) ----------
_TEACHER_MARGIN = Measure("tail_minus_initial", "teacher's correct share minus the student's held-out accuracy at "
                          "step 0", {"key": "sft/demo_model_correct_frac", "base": "eval/accuracy"})
_ALL_WRONG = Measure("tail_mean", "mean groups/all_wrong_frac over the run", {"key": "groups/all_wrong_frac", "frac": 1.0})
_SEQUENCES = RolloutConfig.prompts_per_step * RolloutConfig.group_size  # the default rollout batch (32 x 8)


def _beats_rl(arm: str, what: str) -> Comparison:
    return Comparison(
        claim=f"{what} reaches higher held-out accuracy than RL on the student at the same number of updates",
        control="rl", treatment=arm, effect=ACCURACY, rule=Rule(direction=+1, min_effect=0.03),
        checks=(Check("regime", _TEACHER_MARGIN, arm="teacher_samples", at_least=0.1),
                Check("failure", _ALL_WRONG, arm="rl", at_least=0.05)))


register(Experiment(
    name="distillation",
    title="A small model learns more from a stronger teacher than from RL on its own samples",
    source="DeepSeek-R1 (arXiv:2501.12948) sec. 4.1: distilling a stronger model into a small one beats RL on the "
           "small one (it cannot explore enough alone); on-policy distillation (GKD, arXiv:2306.13649)",
    preset="grpo",
    base=("num_minibatches=1", "beta=0", "max_steps=60", "eval_every=10"),
    arms=(Arm("rl"),
          Arm("on_policy", ("teacher=tiny-teacher", "lambda_opd=1", "opd_outcome=false")),
          Arm("on_policy_full", ("teacher=tiny-teacher", "distill_loss=reverse_kl")),
          Arm("teacher_samples", ("run.stage=sft", "sft.demo_model=tiny-teacher", f"sft.demos_per_step={_SEQUENCES}"))),
    comparisons=(_beats_rl("on_policy", "on-policy distillation (the teacher's per-token reverse KL as advantage)"),
                 _beats_rl("on_policy_full", "RL with the full-vocabulary reverse KL to the teacher added (GKD)"),
                 _beats_rl("teacher_samples", "SFT on the teacher's verified samples (off-policy distillation)")),
    regime="the default student (the warm-started 0.34M Llama) and the built-in teacher (tiny-teacher: a 1.8M Llama "
           "warm-started 3x longer on worked answers only); every arm makes one optimizer step per step on "
           f"{_SEQUENCES} sequences (RL and on-policy: the student's samples of 32 prompts x 8; off-policy: {_SEQUENCES} "
           "of the teacher's correct samples, drawn once from every training prompt before step 1), each at its "
           "stage's default learning rate; the teacher must be stronger than the student (its correct share at "
           "least 0.1 above the student's held-out accuracy at step 0), and RL must meet problems it cannot solve "
           "(groups all wrong in at least 5% of its groups) for exploration to be what a teacher adds",
    plots=("eval/accuracy", "groups/all_wrong_frac", "opd/reverse_kl", "loss/nll", "time/elapsed_s"),
    report=(ACCURACY, tail("time/step_s"), Measure("gain_per_time", "held-out accuracy gained per 1000 s"),
            tail("opd/reverse_kl"), _TEACHER_MARGIN),
))
