"""The run's plan: derived once from a validated config, frozen, handed to the roles instead of the config."""

import dataclasses
import json
import pickle

import pytest

from grpoplus.algo import AlgoConfig
from grpoplus.config import SECTIONS, Config, build_config
from grpoplus.plan import placement as where
from grpoplus.plan import resolve
from grpoplus.plan.run import logp_old_mode


def _plan(*overrides):
    return resolve(build_config(overrides=list(overrides)))


def _fields(value):
    """Every value inside a (nested) dataclass, the dataclass itself included."""
    yield value
    if dataclasses.is_dataclass(value) and not isinstance(value, AlgoConfig):
        for f in dataclasses.fields(value):
            yield from _fields(getattr(value, f.name))


def test_a_role_receives_its_plan_and_no_config_section():
    # A learner rank or a rollout worker is told what it needs; the user's sections stay with the driver (the learner
    # keeps the algorithm's section: its loss is made of it).
    plan = _plan("beta=0.04")
    user_sections = tuple(cls for cls in SECTIONS.values() if cls is not AlgoConfig) + (Config,)
    for role in (plan.learner, plan.rollout):
        assert not [v for v in _fields(role) if isinstance(v, user_sections)]
    assert plan.learner.algo == build_config(overrides=["beta=0.04"]).algo
    assert plan.record() == build_config(overrides=["beta=0.04"]).to_dict()  # the settings, recorded and no more


def test_the_plan_is_frozen_pickles_and_renders_to_plain_data():
    plan = _plan()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.learner.update.micro_batch_size = 3
    assert pickle.loads(pickle.dumps(plan.learner)) == plan.learner  # what a spawned rank or Ray actor receives
    assert pickle.loads(pickle.dumps(plan.rollout)) == plan.rollout
    rendered = plan.to_dict()
    assert json.loads(json.dumps(rendered)) == rendered and "config" not in rendered
    assert rendered["learner"]["update"]["logp_old"] == plan.learner.update.logp_old


@pytest.mark.parametrize("overrides, expected", [
    (("preset=dr_grpo",), "forward"),  # one update per batch, nothing needs pi_old first: the training forward's own
    (("preset=dr_grpo", "num_minibatches=2"), "recompute"),  # the second mini-batch's weights are no longer pi_old
    (("preset=dr_grpo", "logp_old=rollout"), "rollout"),
    (("preset=dr_grpo", "lora_rank=4", "lora_dropout=0.1"), "recompute"),  # dropout: the training forward is stochastic
])
def test_where_pi_old_comes_from_is_decided_once(overrides, expected):
    if any(o.startswith("lora") for o in overrides):
        pytest.importorskip("peft", reason="learner.lora_rank needs the lora extra: pip install -e '.[lora]'")
    assert _plan(*overrides).learner.update.logp_old == expected


def test_routing_replay_r2_takes_the_recompute_pass_whatever_the_source():
    assert logp_old_mode(AlgoConfig(routing_replay="r2"), "auto", uses_reference=False) == "recompute"
    assert logp_old_mode(AlgoConfig(), "auto", uses_reference=False) == "forward"
    # KL in the reward needs pi_old before the update
    assert logp_old_mode(AlgoConfig(beta=0.1, kl_placement="in_reward"), "auto", uses_reference=True) == "recompute"


def test_the_reference_is_a_copy_the_adapters_off_or_none():
    assert _plan("beta=0").learner.reference == "none"
    assert _plan("beta=0.04").learner.reference == "copy"
    pytest.importorskip("peft", reason="learner.lora_rank needs the lora extra: pip install -e '.[lora]'")
    lora = _plan("beta=0.04", "lora_rank=4")
    assert lora.learner.reference == "adapters_off" and lora.learner.update.reference_adapters_off


def test_placement_is_the_placement_predicates_evaluated_once():
    cfg = build_config(overrides=["data_parallel=2", "strategy=fsdp2", "micro_batch_size=2"])
    p = resolve(cfg).placement
    assert (p.sharded, p.shards, p.ranks) == (True, 2, 2)
    assert p.whole_copy_in_host_memory == where.whole_copy_in_host_memory(cfg)
    assert p.driver_copy_in_host_memory == where.driver_copy_in_host_memory(cfg)
    assert p.process_device == where.process_device(cfg) == "cpu"
    assert resolve(cfg).learner.policy.footprint.shards == 2


def test_the_memory_policy_follows_run_release_memory():
    eager, off = _plan("release_memory=eager").learner.update, _plan("release_memory=off").learner.update
    assert eager.trim_every > 0 and eager.release_after_update
    assert off.trim_every == 0 and not off.release_after_update


def test_the_optimizer_plan_counts_every_optimizer_step():
    opt = _plan("preset=dr_grpo", "max_steps=7", "num_minibatches=2").learner.optimizer
    assert opt.total_steps == 14 and opt.lr is None  # None: the rate that fits the model, chosen when it is loaded


def test_held_out_sampling_takes_the_rollouts_where_the_eval_keys_are_unset():
    plan = _plan("temperature=0.7", "top_p=0.9", "max_new_tokens=12", "eval_samples=8")
    assert (plan.eval.temperature, plan.eval.top_p, plan.eval.max_new_tokens) == (0.7, 0.9, 12)
    assert plan.eval.ks == (1, 8)  # eval_k unset: pass@1 and pass@n
    own = _plan("temperature=0.7", "eval_temperature=0.2", "eval_top_p=0.5", "eval_max_new_tokens=30",
                "eval_samples=8", "eval_k=[4,2,4]")
    assert (own.eval.temperature, own.eval.top_p, own.eval.max_new_tokens, own.eval.ks) == (0.2, 0.5, 30, (2, 4))
    assert _plan("eval_samples=1").eval.ks == (1,) and _plan("eval_samples=0").eval.ks == ()
    assert own.to_dict()["eval"]["ks"] == [2, 4]


def _field_paths(cls, prefix=""):
    """Every field of a plan dataclass, nested plans walked (``process.seed``)."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        out += _field_paths(kind, f"{prefix}{f.name}.") if dataclasses.is_dataclass(kind) and kind.__name__.endswith(
            "Plan") else [f"{prefix}{f.name}"]
    return out


@pytest.mark.parametrize("role", ["LearnerRolePlan", "RolloutRolePlan"])
def test_a_role_plan_records_each_fact_once(role):
    # a role's seed and whether its training state is sharded each have one field, so two records cannot disagree
    from grpoplus.plan import run

    paths = _field_paths(getattr(run, role))
    for fact in ("seed", "sharded"):
        assert len([p for p in paths if p.rsplit(".", 1)[-1] == fact]) <= 1, (fact, paths)


def test_the_driver_side_parts_take_the_runs_seed_from_the_process_plan():
    # the loop, collection, rewards, cluster and supervised-stage plans hold no seed of their own: RunPlan.seed is
    # the process plan's, the one every process of the run (the driver's too) is set up from
    from grpoplus.plan import run

    driver_parts = [f for f in dataclasses.fields(run.RunPlan) if f.name not in ("settings", "learner", "rollout")]
    paths = [p for f in driver_parts for p in _field_paths(_plan_class(run, f.type), f"{f.name}.")]
    assert [p for p in paths if p.rsplit(".", 1)[-1] == "seed"] == []
    plan = _plan("run.seed=7")
    assert plan.seed == plan.learner.process.seed == 7


def _plan_class(module, annotation: str):
    """The plan dataclass a field's annotation (``"LoopPlan"``, ``"ClusterPlan | None"``) names."""
    return getattr(module, annotation.split("|")[0].strip())


def test_the_plan_files_of_a_new_start_replace_the_old_ones(tmp_path):
    # a part the new plan lacks (the supervised stage's, after run.stage=sft) leaves no stale file behind
    from grpoplus.plan import plan_files, write_plan_files

    write_plan_files(tmp_path, _plan("run.stage=sft"))
    assert (tmp_path / "sft.yaml").is_file()
    plan = _plan()
    write_plan_files(tmp_path, plan)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == plan_files(plan)
