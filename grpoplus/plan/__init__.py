"""What a config decides, derived once: :func:`resolve` turns a validated config into a frozen :class:`RunPlan`
(:mod:`~grpoplus.plan.run`): every derived value, where each role runs and which copy of the policy it holds
(:mod:`~grpoplus.plan.placement`), and each role's own plan, which is all a learner rank's or a Ray actor's process
receives. The assembly builds the run from it; the dry run renders it. Loads no weight and starts no process."""

from grpoplus.plan.files import plan_files, write_plan_files
from grpoplus.plan.run import EvalPlan, LearnerRolePlan, RolloutRolePlan, RunPlan, eval_plan, resolve

__all__ = ["EvalPlan", "LearnerRolePlan", "RolloutRolePlan", "RunPlan", "eval_plan", "plan_files", "resolve", "write_plan_files"]
