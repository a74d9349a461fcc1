"""The text a dry run prints: the resolved config, the roles, the models, memory per device, tokens per step,
what this machine lacks and the notes; each section short enough to read before booking a cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING

from grpoplus.dryrun.memory import gigabytes
from grpoplus.plan import RunPlan, plan_files

if TYPE_CHECKING:
    from grpoplus.dryrun import DryRun
    from grpoplus.models.sizes import ModelSize

HEADER = "grpoplus train --dry-run: the config checked; no weight loaded, no engine, process or Ray started"
NOT_COUNTED = ("memory per device (estimate: weights, gradients, AdamW state, reference, teacher, engine copies; "
               "not activations, the allocator's slack or the CUDA context):")


def render(run: DryRun) -> str:
    lines = [HEADER, "", "the plan (what the run writes as RUN/plan/*.yaml; each role's process receives its part):"]
    for name, text in plan_files(run.plan).items():
        lines += [f"  {name}:"] + [f"    {line}" for line in text.splitlines()]
    lines += ["", "resolved config (what RUN/config.yaml would hold):"]
    lines += [f"  {line}" for line in run.config_yaml.splitlines()]
    lines += ["", "decided from it (grpoplus.plan.resolve):"] + _decided(run)
    lines += ["", "roles:"] + [f"  {role.name:<10} {role.where}" for role in run.roles]
    lines += ["", "models:", _model("policy", run.policy)]
    if run.teacher is not None:
        lines.append(_model("teacher", run.teacher))
    lines += ["", NOT_COUNTED] + _devices(run)
    lines += ["", "tokens per step:"] + _tokens(run)
    lines += ["", "needs (this machine lacks them: a run here would stop):"]
    lines += [f"  - {need}" for need in run.needs] or ["  none"]
    lines += ["", "notes:"] + ([f"  - {note}" for note in run.notes] or ["  none"])
    return "\n".join(lines)


LOGP_OLD = {"forward": "the training forward's own log-probs (no extra pass)",
            "recompute": "a no-grad learner pass before the update", "rollout": "the sampler's log-probs"}
REFERENCE = {"none": "none (beta = 0)", "copy": "a frozen copy of the policy",
             "adapters_off": "the policy with its LoRA adapters off (no copy)"}


def _decided(run: DryRun) -> list[str]:
    lrn, where = run.plan.learner, run.plan.placement
    update = lrn.update
    memory = ("freed memory back to the system after each update" if update.release_after_update else "kept") + \
        (f" and every {update.trim_every} layers of the backward" if update.trim_every else "")
    if update.objective == "sft":
        return ["  stage      supervised (run.stage=sft): the demonstrated tokens' negative log-likelihood, "
                "token-mean over each batch; no reference, no ratio",
                f"  learner    {where.ranks} rank(s), training state "
                f"{f'sharded over {where.shards}' if where.sharded else 'whole on each'}; precision {update.precision}",
                f"  memory     {memory}", _held_out(run)]
    return [f"  pi_old     {LOGP_OLD[update.logp_old]}", f"  reference  {REFERENCE[lrn.reference]}",
            f"  learner    {where.ranks} rank(s), training state "
            f"{f'sharded over {where.shards}' if where.sharded else 'whole on each'}; precision {update.precision}",
            f"  memory     {memory}", _held_out(run)]


def _held_out(run: DryRun) -> str:
    e = run.plan.eval
    if not e.samples:
        return f"  eval       greedy only (rollout.eval_samples=0), up to {e.max_new_tokens} tokens"
    ks = ", ".join(f"pass@{k}" for k in e.ks)
    return (f"  eval       greedy, and {e.samples} responses per held-out prompt at temperature {e.temperature:g}, "
            f"top_p {e.top_p:g}, up to {e.max_new_tokens} tokens: {ks} (unbiased estimator)")


def _model(role: str, size: ModelSize) -> str:
    count = "unknown" if size.params is None else f"{size.params:,} parameters ({_short(size.params)})"
    return f"  {role:<8} {size.name}: {count}; from {size.source}"


def _short(count: int) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= scale:
            return f"{count / scale:.{3 if unit == 'B' else 1}f}{unit}"
    return str(count)


def _devices(run: DryRun) -> list[str]:
    lines = []
    for device in run.devices:
        count = f" x {device.count}" if device.count > 1 else ""
        lines.append(f"  {device.label}{count}, {device.roles}: {gigabytes(device.total)}")
        lines += [f"    {gigabytes(item.bytes):>11}  {item.what}" for item in device.items]
        lines += [f"    aside: {text}" for text in device.aside]
    return lines


def _demos(plan: RunPlan) -> list[str]:
    """A supervised stage's tokens per step: its demonstrations, wherever they come from."""
    s = plan.sft
    source = (f"sft.demos={s.demos}" if s.demos else f"sft.demo_model={s.demo_model}'s samples "
              f"({s.demo_samples} per training prompt, {s.demo_filter})" if s.demo_model else
              f"the {plan.data.task} task's worked answers")
    limit = f", cut at sft.max_length={s.max_length} tokens" if s.max_length else ""
    return [f"  {s.demos_per_step} demonstrations per optimizer step, from {source}{limit}",
            f"  {s.eval_demos} held out at most (a fifth of them): eval/loss",
            f"  the run: {plan.loop.max_steps} optimizer steps"]


def _tokens(run: DryRun) -> list[str]:
    t, plan = run.tokens, run.plan
    if plan.sft is not None:
        return _demos(plan)
    c, algo, update = plan.collection, plan.learner.algo, plan.learner.update
    budget = ("the episode budget: rollout.max_episode_tokens" if c.max_episode_tokens else
              "the episode budget: rollout.max_turns x max_new_tokens") if t.multi_turn else "rollout.max_new_tokens"
    lines = [f"  {t.rows} responses per rollout batch ({c.prompts_per_step} prompts x {c.group_size})",
             f"  responses: at most {t.budget} tokens each ({budget}): {t.response_tokens:,} tokens"]
    if t.prompt_mean is None:
        lines.append(f"  prompts: {t.prompt_source}")
    else:
        lines.append(f"  prompts: {t.prompt_mean:.0f} tokens on average, {t.prompt_max} at most ({t.prompt_source}): "
                     f"about {t.prompt_tokens:,} tokens")
        lines.append(f"  a sampling round: up to {t.prompt_tokens + t.response_tokens:,} tokens")
    if t.prompt_fit is not None:
        lines.append(f"  prompts past the model's context: {t.prompt_fit}")
    if t.max_rounds > 1:
        lines.append(f"  dynamic sampling: up to {t.max_rounds} rounds per step (refills draw only the groups "
                     "still missing)")
    micro = (f"micro-batches by a budget of {update.micro_batch_tokens} tokens" if update.micro_batch_tokens else
             _auto_micro(run) if update.micro_batch_size == "auto" else
             f"{t.micro_batches} micro-batch(es) of learner.micro_batch_size={update.micro_batch_size}")
    lines.append(f"  optimizer steps per rollout batch: {t.updates_per_batch} ({algo.num_iterations} iteration(s) x "
                 f"{algo.num_minibatches} mini-batch(es) of {t.minibatch_rows} responses, each {micro})")
    lines.append(f"  the run: {plan.loop.max_steps} rollout batches, {plan.loop.max_steps * t.updates_per_batch} "
                 "optimizer steps")
    return lines


def _auto_micro(run: DryRun) -> str:
    """learner.micro_batch_size=auto: the token budget is chosen at the learner's start from its free memory; what a
    token of this policy keeps is known here (:func:`grpoplus.models.footprint.activation_bytes_per_token`)."""
    from grpoplus.models.footprint import activation_bytes_per_token

    update, arch = run.plan.learner.update, run.policy.arch
    if arch is None:
        return ("micro-batches by a token budget chosen at the start from the free memory (the architecture's "
                "activations unknown here)")
    per_token = activation_bytes_per_token(arch, update.precision, update.gradient_checkpointing)
    return (f"micro-batches by a token budget chosen at the start from the free memory: {per_token / 1024:.0f} KiB of "
            f"activations per token, about {int(1e9 / per_token):,} tokens per GB left")
