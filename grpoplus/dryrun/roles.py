"""The plan of a run as a dry run tells it: which role runs where (the plan's placement, as the assembly places
them), what the machine must offer beyond the config checks, and the warnings a plan can earn before anything
loads. Reads the plan alone (:class:`grpoplus.plan.RunPlan`), never the config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grpoplus.models.footprint import Footprint, need_bytes
from grpoplus.models.sizes import ModelSize
from grpoplus.plan import RunPlan


@dataclass(frozen=True)
class Role:
    name: str
    where: str


def roles_of(plan: RunPlan) -> list[Role]:
    """Each role of the run and where it runs."""
    return [Role("cluster", _cluster(plan)), Role("rollout", _rollout(plan)), Role("learner", _learner(plan)),
            Role("reference", _reference(plan)), Role("teacher", _teacher(plan)), Role("rewards", _rewards(plan))]


def _cluster(plan: RunPlan) -> str:
    n = plan.placement.ranks
    if plan.cluster is not None:
        address = plan.cluster.address
        where = f"the running Ray cluster (ray.address={address})" if address else "a local Ray instance (ray.init())"
        return f"ray: {where}; this process is the driver"
    if n == 1:
        return "local: this machine, one process"
    return (f"local: {n} learner ranks on this machine (rank 0 is this process; ranks 1-{n - 1} spawned by it, "
            "or started by torchrun)")


def _device(plan: RunPlan, rank: int = 0) -> str:
    device = plan.placement.device
    return f"cuda:{rank}" if device == "cuda" else device


def _rollout(plan: RunPlan) -> str:
    where, engine, staleness = plan.placement, plan.rollout.engine.name, plan.collection.max_staleness
    if plan.cluster is not None:
        gpu = "1 GPU each" if where.on_gpus else "CPU"
        return (f"{where.rollout_workers} rollout worker(s), Ray actors, each its own {engine} engine on its own copy "
                f"of the policy ({gpu}); weights reach them by ray.weight_sync={plan.cluster.weight_sync}")
    copy = "rank 0's whole-policy copy" if where.sharded else "the learner's own module"
    text = f"engine {engine} in the driver's process on {_device(plan)}, sampling with {copy}"
    if staleness:
        text += f"; a second engine on its own copy samples up to {staleness} version(s) ahead"
    return text


def _learner(plan: RunPlan) -> str:
    where, lrn, algo = plan.placement, plan.learner, plan.learner.algo
    n = where.ranks
    if plan.cluster is not None:
        on = "Ray actors, 1 GPU each" if where.on_gpus else "Ray actors, CPU"
    else:
        on = f"{_device(plan, 0)}..{_device(plan, n - 1)}" if n > 1 and where.device == "cuda" else where.device
    strategy = where.strategy + (" (one rank: nothing to shard)" if where.strategy == "fsdp2" and n == 1 else "")
    tuned = f"LoRA rank {plan.lora.rank} on {list(plan.lora.target_modules)}" if plan.lora.rank else "full fine-tuning"
    if lrn.policy.quantize != "none":
        tuned += f" over a frozen {lrn.policy.quantize} base (QLoRA: decoder layers' linear weights in 4-bit)"
    if lrn.policy.footprint.freeze:
        tuned += f", {list(lrn.policy.footprint.freeze)} kept frozen"
    head = f"{n} rank(s), strategy {strategy}, precision {lrn.update.precision}, on {on}; {tuned}; "
    if plan.sft is not None:
        return (head + f"one optimizer step per {plan.sft.demos_per_step} demonstrations (the supervised stage: the "
                "algo section does not act)")
    return (head + f"{algo.updates_per_batch} optimizer step(s) per rollout batch ({algo.num_iterations} iteration(s) "
            f"x {algo.num_minibatches} mini-batch(es))")


def _reference(plan: RunPlan) -> str:
    kind, beta = plan.learner.reference, plan.learner.algo.beta  # the learner's own decision
    if kind == "none":
        return "none (the supervised stage)" if plan.sft is not None else "none (algo.beta = 0)"
    if kind == "adapters_off":
        q = plan.learner.policy.quantize
        base = f", the {q} base" if q != "none" else ""
        return f"the policy with its LoRA adapters off (algo.beta = {beta}; no second copy{base})"
    lowered = ", linear weights in bfloat16" if plan.learner.update.precision == "bf16_mixed" else ""
    return f"a frozen copy of the policy, whole on every learner rank (algo.beta = {beta}{lowered})"


def _teacher(plan: RunPlan) -> str:
    from grpoplus.teacher import is_endpoint

    teacher, algo = plan.learner.teacher, plan.learner.algo
    if teacher is None:
        return "none"
    uses = f"algo.lambda_opd = {algo.lambda_opd}, algo.distill_loss = {algo.distill_loss}"
    if is_endpoint(teacher):
        return f"served at {teacher} (prompt log-probs; not on this run's devices); {uses}"
    return f"{teacher}, fp32, frozen, loaded on every learner rank's device; {uses}"


def _rewards(plan: RunPlan) -> str:
    r = plan.rewards
    if plan.sft is not None:
        return (f"none in training (the supervised stage); the task's verifier scores the held-out evaluation"
                f"{'' if plan.loop.eval_accuracy else ' (off: sft.eval_accuracy=false)'}")
    names = [spec.get("name") if isinstance(spec, dict) else str(spec) for spec in r.specs]
    pool = "" if r.workers == 0 else f"a pool of {r.workers} worker processes"
    if plan.cluster is not None:
        where = "a Ray task per rollout batch" + (f", with {pool}" if pool else "")
    else:
        where = pool or "in the driver's process"
    extra = "; + DAPO's soft overlong punishment" if r.soft_overlong else ""
    prm = f"; process reward model {r.prm} on {plan.placement.device}" if r.prm else ""
    env = f"; multi-turn in {plan.collection.env}" if plan.collection.env else ""
    return f"{', '.join(names)}{extra}: {where}{prm}{env}"


def machine_needs(plan: RunPlan, policy: ModelSize, teacher: ModelSize | None) -> list[str]:
    """What this machine lacks for the run beyond the config checks' own notes: GPUs, models and data files."""
    import torch

    where, needs = plan.placement, []
    if where.on_gpus:
        gpus = torch.cuda.device_count()
        wanted = 1 if plan.cluster is None else where.ranks + where.rollout_workers
        if plan.cluster is not None and plan.cluster.address is None and wanted > gpus:
            needs.append(f"a local Ray instance needs {wanted} GPUs (rollout.workers={where.rollout_workers} + "
                         f"learner.data_parallel={where.ranks}, one each) but this machine has {gpus}")
        elif plan.cluster is None and where.ranks == 1 and gpus < 1:
            needs.append(f"learner.device={where.device} needs a CUDA GPU, and this machine has none")
    for what, ms in (("learner.model", policy), ("learner.teacher", teacher)):
        if ms is not None and not ms.on_disk:
            needs.append(f"{what}: the model {ms.name!r} is not on this machine ({_how_to_get(ms.name)})")
    for key, path in (("data", plan.data.data), ("eval_data", plan.data.eval_data), ("prm", plan.rewards.prm)):
        if path is not None and not Path(path).expanduser().exists():
            needs.append(f"data.{key}: {path!r} does not exist on this machine")
    return needs


def warnings(plan: RunPlan, policy: ModelSize, teacher: ModelSize | None) -> list[str]:
    """What the plan does not refuse, but a run on its machine may trip over."""
    from grpoplus.models.load import is_builtin

    where, update, notes = plan.placement, plan.learner.update, []
    kwargs = dict(plan.rollout.engine.kwargs)
    if where.on_gpus and plan.rollout.engine.name == "vllm" and plan.cluster is None and not (
            {"gpu_memory_utilization", "kv_cache_memory_bytes"} & set(kwargs)):
        notes.append("vLLM shares the learner's GPU but rollout.engine_kwargs sets neither gpu_memory_utilization "
                     "nor kv_cache_memory_bytes: vLLM's default takes 0.9 of the GPU; give it a share "
                     "(e.g. gpu_memory_utilization: 0.3) and sleep_between_steps: true")
    if where.on_gpus and plan.cluster is not None:
        notes.append(f"the Ray cluster must offer {where.ranks + where.rollout_workers} GPUs (rollout.workers + "
                     "learner.data_parallel, one each); the run checks it before any actor starts")
    if where.on_gpus and update.precision == "bf16_mixed":
        notes.append("learner.precision=bf16_mixed needs native bfloat16 on the GPU (NVIDIA compute capability 8.0 "
                     "or newer: A100, H100, RTX 30xx/40xx); older GPUs are refused when the run starts")
    if teacher is not None and teacher.arch and policy.arch and teacher.arch.vocab != policy.arch.vocab:
        notes.append(f"teacher {teacher.name!r} predicts over {teacher.arch.vocab} rows, the policy over "
                     f"{policy.arch.vocab}: fine when both have one tokenizer (the rows past it are padding); the run "
                     "compares the tokenizers when it starts")
    if update.packing == "on" and update.share_prompts:
        notes.append("learner.packing=on: a packed forward computes every row's prompt (no padding, but "
                     "learner.share_prompts does not apply to it); where responses are all about one length, "
                     "learner.packing=off with shared prompts computes fewer tokens")
    if update.compile != "off" and update.packing != "on":
        notes.append("learner.compile=true computes every row whole (learner.share_prompts does not apply: the shared-"
                     "prompt forward would compile one graph per layer); its first update compiles the layers (about 20 s "
                     "on a 2-core CPU)")
    if policy.params is not None and not is_builtin(plan.learner.policy.model):  # the built-in models load unchecked
        notes += _load_checks(plan, policy)
    if teacher is not None and teacher.params is not None:
        need = need_bytes(Footprint(trains=False), teacher)
        notes.append(f"load check: the teacher's weights, about {need / 1e9:.1f} GB, must be free on each learner "
                     "rank's device after the policy")
    return notes


def _load_checks(plan: RunPlan, policy: ModelSize) -> list[str]:
    """What the loader's memory check (grpoplus.models.memory.check_fits, the same footprint) asks of each process
    that loads the policy: room to hold what it keeps where a learner loads it, room for its weights where a copy is
    only held."""
    where, fp = plan.placement, plan.learner.policy.footprint
    ray, n, host = plan.cluster is not None, where.ranks, where.whole_copy_in_host_memory
    trainers = ["this process" if n == 1 and not ray else "learner rank 0" if where.sharded else
                f"each of the {n} learner ranks"] if not host else []
    copies = ["learner rank 0 (into its host memory; the other ranks take their shards from it)"] if host else []
    if ray:
        (copies if where.on_gpus else trainers).insert(0, "the driver (on its CPU)")
        on = "host memory" if where.on_gpus and plan.rollout.engine.name == "vllm" else "its device"
        copies.append(f"each of {where.rollout_workers} rollout worker(s) (into its {on})")
    notes = []
    if trainers:
        notes.append(f"load check: {', '.join(trainers)} refuse(s) to load the policy unless about "
                     f"{need_bytes(fp, policy) / 1e9:.1f} GB is free on its device (grpoplus.models.memory.check_fits)")
    if copies:
        notes.append(f"load check: {', '.join(copies)} hold(s) a copy of the policy's weights: about "
                     f"{need_bytes(fp.copy_only(), policy) / 1e9:.1f} GB free where each loads it")
    return notes


def _how_to_get(name: str) -> str:
    """What to do about a model that is not on disk: a hub id (``owner/name``) is downloaded; a local path (an earlier
    stage's checkpoint, ``runs/sft/checkpoints/step-15``) is written by the run that makes it, or corrected."""
    local = name.startswith(("/", ".", "~")) or name.count("/") > 1
    return ("a local path: run the stage that writes that checkpoint first, or correct the path" if local
            else "download it there first")
