"""A run's plan: :func:`resolve` turns a validated config into frozen data, every derived value decided once, and
each role's own part of it (:class:`LearnerRolePlan` for a learner rank, :class:`RolloutRolePlan` for a rollout
worker): what a role's process receives instead of the config. Loads no weight and starts no process; pickles (to
spawned ranks and Ray actors) and renders to plain data (:meth:`RunPlan.to_dict`, the dry run's ``plan`` section)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import yaml

from grpoplus import algo as A
from grpoplus.algo.config import AlgoConfig
from grpoplus.config import Config, response_budget
from grpoplus.models.footprint import Footprint
from grpoplus.models.memory import EAGER_TRIM_LAYERS
from grpoplus.plan import placement as where
from grpoplus.plan.data import DataPlan, data_plan
from grpoplus.plan.driver import (
    ClusterPlan,
    CollectionPlan,
    RewardsPlan,
    SftPlan,
    cluster_plan,
    collection_plan,
    rewards_plan,
    sft_plan,
)
from grpoplus.plan.loop import LoopPlan, loop_plan


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where each role runs (:mod:`grpoplus.plan.placement`'s predicates, evaluated once)."""

    cluster: str  # local | ray
    device: str  # learner.device as the driver names it
    process_device: str  # a role's own process: one GPU per process is "cuda"
    on_gpus: bool
    ranks: int  # learner ranks (learner.data_parallel)
    strategy: str  # learner.strategy: replicate | fsdp2
    shards: int  # how many ranks the training state is split over (fsdp2, several ranks; 1: whole on every rank)
    whole_copy_in_host_memory: bool  # a sharded rank 0's whole copy kept in host memory
    driver_copy_in_host_memory: bool  # the driver loads the policy into host memory
    rollout_workers: int  # Ray rollout workers (cluster=ray)

    @property
    def sharded(self) -> bool:
        """The training state split over the ranks."""
        return self.shards > 1


@dataclass(frozen=True, kw_only=True)
class ProcessPlan:
    """Settings of every process of a run (the driver, a learner rank, a rollout worker)."""

    seed: int
    threads: int  # torch CPU threads (0: torch's default)
    device: str
    tf32: bool
    cpu_matmul: str  # learner.cpu_matmul: auto | onednn | torch
    own_device: str  # the device as the role's own process names it: one GPU per process is ``cuda``


@dataclass(frozen=True, kw_only=True)
class PolicyPlan:
    """What to load as the policy: a model by name, or the built-in tiny model warm-started on ``task``."""

    model: str | None
    task: str | None  # the built-in task the tiny model is warm-started on (None: a data set's run)
    difficulty: object
    eval_seed: int
    quantize: str  # none | nf4 | fp4: the base's decoder-layer linears in 4-bit (QLoRA), quantised as loaded
    precision: str  # learner.precision: the dtype a 4-bit layer computes in
    footprint: Footprint  # how the learner's process holds it: what the load check and the dry run count


@dataclass(frozen=True, kw_only=True)
class LoraPlan:
    rank: int  # 0: full fine-tuning
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class OptimizerPlan:
    """AdamW and its schedule; ``lr`` None: the rate that fits the model (assemble.factories.learning_rate)."""

    lr: float | None
    lora: bool
    weight_decay: float
    betas: tuple[float, float]
    warmup_steps: int
    schedule: str
    total_steps: int  # optimizer steps of the whole run
    stage: str = "rl"  # rl | sft: the default rates differ (a supervised stage takes larger steps)


@dataclass(frozen=True, kw_only=True)
class UpdatePlan:
    """How the learner prepares and updates, as the config decides it (the model adds its routing shape and the
    reward pipeline its weights: :class:`grpoplus.learner.prepare.LearnerPlan`)."""

    temperature: float
    micro_batch_size: int | str  # rows per forward/backward, or "auto": a token budget from the free memory at start
    max_grad_norm: float
    logp_old: str  # where pi_old comes from, decided here once (learner.prepare.logp_old_mode)
    micro_batch_tokens: int
    routing_replay: str
    reference_adapters_off: bool  # the reference is the policy with its LoRA adapters off
    share_prompts: bool
    gradient_checkpointing: bool
    trim_every: int  # memory policy: freed memory back to the system every this many layers (0: never)
    release_after_update: bool  # memory policy: and after each update
    precision: str
    sharded: bool  # the training state split over the ranks: every rank runs as many forwards
    objective: str = "policy"  # policy: the algorithm's loss | sft: the demonstrations' negative log-likelihood
    packing: str = "auto"  # learner.packing: auto | on | off (the model decides auto: learner.packing.check_packing)
    compile: str = "off"  # learner.compile: off, or the torch.compile mode of the layers (learner.compiling)
    packed_attention: str = "auto"  # learner.packed_attention (the model and device decide auto:
    # learner.packing.packed_attention)
    row_tokens: int = 0  # the longest row a micro-batch takes (data.max_prompt_tokens + the response budget; 0: the
    # model's context): what an auto budget must hold at least


@dataclass(frozen=True, kw_only=True)
class EnginePlan:
    """A rollout engine's settings (engine options come from here and the model's context length)."""

    name: str
    quantization: str | None
    max_num_seqs: int
    timeout_s: float
    kwargs: tuple[tuple[str, object], ...]
    precision: str
    compile: bool = False  # hf engine: one compiled decode step (rollout.compile)
    release_memory: bool = False  # hf engine: its compiled step's static batches and graphs freed after each rollout


@dataclass(frozen=True, kw_only=True)
class LearnerRolePlan:
    """All a learner rank's process is told: what to load, how to train it, where it stands among the ranks."""

    process: ProcessPlan
    policy: PolicyPlan
    optimizer: OptimizerPlan
    update: UpdatePlan
    algo: AlgoConfig
    reference: str  # none | copy (a frozen copy of the policy) | adapters_off (the policy with LoRA off)
    teacher: str | None  # learner.teacher: on-policy distillation's teacher
    ranks: int
    host_copy: bool  # a sharded rank 0 keeps its whole copy in host memory
    cpu_offload: bool
    collective_timeout_s: float


@dataclass(frozen=True, kw_only=True)
class RolloutRolePlan:
    """All a rollout worker's process is told (cluster=ray); the weights come with each sync."""

    process: ProcessPlan
    policy: PolicyPlan
    engine: EnginePlan
    routing_replay: str
    release_memory: bool  # freed memory back to the system after each request
    host_copy: bool  # the worker's copy of the policy stays in host memory (vLLM holds its own weights)


@dataclass(frozen=True, kw_only=True)
class EvalPlan:
    """Held-out evaluation's examples and sampling (the rollout's where the rollout.eval_* keys are unset)."""

    examples: int  # data.eval_size: the held-out examples evaluated (at most)
    max_new_tokens: int  # greedy and sampled responses (a multi-turn trajectory: each turn)
    samples: int  # n sampled responses per held-out prompt (0: greedy only)
    ks: tuple[int, ...]  # the k of each eval/pass@k, each <= samples
    temperature: float
    top_p: float


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """What a config decides, resolved once: the driver's assembly builds the run from it and hands each role its
    own part; the dry run renders it. ``settings``: the user's validated config as the YAML text ``RUN/config.yaml``
    holds, kept only to be recorded with the run (:meth:`record`): no part can read a setting from it, every part,
    the task and its data included, runs from its own plan."""

    settings: str
    placement: Placement
    learner: LearnerRolePlan
    rollout: RolloutRolePlan
    lora: LoraPlan
    eval: EvalPlan
    data: DataPlan
    loop: LoopPlan
    collection: CollectionPlan
    rewards: RewardsPlan
    cluster: ClusterPlan | None  # run.cluster=ray only
    sft: SftPlan | None  # run.stage=sft only

    @property
    def seed(self) -> int:
        """``run.seed``, recorded once in the process plan every process of the run is set up from (the driver's
        too): the prompt order, the held-out sampling, the preflight and the demonstrations draw from it."""
        return self.learner.process.seed

    def record(self) -> dict:
        """The config as plain data: what the trackers log with the run and the doctor reads its batch shape from."""
        return yaml.safe_load(self.settings)

    def to_dict(self) -> dict:
        """Every derived decision as plain data, by part (the config itself is in ``config.yaml``)."""
        return {f.name: _plain(dataclasses.asdict(getattr(self, f.name))) for f in dataclasses.fields(self)
                if f.name != "settings" and getattr(self, f.name) is not None}


def _plain(value):
    """YAML's plain types: a value of another type (a task's difficulty object, a path) as its text."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def resolve(cfg: Config) -> RunPlan:
    """The plan of a validated config (a bad ``learner.logp_old`` x ``algo.routing_replay`` choice refused here)."""
    return RunPlan(settings=yaml.safe_dump(cfg.to_dict(), sort_keys=False), placement=placement(cfg),
                   learner=learner_role(cfg), rollout=rollout_role(cfg),
                   lora=lora_plan(cfg), eval=eval_plan(cfg), data=data_plan(cfg), loop=loop_plan(cfg),
                   collection=collection_plan(cfg), rewards=rewards_plan(cfg), cluster=cluster_plan(cfg),
                   sft=sft_plan(cfg))


def placement(cfg: Config) -> Placement:
    return Placement(cluster=cfg.run.cluster, device=cfg.learner.device, process_device=where.process_device(cfg),
                     on_gpus=where.on_gpus(cfg), ranks=cfg.learner.data_parallel, strategy=cfg.learner.strategy,
                     shards=where.shards(cfg), whole_copy_in_host_memory=where.whole_copy_in_host_memory(cfg),
                     driver_copy_in_host_memory=where.driver_copy_in_host_memory(cfg),
                     rollout_workers=cfg.rollout.workers)


def process_plan(cfg: Config) -> ProcessPlan:
    return ProcessPlan(seed=cfg.run.seed, threads=cfg.run.threads, device=cfg.learner.device, tf32=cfg.learner.tf32,
                       cpu_matmul=cfg.learner.cpu_matmul, own_device=where.process_device(cfg))


def policy_plan(cfg: Config) -> PolicyPlan:
    d = cfg.data
    return PolicyPlan(model=cfg.learner.model, task=d.task if d.data is None else None, difficulty=d.difficulty,
                      eval_seed=d.eval_seed, quantize=cfg.learner.quantize, precision=cfg.learner.precision,
                      footprint=footprint(cfg))


def footprint(cfg: Config) -> Footprint:
    """How the learner's process (rank 0) holds the policy: trained (LoRA, 4-bit, frozen parts), sharded with its
    whole copy beside the shards unless that copy lives in host memory, and the engine sampling in the same process
    (the driver's, with run.cluster=local; on Ray the rollout workers sample elsewhere)."""
    lrn, r = cfg.learner, cfg.rollout
    local = cfg.run.cluster == "local"
    return Footprint(shards=where.shards(cfg), lora_rank=lrn.lora_rank, lora_targets=tuple(lrn.lora_target_modules),
                     quantize=lrn.quantize, freeze=tuple(lrn.freeze), train_vision=lrn.train_vision,
                     precision=lrn.precision,
                     whole_copy=lrn.sharded and not where.whole_copy_in_host_memory(cfg),
                     engine=r.engine if local else None, own_copy=local and r.max_staleness > 0,
                     on_gpus=where.on_gpus(cfg), quantization=r.quantization, engine_kwargs=tuple(r.engine_kwargs.items()))


def lora_plan(cfg: Config) -> LoraPlan:
    lrn = cfg.learner
    return LoraPlan(rank=lrn.lora_rank, alpha=lrn.lora_alpha, dropout=lrn.lora_dropout,
                    target_modules=tuple(lrn.lora_target_modules))


def optimizer_plan(cfg: Config) -> OptimizerPlan:
    lrn = cfg.learner
    return OptimizerPlan(lr=lrn.lr, lora=lrn.lora_rank > 0, weight_decay=lrn.weight_decay,
                         betas=(lrn.adam_beta1, lrn.adam_beta2), warmup_steps=lrn.warmup_steps, schedule=lrn.lr_schedule,
                         total_steps=cfg.run.max_steps * stage_algo(cfg).updates_per_batch, stage=cfg.run.stage)


def logp_old_source(cfg: Config) -> str:
    """``learner.logp_old``, except that LoRA dropout makes the training forward stochastic: pi_old then
    needs its own pass."""
    lrn = cfg.learner
    return "recompute" if lrn.lora_rank and lrn.lora_dropout > 0 and lrn.logp_old == "auto" else lrn.logp_old


def logp_old_mode(algo: AlgoConfig, source: str, uses_reference: bool) -> str:
    """Where pi_old's log-probs come from.

    ``source`` is the config's choice: ``rollout`` (the sampler's logp_roll), ``recompute`` (a
    separate no-grad learner pass) or ``auto``: the training forward's own detached log-probs
    (``forward``) when they are exactly pi_old - one update per batch, so the weights are still
    pi_old - and nothing needs them before the update (a correction, the entropy mask, a loss's
    token selection, KL in the reward); otherwise ``recompute``. Routing replay R2 records the
    learner's routing in the ``recompute`` pass, so it takes that pass (its refusal of ``rollout`` is the
    config rule ``routing_replay``).
    """
    if algo.routing_replay == "r2" or source == "recompute":
        return "recompute"
    if source == "rollout":
        return source
    needed_before = bool(algo.corrections) or algo.entropy_mask_rho < 1.0 or A.needs_token_selection(algo) or (
        uses_reference and algo.kl_placement == "in_reward") or algo.uses_teacher  # opd: kl = logp_old - logp_T
    return "forward" if algo.updates_per_batch == 1 and not needed_before else "recompute"


def update_plan(cfg: Config) -> UpdatePlan:
    lrn, algo, memory = cfg.learner, stage_algo(cfg), cfg.run.release_memory
    sft = cfg.run.stage == "sft"
    return UpdatePlan(
        temperature=1.0 if sft else cfg.rollout.temperature, micro_batch_size=lrn.micro_batch_size,
        max_grad_norm=lrn.max_grad_norm,
        logp_old="forward" if sft else logp_old_mode(algo, logp_old_source(cfg), uses_reference=algo.beta > 0),
        micro_batch_tokens=lrn.micro_batch_tokens, routing_replay=algo.routing_replay,
        reference_adapters_off=reference_kind(cfg) == "adapters_off", share_prompts=shares_prompts(cfg),
        gradient_checkpointing=lrn.gradient_checkpointing,
        trim_every=EAGER_TRIM_LAYERS if memory == "eager" else 0, release_after_update=memory != "off",
        precision=lrn.precision, sharded=lrn.sharded, objective="sft" if sft else "policy", packing=packing_mode(cfg),
        compile=lrn.compile_mode if lrn.compile else "off", packed_attention=lrn.packed_attention,
        row_tokens=cfg.data.max_prompt_tokens + response_budget(cfg.data, cfg.rollout) if cfg.data.max_prompt_tokens else 0)


def shares_prompts(cfg: Config) -> bool:
    """``learner.share_prompts``, except under ``learner.compile``: the shared-prompt forward's key/value cache is
    indexed by layer, so its layers run eagerly (grpoplus.learner.compiling); compiled, every row is computed whole."""
    return cfg.learner.share_prompts and not cfg.learner.compile


def packing_mode(cfg: Config) -> str:
    """``learner.packing``, except that the teacher's distillation forward (algo.distill_loss) runs padded rows, so
    auto pads with it (``on`` is refused there: the config rule ``packing``)."""
    auto_off = cfg.run.stage != "sft" and cfg.algo.distill_loss != "off"
    return "off" if auto_off and cfg.learner.packing == "auto" else cfg.learner.packing


SFT_ALGO = AlgoConfig()
"""A supervised stage's update: one optimizer step per batch, the loss averaged over the batch's demonstrated
tokens (token_mean), no reference, no ratio: the algorithm section of the config does not act in it."""


def stage_algo(cfg: Config) -> AlgoConfig:
    """The algorithm the learner runs: the config's for RL, :data:`SFT_ALGO` for a supervised stage."""
    return SFT_ALGO if cfg.run.stage == "sft" else cfg.algo


def reference_kind(cfg: Config) -> str:
    if stage_algo(cfg).beta <= 0:
        return "none"
    return "adapters_off" if cfg.learner.lora_rank > 0 else "copy"


def learner_role(cfg: Config) -> LearnerRolePlan:
    lrn = cfg.learner
    sft = cfg.run.stage == "sft"
    return LearnerRolePlan(process=process_plan(cfg), policy=policy_plan(cfg), optimizer=optimizer_plan(cfg),
                           update=update_plan(cfg), algo=stage_algo(cfg), reference=reference_kind(cfg),
                           teacher=None if sft else lrn.teacher, ranks=lrn.data_parallel,
                           host_copy=where.whole_copy_in_host_memory(cfg), cpu_offload=lrn.cpu_offload,
                           collective_timeout_s=lrn.collective_timeout_s)


def engine_plan(cfg: Config) -> EnginePlan:
    r = cfg.rollout
    return EnginePlan(name=r.engine, quantization=r.quantization, max_num_seqs=r.max_num_seqs,
                      timeout_s=r.engine_timeout_s, kwargs=tuple(dict(r.engine_kwargs).items()),
                      precision=cfg.learner.precision, compile=r.compile,
                      release_memory=cfg.run.release_memory != "off")


def rollout_role(cfg: Config) -> RolloutRolePlan:
    return RolloutRolePlan(process=process_plan(cfg), policy=policy_plan(cfg), engine=engine_plan(cfg),
                           routing_replay=stage_algo(cfg).routing_replay,
                           release_memory=cfg.run.release_memory != "off", host_copy=cfg.rollout.engine == "vllm")


def eval_plan(cfg: Config) -> EvalPlan:
    """Held-out sampling: each unset rollout.eval_* key takes the rollout's value; pass@k for each k of
    rollout.eval_k, else for 1 and n (n = rollout.eval_samples; no pass@k when n = 0)."""
    r = cfg.rollout
    ks = set(r.eval_k) or ({1, r.eval_samples} if r.eval_samples > 0 else set())
    return EvalPlan(examples=cfg.data.eval_size, max_new_tokens=r.eval_max_new_tokens or r.max_new_tokens,
                    samples=r.eval_samples,
                    ks=tuple(sorted(ks)), temperature=r.temperature if r.eval_temperature is None else r.eval_temperature,
                    top_p=r.top_p if r.eval_top_p is None else r.eval_top_p)
