"""The plan of a run for a dry run: which role runs where (as the assembly places them, from the same
:mod:`grpoplus.plan.placement`), what the machine must offer beyond the config checks, and the warnings a config can
earn before anything loads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grpoplus.config import Config, env_of
from grpoplus.dryrun.sizes import ModelSize
from grpoplus.plan.placement import on_gpus, whole_copy_in_host_memory
from grpoplus.plan.run import reference_kind


@dataclass(frozen=True)
class Role:
    name: str
    where: str


def roles_of(cfg: Config) -> list[Role]:
    """Each role of the run and where it runs."""
    return [Role("cluster", _cluster(cfg)), Role("rollout", _rollout(cfg)), Role("learner", _learner(cfg)),
            Role("reference", _reference(cfg)), Role("teacher", _teacher(cfg)), Role("rewards", _rewards(cfg))]


def _cluster(cfg: Config) -> str:
    n = cfg.learner.data_parallel
    if cfg.run.cluster == "ray":
        where = f"the running Ray cluster (ray.address={cfg.ray.address})" if cfg.ray.address else \
            "a local Ray instance (ray.init())"
        return f"ray: {where}; this process is the driver"
    if n == 1:
        return "local: this machine, one process"
    return (f"local: {n} learner ranks on this machine (rank 0 is this process; ranks 1-{n - 1} spawned by it, "
            "or started by torchrun)")


def _device(cfg: Config, rank: int = 0) -> str:
    device = cfg.learner.device
    return f"cuda:{rank}" if device == "cuda" else device


def _rollout(cfg: Config) -> str:
    r, sharded = cfg.rollout, cfg.learner.sharded
    if cfg.run.cluster == "ray":
        gpu = "1 GPU each" if on_gpus(cfg) else "CPU"
        return (f"{r.workers} rollout worker(s), Ray actors, each its own {r.engine} engine on its own copy of the "
                f"policy ({gpu}); weights reach them by ray.weight_sync={cfg.ray.weight_sync}")
    copy = "rank 0's whole-policy copy" if sharded else "the learner's own module"
    text = f"engine {r.engine} in the driver's process on {_device(cfg)}, sampling with {copy}"
    if r.max_staleness:
        text += f"; a second engine on its own copy samples up to {r.max_staleness} version(s) ahead"
    return text


def _learner(cfg: Config) -> str:
    lrn, algo = cfg.learner, cfg.algo
    n, gpu = lrn.data_parallel, on_gpus(cfg)
    if cfg.run.cluster == "ray":
        where = "Ray actors, 1 GPU each" if gpu else "Ray actors, CPU"
    else:
        where = f"{_device(cfg, 0)}..{_device(cfg, n - 1)}" if n > 1 and lrn.device == "cuda" else lrn.device
    strategy = lrn.strategy + (" (one rank: nothing to shard)" if lrn.strategy == "fsdp2" and n == 1 else "")
    tuned = f"LoRA rank {lrn.lora_rank} on {lrn.lora_target_modules}" if lrn.lora_rank else "full fine-tuning"
    if lrn.quantize != "none":
        tuned += f" over a frozen {lrn.quantize} base (QLoRA: decoder layers' linear weights in 4-bit)"
    if cfg.run.stage == "sft":
        return (f"{n} rank(s), strategy {strategy}, precision {lrn.precision}, on {where}; {tuned}; one optimizer "
                f"step per {cfg.sft.demos_per_step} demonstrations (the supervised stage: the algo section does not act)")
    return (f"{n} rank(s), strategy {strategy}, precision {lrn.precision}, on {where}; {tuned}; "
            f"{algo.updates_per_batch} optimizer step(s) per rollout batch "
            f"({algo.num_iterations} iteration(s) x {algo.num_minibatches} mini-batch(es))")


def _reference(cfg: Config) -> str:
    kind = reference_kind(cfg)  # the learner's own decision (grpoplus.plan.run)
    if kind == "none":
        return "none (the supervised stage)" if cfg.run.stage == "sft" else "none (algo.beta = 0)"
    if kind == "adapters_off":
        base = f", the {cfg.learner.quantize} base" if cfg.learner.quantize != "none" else ""
        return f"the policy with its LoRA adapters off (algo.beta = {cfg.algo.beta}; no second copy{base})"
    lowered = ", linear weights in bfloat16" if cfg.learner.precision == "bf16_mixed" else ""
    return f"a frozen copy of the policy, whole on every learner rank (algo.beta = {cfg.algo.beta}{lowered})"


def _teacher(cfg: Config) -> str:
    from grpoplus.teacher import is_endpoint

    teacher = cfg.learner.teacher
    if teacher is None:
        return "none"
    uses = f"algo.lambda_opd = {cfg.algo.lambda_opd}, algo.distill_loss = {cfg.algo.distill_loss}"
    if is_endpoint(teacher):
        return f"served at {teacher} (prompt log-probs; not on this run's devices); {uses}"
    return f"{teacher}, fp32, frozen, loaded on every learner rank's device; {uses}"


def _rewards(cfg: Config) -> str:
    d = cfg.data
    if cfg.run.stage == "sft":
        return (f"none in training (the supervised stage); the task's verifier scores the held-out evaluation"
                f"{'' if cfg.sft.eval_accuracy else ' (off: sft.eval_accuracy=false)'}")
    names = [spec.get("name") if isinstance(spec, dict) else str(spec) for spec in d.rewards]
    pool = "" if d.reward_workers == 0 else f"a pool of {d.reward_workers} worker processes"
    if cfg.run.cluster == "ray":
        where = "a Ray task per rollout batch" + (f", with {pool}" if pool else "")
    else:
        where = pool or "in the driver's process"
    extra = "; + DAPO's soft overlong punishment" if cfg.algo.overlong_shaping else ""
    prm = f"; process reward model {d.prm} on {cfg.learner.device}" if d.prm else ""
    env = f"; multi-turn in {env_of(d)}" if env_of(d) else ""
    return f"{', '.join(names)}{extra}: {where}{prm}{env}"


def machine_needs(cfg: Config, policy: ModelSize, teacher: ModelSize | None) -> list[str]:
    """What this machine lacks for the run beyond the config checks' own notes: GPUs, models and data files."""
    import torch

    lrn, needs = cfg.learner, []
    if on_gpus(cfg):
        gpus = torch.cuda.device_count()
        wanted = 1 if cfg.run.cluster == "local" else lrn.data_parallel + cfg.rollout.workers
        if cfg.run.cluster == "ray" and cfg.ray.address is None and wanted > gpus:
            needs.append(f"a local Ray instance needs {wanted} GPUs (rollout.workers={cfg.rollout.workers} + "
                         f"learner.data_parallel={lrn.data_parallel}, one each) but this machine has {gpus}")
        elif cfg.run.cluster == "local" and lrn.data_parallel == 1 and gpus < 1:
            needs.append(f"learner.device={lrn.device} needs a CUDA GPU, and this machine has none")
    for what, ms in (("learner.model", policy), ("learner.teacher", teacher)):
        if ms is not None and not ms.on_disk:
            needs.append(f"{what}: the model {ms.name!r} is not on this machine ({_how_to_get(ms.name)})")
    for key in ("data", "eval_data", "prm"):
        path = getattr(cfg.data, key)
        if path is not None and not Path(path).expanduser().exists():
            needs.append(f"data.{key}: {path!r} does not exist on this machine")
    return needs


def warnings(cfg: Config, policy: ModelSize, teacher: ModelSize | None) -> list[str]:
    """What the config does not refuse, but a run on its machine may trip over."""
    import torch

    from grpoplus.models.load import is_builtin
    from grpoplus.models.memory import training_bytes

    lrn, r, notes = cfg.learner, cfg.rollout, []
    gpu = on_gpus(cfg)
    if gpu and r.engine == "vllm" and cfg.run.cluster == "local" and not (
            {"gpu_memory_utilization", "kv_cache_memory_bytes"} & set(r.engine_kwargs)):
        notes.append("vLLM shares the learner's GPU but rollout.engine_kwargs sets neither gpu_memory_utilization "
                     "nor kv_cache_memory_bytes: vLLM's default takes 0.9 of the GPU; give it a share "
                     "(e.g. gpu_memory_utilization: 0.3) and sleep_between_steps: true")
    if gpu and cfg.run.cluster == "ray":
        notes.append(f"the Ray cluster must offer {lrn.data_parallel + r.workers} GPUs (rollout.workers + "
                     "learner.data_parallel, one each); the run checks it before any actor starts")
    if gpu and lrn.precision == "bf16_mixed":
        notes.append("learner.precision=bf16_mixed needs native bfloat16 on the GPU (NVIDIA compute capability 8.0 "
                     "or newer: A100, H100, RTX 30xx/40xx); older GPUs are refused when the run starts")
    if teacher is not None and teacher.arch and policy.arch and teacher.arch.vocab != policy.arch.vocab:
        notes.append(f"teacher {teacher.name!r} predicts over {teacher.arch.vocab} rows, the policy over "
                     f"{policy.arch.vocab}: fine when both have one tokenizer (the rows past it are padding); the run "
                     "compares the tokenizers when it starts")
    if lrn.packing == "on" and lrn.share_prompts:
        notes.append(f"learner.packing={lrn.packing}: a packed forward computes every row's prompt (no padding, but "
                     "learner.share_prompts does not apply to it); where responses are all about one length, "
                     "learner.packing=off with shared prompts computes fewer tokens")
    if lrn.compile and lrn.packing != "on" and lrn.share_prompts:
        notes.append("learner.compile=true computes every row whole (learner.share_prompts does not apply: the shared-"
                     "prompt forward would compile one graph per layer); its first update compiles the layers (about 20 s "
                     "on a 2-core CPU)")
    if policy.params is not None and not is_builtin(lrn.model):  # the built-in models load unchecked
        notes += _load_checks(cfg, policy.params, gpu)
    if teacher is not None and teacher.params is not None:
        need = training_bytes(teacher.params, torch.float32, lora=False, trains=False)
        notes.append(f"load check: the teacher's weights, about {need / 1e9:.1f} GB, must be free on each learner "
                     "rank's device after the policy")
    return notes


def _load_checks(cfg: Config, params: int, gpu: bool) -> list[str]:
    """What the loader's memory check (grpoplus.models.memory.check_fits) asks of each process that loads the
    policy: room to train it where a learner loads it, room for its weights where a copy is only held."""
    import torch

    from grpoplus.models.memory import training_bytes

    lrn, ray = cfg.learner, cfg.run.cluster == "ray"
    n, sharded, host = lrn.data_parallel, cfg.learner.sharded, whole_copy_in_host_memory(cfg)
    trainers = ["this process" if n == 1 and not ray else "learner rank 0" if sharded else
                f"each of the {n} learner ranks"] if not host else []
    copies = ["learner rank 0 (into its host memory; the other ranks take their shards from it)"] if host else []
    if ray:
        (copies if gpu else trainers).insert(0, "the driver (on its CPU)")
        where = "host memory" if gpu and cfg.rollout.engine == "vllm" else "its device"
        copies.append(f"each of {cfg.rollout.workers} rollout worker(s) (into its {where})")
    notes = []
    if trainers:
        need = training_bytes(params, torch.float32, lora=lrn.lora_rank > 0, shards=n if sharded else 1,
                              quantized=lrn.quantize != "none")
        notes.append(f"load check: {', '.join(trainers)} refuse(s) to load the policy unless about {need / 1e9:.1f} "
                     "GB is free on its device (grpoplus.models.memory.check_fits)")
    if copies:
        need = training_bytes(params, torch.float32, lora=False, trains=False)
        notes.append(f"load check: {', '.join(copies)} hold(s) a copy of the policy's weights: about "
                     f"{need / 1e9:.1f} GB free where each loads it")
    return notes


def _how_to_get(name: str) -> str:
    """What to do about a model that is not on disk: a hub id (``owner/name``) is downloaded; a local path (an earlier
    stage's checkpoint, ``runs/sft/checkpoints/step-15``) is written by the run that makes it, or corrected."""
    local = name.startswith(("/", ".", "~")) or name.count("/") > 1
    return ("a local path: run the stage that writes that checkpoint first, or correct the path" if local
            else "download it there first")
