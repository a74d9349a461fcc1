"""``grpoplus train --dry-run``: check a config and show what its run would do, loading and starting nothing.

A recipe for a GPU cluster is worth checking before the cluster is booked, often on a machine that has no
GPU, no vLLM and no Ray. The dry run validates the config as a run does (a bad key or value fails the same
way), but notes what the machine lacks (:mod:`grpoplus.core.needs`) instead of stopping; then it shows the
resolved config, where each role would run, the memory each device would hold, and the tokens of a step.
No weight is read: parameter counts come from config.json / GGUF headers or the table of
:mod:`grpoplus.models.sizes`.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpoplus.config import build_config, resumed_config
from grpoplus.core.needs import collecting
from grpoplus.dryrun.memory import Device, estimate_memory
from grpoplus.dryrun.roles import Role, machine_needs, roles_of, warnings
from grpoplus.dryrun.tokens import Tokens, token_budget
from grpoplus.models.sizes import ModelSize, model_size
from grpoplus.plan import RunPlan, resolve


@dataclass
class DryRun:
    """Everything a dry run found; :func:`grpoplus.dryrun.report.render` writes it out."""

    config_yaml: str  # what the run would save as RUN/config.yaml
    plan: RunPlan  # what the run decides from it, as the assembly receives it: everything below is read from it
    roles: list[Role]
    policy: ModelSize
    teacher: ModelSize | None  # a local teacher (an endpoint's model is not on this run's devices)
    devices: list[Device]
    tokens: Tokens
    needs: list[str]  # what this machine lacks: the run would stop on it
    notes: list[str]


def dry_run(preset: str | None = None, yaml_path: str | None = None, overrides: list[str] | None = None,
            resume: str | None = None) -> DryRun:
    """Check the config ``grpoplus train`` would build from these arguments and plan its run (``resume``: the
    run directory whose saved config a resumed run would take, with ``overrides`` on top)."""
    with collecting() as needs:
        cfg = resumed_config(resume, overrides or []) if resume else build_config(preset, yaml_path, overrides)
    return dry_run_of(resolve(cfg), needs)


def dry_run_of(plan: RunPlan, needs: list[str] | None = None) -> DryRun:
    """The dry run of a resolved plan (``needs``: what its config's checks noted this machine lacks): a rendering
    of the plan alone, with the models' sizes read from their headers."""
    from grpoplus.teacher import is_endpoint

    spec = plan.learner.teacher
    with collecting() as lacks:  # what the models need of this machine (their architecture in its transformers)
        policy = model_size(plan.learner.policy.model)
        teacher = model_size(spec) if spec is not None and not is_endpoint(spec) else None
    tokens = token_budget(plan)
    return DryRun(plan.settings, plan, roles_of(plan), policy, teacher,
                  estimate_memory(plan, policy, teacher, tokens), tokens,
                  list(needs or []) + lacks + machine_needs(plan, policy, teacher), warnings(plan, policy, teacher))


def print_dry_run(preset: str | None, yaml_path: str | None, overrides: list[str], resume: str | None = None) -> int:
    """The CLI's ``--dry-run``: print the plan; exit code 0 (a bad config raises as in a run)."""
    from grpoplus.dryrun.report import render

    print(render(dry_run(preset, yaml_path, overrides, resume)))
    return 0
