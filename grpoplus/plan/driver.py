"""The driver side's plans, beside the roles': how rollouts are collected (:class:`CollectionPlan`), how they are
scored (:class:`RewardsPlan`) and, with ``run.cluster=ray``, the cluster the roles run on (:class:`ClusterPlan`).
The assembly builds the collector, the scorer and the Ray roles from them."""

from __future__ import annotations

from dataclasses import dataclass

from grpoplus.config import Config
from grpoplus.config.sections import env_of


@dataclass(frozen=True, kw_only=True)
class CollectionPlan:
    """Each step's rollouts: how many, sampled how, how far ahead of the learner, and the episodes of a multi-turn
    run (``env`` None: single-turn)."""

    prompts_per_step: int
    group_size: int
    temperature: float
    top_p: float
    max_new_tokens: int
    max_staleness: int  # 0: synchronous; K: sampling runs up to K policy versions ahead of the learner
    env: str | None  # the environment the rows are played in (data.env, data.tools, or the task's own)
    tools: tuple  # data.tools: the tool functions of the tools environment
    chat_template: bool
    max_turns: int
    max_episode_tokens: int
    env_timeout_s: float
    env_patience_s: float

    @property
    def response_budget(self) -> int:
        """The most tokens a response takes: max_new_tokens, or a multi-turn episode's budget (its
        max_episode_tokens, else max_turns x max_new_tokens)."""
        if self.env is None:
            return self.max_new_tokens
        return self.max_episode_tokens or self.max_turns * self.max_new_tokens


@dataclass(frozen=True, kw_only=True)
class RewardsPlan:
    """The reward pipeline: the configured components (the task's verifier is added at weight 0 when unlisted, in
    the assembly that knows the task), DAPO's soft overlong punishment, where it runs, and a process reward model."""

    specs: tuple  # data.rewards as written: names, name:weight, or mappings
    soft_overlong: tuple[int, int] | None  # (max_len, L_cache) when algo.overlong_shaping, else None
    workers: int | str  # data.reward_workers: 0 in-process, N processes, or auto
    timeout_s: float
    prm: str | None  # data.prm: the process reward model whose step scores are the step rewards
    prm_step_separator: str


@dataclass(frozen=True, kw_only=True)
class ClusterPlan:
    """``run.cluster=ray``: the Ray cluster and the rollout workers on it (the learner ranks are the placement's)."""

    address: str | None
    num_cpus: int | None
    timeout_s: float
    max_restarts: int
    weight_sync: str  # object_store | collective
    rollout_workers: int
    engine: str
    engine_timeout_s: float


def collection_plan(cfg: Config) -> CollectionPlan:
    r, d = cfg.rollout, cfg.data
    return CollectionPlan(
        prompts_per_step=r.prompts_per_step, group_size=r.group_size, temperature=r.temperature, top_p=r.top_p,
        max_new_tokens=r.max_new_tokens, max_staleness=r.max_staleness, env=env_of(d),
        tools=tuple(d.tools), chat_template=d.chat_template, max_turns=r.max_turns,
        max_episode_tokens=r.max_episode_tokens, env_timeout_s=r.env_timeout_s, env_patience_s=r.env_patience_s)


def rewards_plan(cfg: Config) -> RewardsPlan:
    d, algo = cfg.data, cfg.algo
    return RewardsPlan(specs=tuple(d.rewards), soft_overlong=(algo.max_len, algo.cache_len) if algo.overlong_shaping
                       else None, workers=d.reward_workers, timeout_s=d.reward_timeout_s, prm=d.prm,
                       prm_step_separator=d.prm_step_separator)


def cluster_plan(cfg: Config) -> ClusterPlan | None:
    if cfg.run.cluster != "ray":
        return None
    rc, r = cfg.ray, cfg.rollout
    return ClusterPlan(address=rc.address, num_cpus=rc.num_cpus, timeout_s=rc.timeout_s, max_restarts=rc.max_restarts,
                       weight_sync=rc.weight_sync, rollout_workers=r.workers, engine=r.engine,
                       engine_timeout_s=r.engine_timeout_s)


@dataclass(frozen=True, kw_only=True)
class SftPlan:
    """``run.stage=sft``: where the demonstrations come from and how they are batched and held out (a demonstration
    model samples them as the rollouts are sampled: the collection plan's settings)."""

    demos: str | None  # a file, a saved data set, or the name of built-in demonstrations
    messages_field: str
    max_length: int  # 0: no cut
    direct_frac: float  # a built-in task's worked answers: the share answered directly
    demo_model: str | None  # off-policy distillation: the model whose samples are the demonstrations
    demo_samples: int
    demo_filter: str  # correct | all
    demos_per_step: int
    eval_demos: int  # held out for eval/loss
    task: str | None  # the built-in task of the run (None: a data set)
    difficulty: object
    on_bad_row: str  # skip | error


def sft_plan(cfg: Config) -> SftPlan | None:
    if cfg.run.stage != "sft":
        return None
    s, d = cfg.sft, cfg.data
    return SftPlan(demos=s.demos, messages_field=s.messages_field, max_length=s.max_length, direct_frac=s.direct_frac,
                   demo_model=s.demo_model, demo_samples=s.demo_samples, demo_filter=s.demo_filter,
                   demos_per_step=s.demos_per_step, eval_demos=s.eval_demos, task=d.task if d.data is None else None,
                   difficulty=d.difficulty, on_bad_row=d.on_bad_row)
