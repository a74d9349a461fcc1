"""Config -> components: the one place that turns a validated config into objects."""

from __future__ import annotations

from grpoplus.config import Config


def build_task_and_model(cfg: Config):
    """The task (built-in or a data set), its train/test examples, and the policy with its tokenizer."""
    from grpoplus.models.load import load_policy
    from grpoplus.tasks import get_task
    from grpoplus.tasks.dataset import dataset_task

    d = cfg.data
    builtin = d.data is None
    model, tokenizer = load_policy(cfg.learner.model, task=d.task if builtin else None,
                                   difficulty=d.difficulty, device=cfg.learner.device, seed=cfg.run.seed)
    if builtin:
        kwargs = {} if d.difficulty is None else {"difficulty": d.difficulty}
        task = get_task(d.task, seed=cfg.run.seed, **kwargs)
    else:
        task = dataset_task(d, tokenizer if d.chat_template else None, seed=cfg.run.seed)
    return task, list(task.split("train")), list(task.split("test")), model, tokenizer


def build_rewards(cfg: Config, task):
    """The reward pipeline and the name of the component that decides correctness."""
    from grpoplus.rewards import RewardPipeline, parse_reward_specs

    components = parse_reward_specs(list(cfg.data.rewards), extra={"task": task.reward})
    names = [comp.name for comp in components]
    if "task" not in names:  # accuracy is always the task verifier's verdict: score it, weight 0
        components += parse_reward_specs(["task:0"], extra={"task": task.reward})
    pipeline = RewardPipeline(components, workers=cfg.data.reward_workers, timeout_s=cfg.data.reward_timeout_s)
    return pipeline, "task"
