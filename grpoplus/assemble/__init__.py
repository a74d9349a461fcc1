"""Plan -> components: the one place that turns a run's plan (:func:`grpoplus.plan.resolve`) into objects.

- :mod:`~grpoplus.assemble.factories`: leaf factories (policy, data, rewards, engine, optimizer, collection);
- :mod:`~grpoplus.assemble.data`: the examples a run trains and is evaluated on, from the plan's data part (the
  dry run measures their prompts with it too);
- :mod:`~grpoplus.assemble.learner`: a learner rank's parts and plan, for rank 0 and the other ranks'
  processes alike (handed to the roles as :data:`~grpoplus.assemble.learner.RANK_BUILDERS`, so no role
  imports this package);
- :mod:`~grpoplus.assemble.launch`: the roles started local or on Ray, each launch handing them back;
- here: :func:`assemble`, which wires the loop's components (and only here: a launch that returned
  the components would import the wiring back).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grpoplus.assemble.factories import build_collect_plan, build_lora, build_process, build_scorer, build_task_and_model
from grpoplus.data.order import PromptSampler
from grpoplus.learner.precision import check_precision
from grpoplus.learner.replay import check_replay
from grpoplus.plan.run import RunPlan
from grpoplus.teacher import check_vocabulary


@dataclass
class Components:
    """Everything a run needs, built once from its plan."""

    task: object
    train: list
    test: list
    tokenizer: object
    engine: object  # the engine held-out evaluation samples with (it also samples the rollouts when synchronous)
    scorer: object
    sampler: PromptSampler
    generator: torch.Generator
    collect_plan: object  # grpoplus.collect.CollectPlan
    learner: object  # grpoplus.distributed.learner.Learner, or the Ray learner group
    collector: object  # where each step's rollouts come from (grpoplus.distributed.staleness)
    cluster: object | None = None  # the Ray connection of cluster=ray
    demos: object | None = None  # a supervised stage's demonstrations (grpoplus.sft.source.DemoSet)
    data_metrics: dict = field(default_factory=dict)  # what the data checks changed (data/prompts_dropped), at step 0
    plan: RunPlan | None = None  # the plan it was built from (the driver's loop runs from plan.loop)

    def close(self) -> None:
        self.collector.close()
        self.learner.close()
        self.scorer.close()
        self.engine.close()
        if self.cluster is not None:
            self.cluster.close()


def assemble(plan: RunPlan) -> Components:
    """The run's components: what the machine must offer, checked before anything loads, the task and policy, then
    the roles where ``run.cluster`` places them."""
    from grpoplus.assemble.launch import Collection, launch_local, launch_on_ray

    build_process(plan.learner.process)
    check_precision(plan.learner.update.precision, plan.placement.device)
    if plan.cluster is not None and plan.cluster.address not in (None, "auto"):
        from grpoplus.distributed.ray_cluster import probe

        probe(plan.cluster.address, plan.cluster.timeout_s)  # one that does not answer: before minutes of loading
    task, train, test, model, tokenizer, data_metrics = build_task_and_model(plan)
    check_vocabulary(plan.learner.teacher, tokenizer)  # before the learner ranks load the teacher
    replay = check_replay(plan.learner.update.routing_replay, model) is not None  # an MoE policy: the sampler's routing too
    seed = plan.seed
    collection = Collection(train, build_collect_plan(plan, tokenizer, model), PromptSampler(len(train), seed),
                            torch.Generator().manual_seed(seed))
    if plan.cluster is not None:
        roles = launch_on_ray(plan, task, model, tokenizer, collection)
    else:
        scorer = build_scorer(plan.rewards, plan.placement.device, task, train, tokenizer)
        roles = launch_local(plan, build_lora(plan.lora, model), tokenizer, scorer, collection, replay)
    demos = collector = None
    if plan.loop.stage == "sft":  # demonstrations instead of rollouts; the engine still samples the evaluations
        from grpoplus.assemble.sft import build_demos, demo_collector

        demos = build_demos(plan, task, train, tokenizer)
        collector = demo_collector(plan, demos, tokenizer)
    return Components(task, train, test[: plan.eval.examples], tokenizer, roles.engine, roles.scorer,
                      collection.sampler, collection.generator, collection.plan, roles.learner,
                      collector or roles.collector, roles.cluster, demos, data_metrics, plan)
