"""The config tree: presets, YAML, key=value overrides, and the errors bad input gets."""

import re

import pytest
import yaml

from grpoplus.config import build_config, describe_keys, parse_override


def test_preset_and_bare_and_dotted_overrides():
    cfg = build_config("dapo", overrides=["eps_high=0.3", "rollout.group_size=4", "max_steps=8"])
    assert cfg.algo.eps_high == 0.3
    assert cfg.algo.eps_low == 0.2  # from the dapo preset
    assert cfg.algo.dynamic_sampling  # dapo turns it on
    assert cfg.rollout.group_size == 4 and cfg.run.max_steps == 8
    assert cfg.run.preset == "dapo" and cfg.run.overrides == ["eps_high=0.3", "rollout.group_size=4", "max_steps=8"]


def test_max_len_and_max_new_tokens_are_one_length():
    assert build_config("dr_grpo", overrides=["max_new_tokens=24"]).algo.max_len == 24
    cfg = build_config("dr_grpo", overrides=["max_len=100"])  # either name sets both
    assert cfg.algo.max_len == cfg.rollout.max_new_tokens == 100
    assert build_config("dr_grpo", overrides=["max_len=24", "max_new_tokens=24"]).algo.max_len == 24
    with pytest.raises(ValueError, match=r"algo.max_len=512 and rollout.max_new_tokens=48 .* disagree"):
        build_config("dapo", overrides=["max_len=512", "max_new_tokens=48"])


def test_resume_with_a_new_max_new_tokens_moves_max_len_along(tmp_path):
    cfg = build_config("dapo", overrides=["max_new_tokens=24"])
    cfg.save(tmp_path / "config.yaml")
    again = build_config(base=yaml.safe_load((tmp_path / "config.yaml").read_text()), overrides=["max_new_tokens=32"])
    assert again.algo.max_len == again.rollout.max_new_tokens == 32


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "batch_std", "reinforce_pp"])
def test_group_of_one_is_rejected_for_group_relative_estimators(estimator):
    with pytest.raises(ValueError, match=r"rollout.group_size=1 .* advantage 0 .* set rollout.group_size >= 2"):
        build_config("grpo", overrides=["group_size=1", f"adv_estimator={estimator}"])
    with pytest.raises(ValueError, match="group_size=1"):  # GDPO normalises each component in its group too
        build_config("grpo", overrides=["group_size=1", "reward_aggregation=gdpo"])


def test_group_of_one_is_accepted_for_an_estimator_that_is_not_group_relative():
    from grpoplus.algo import ADVANTAGES

    @ADVANTAGES.register("test_raw_reward")
    def raw(rewards, group_index, num_groups, eps):  # REINFORCE without a baseline
        return rewards

    try:
        assert build_config("grpo", overrides=["group_size=1", "adv_estimator=test_raw_reward"]).rollout.group_size == 1
    finally:
        ADVANTAGES._items.pop("test_raw_reward")


def test_help_config_shows_the_chosen_preset_and_overrides_with_meanings():
    from grpoplus.algo import AlgoConfig

    cispo = AlgoConfig.preset("cispo")
    text = describe_keys(build_config("cispo", overrides=["eps_low=0.5"]))
    assert "  loss = 'cispo'  (cispo | clip | " in text and f"  eps_high = {cispo.eps_high!r}" in text
    assert "  kl_placement = 'in_loss'  (in_loss | in_reward)" in text  # algo keys show their choices too
    assert "  distill_loss = 'off'  (off | gjsd | reverse_kl)" in text and "  eps_low = 0.5\n" in text
    assert "  eps_low = 0.5" in text  # the override, not the preset's 1.0
    assert "  num_minibatches = 4" in text
    for key in AlgoConfig.field_names():  # every algo key is printed with a meaning under it
        line = next(i for i, row in enumerate(text.splitlines()) if row.startswith(f"  {key} = "))
        assert text.splitlines()[line + 1].startswith("      "), key


def test_eval_seed_is_a_data_key_and_run_seed_says_what_it_changes():
    assert build_config("dapo").data.eval_seed == 0
    assert build_config("dapo", overrides=["eval_seed=3"]).data.eval_seed == 3
    text = describe_keys()
    assert "warm start" in text and "data.eval_seed" in text


def test_yaml_file_nested_and_flat(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"rollout": {"temperature": 0.7}, "lr": 1e-4, "algo.beta": 0.01}))
    cfg = build_config("grpo", str(path), overrides=["lr=5e-4"])
    assert cfg.rollout.temperature == 0.7 and cfg.algo.beta == 0.01
    assert cfg.learner.lr == 5e-4  # the command line wins over the file


@pytest.mark.parametrize("override, message", [
    (["nonsense=1"], "unknown config key 'nonsense'"),
    (["rollout.nope=1"], "unknown config key 'rollout.nope'"),
    (["group_size=many"], "group_size"),
    (["loss=ppo"], "loss"),
    (["top_p=1.5"], "top_p"),
    (["lr_schedule=steep"], "lr_schedule"),
    (["noequals"], "key=value"),
    (["reward_workers=many"], "reward_workers"),
    (["release_memory=always"], "^config key run.release_memory: 'always' is not one of off, phases, eager$"),
])
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ValueError, match=message):
        build_config("dapo", overrides=override)


@pytest.mark.parametrize("value, meaning", [("true", "phases"), ("false", "off"), ("eager", "eager")])
def test_release_memory_keeps_what_its_booleans_meant(value, meaning, tmp_path):
    # a run dir's config.yaml written when the key was a boolean resumes with the same behaviour
    assert build_config(overrides=[f"release_memory={value}"]).run.release_memory == meaning
    (tmp_path / "config.yaml").write_text(f"run:\n  release_memory: {value}\n")
    assert build_config(yaml_path=str(tmp_path / "config.yaml")).run.release_memory == meaning


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.yaml"):
        build_config("dapo", str(tmp_path / "nothere.yaml"))


def test_unknown_preset_lists_presets():
    with pytest.raises(ValueError, match="dapo"):
        build_config("not_a_preset")


def test_saved_config_round_trips(tmp_path):
    cfg = build_config("cispo", overrides=["eps_high=3.0", "max_steps=5"])
    cfg.save(tmp_path / "config.yaml")
    again = build_config(base=yaml.safe_load((tmp_path / "config.yaml").read_text()), overrides=["max_steps=9"])
    assert again.algo == cfg.algo
    assert again.run.max_steps == 9 and again.run.preset == "cispo"


def test_every_preset_builds_with_the_default_rollout():
    from grpoplus.algo import AlgoConfig

    for name in AlgoConfig.preset_names():
        assert build_config(name).algo.max_len == build_config(name).rollout.max_new_tokens


def test_parse_override_types_values():
    assert parse_override("corrections=[tis_token, geo_mask]") == ("corrections", ["tis_token", "geo_mask"])
    assert parse_override("beta=0") == ("beta", 0)
    assert "eps_high" in describe_keys()


def test_algo_floats_written_without_a_dot_are_floats():
    # YAML 1.1 reads 1e-6 (no dot) as a string; every section coerces it like the others.
    cfg = build_config("grpo", overrides=["rs_threshold=1e-6", "correction_cap_low=5e-1"])
    assert cfg.algo.rs_threshold == 1e-6 and cfg.algo.correction_cap_low == 0.5


def test_defaults_fit_the_values_given_with_a_note_and_given_values_are_never_changed(capfd):
    # grpo's 4 mini-batches cannot split 2 prompts' groups; the default micro-batch of 64 gives 2 ranks only one
    cfg = build_config("grpo", overrides=["prompts_per_step=2"])
    assert cfg.algo.num_minibatches == 2 and cfg.algo.updates_per_batch == 2 * cfg.algo.num_iterations
    cfg = build_config(overrides=["data_parallel=2"])
    assert cfg.learner.micro_batch_size == 32  # 64 responses per mini-batch: one micro-batch of 32 for each rank
    notes = capfd.readouterr().err.splitlines()
    assert notes == [
        "grpoplus: note: algo.num_minibatches lowered from 4 (preset grpo) to 2: a mini-batch needs a whole group, "
        "and rollout.prompts_per_step=2",
        "grpoplus: note: learner.micro_batch_size lowered from 64 to 32: each of learner.data_parallel=2 ranks takes "
        "whole micro-batches of a 64-response mini-batch"]
    assert build_config(base=cfg.to_dict()).learner.micro_batch_size == 32  # a resumed run: its saved values
    assert capfd.readouterr().err == ""
    with pytest.raises(ValueError, match="algo.num_minibatches=4 exceeds rollout.prompts_per_step=2"):
        build_config("grpo", overrides=["prompts_per_step=2", "num_minibatches=4"])
    with pytest.raises(ValueError, match="makes only 1 of learner.micro_batch_size=64"):
        build_config(overrides=["data_parallel=2", "micro_batch_size=64"])


def test_every_refusal_is_a_named_rule_applied_in_order(monkeypatch):
    from grpoplus.config import rules

    names = [r.name for r in rules.RULES]
    assert len(names) == len(set(names)) and all(r.what for r in rules.RULES)  # unique, each says what it refuses
    seen = []
    monkeypatch.setattr(rules, "RULES", [rules.Rule(r.name, r.what, lambda cfg, n=r.name: seen.append(n))
                                         for r in rules.RULES])
    build_config(overrides=["max_steps=2"])
    assert seen == names  # check() applies every rule, in the listed order
    with pytest.raises(ValueError, match="already registered"):
        rules.rule(names[0])(lambda cfg: None)


@pytest.mark.parametrize("override, message", [
    ("eps_high=abc", "config key algo.eps_high: 'abc' is not a valid float"),
    ("num_minibatches=2.5", "config key algo.num_minibatches: 2.5 is not a valid int"),
    ("overlong_shaping=maybe", "config key algo.overlong_shaping: 'maybe' is not a valid bool"),
    ("group_size=abc", "config key rollout.group_size: 'abc' is not a valid int"),
])
def test_an_algo_key_of_the_wrong_type_is_refused_like_any_other_key(override, message):
    # the algo section goes through the same typed validation as every section (then checks its own ranges)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        build_config(overrides=[override])


def test_algo_keys_take_text_as_their_type(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("lr: 1e-6\neps_high: 3e-1\ncorrections: tis_token,mis_seq\n")  # YAML 1.1 reads 1e-6 as text
    cfg = build_config(yaml_path=str(path))
    assert (cfg.algo.eps_high, cfg.algo.corrections, cfg.learner.lr) == (0.3, ("tis_token", "mis_seq"), 1e-6)


def test_overlong_shaping_with_its_reward_listed_too_is_refused_before_anything_loads():
    with pytest.raises(ValueError, match="^algo.overlong_shaping adds the soft_overlong reward itself"):
        build_config("dapo", overrides=["rewards=[task,soft_overlong:0.5]"])
    # listed alone it takes its lengths itself (without them the reward could score nothing: the rule rewards)
    assert build_config("dapo", overrides=["rewards=[task,soft_overlong:0.5:max_len=48,cache=8]",
                                           "overlong_shaping=false"])


@pytest.mark.parametrize("overrides, message", [
    (["eval_samples=4", "eval_k=1,8"], r"^rollout.eval_k=\[1, 8\] asks pass@k for k=8 but the estimator draws k of "
                                       r"rollout.eval_samples=4 responses \(1 <= k <= n\): raise eval_samples to 8 "
                                       r"or drop k=8 from eval_k$"),
    (["eval_samples=0", "eval_k=1"], "rollout.eval_samples=0 responses"),
    (["eval_k=0"], r"^config key rollout.eval_k takes k >= 1 \(pass@k of k responses\), got \[0\]$"),
    (["eval_samples=-1"], r"^config key rollout.eval_samples must be >= 0 \(0 = greedy only\), got -1$"),
    (["eval_temperature=0"], "^config key rollout.eval_temperature must be > 0"),
    (["eval_top_p=1.5"], r"^config key rollout.eval_top_p must be in \(0, 1\], got 1.5$"),
    (["eval_max_new_tokens=0"], "^config key rollout.eval_max_new_tokens must be >= 1, got 0$"),
])
def test_evaluation_sampling_out_of_range_is_refused_in_one_line(overrides, message):
    with pytest.raises(ValueError, match=message):
        build_config(overrides=overrides)


def test_eval_k_takes_one_k_a_list_or_text():
    assert build_config(overrides=["eval_samples=8", "eval_k=4"]).rollout.eval_k == [4]
    assert build_config(overrides=["eval_samples=8", "eval_k=[1,8]"]).rollout.eval_k == [1, 8]
    assert build_config(overrides=["eval_samples=8", "eval_k=2,4"]).rollout.eval_k == [2, 4]


def test_a_saved_config_from_before_the_eval_keys_loads_with_their_defaults(tmp_path):
    saved = build_config(overrides=["eval_samples=2", "temperature=0.7"]).to_dict()
    for key in ("eval_k", "eval_temperature", "eval_top_p", "eval_max_new_tokens"):
        del saved["rollout"][key]  # a run directory's config.yaml written before these keys existed
    cfg = build_config(base=saved)
    assert (cfg.rollout.eval_samples, cfg.rollout.eval_k, cfg.rollout.eval_temperature) == (2, [], None)


@pytest.mark.parametrize("overrides, message", [
    (["quantization=int8", "precision=bf16_mixed"], r"^rollout.quantization=int8 samples with int8 kernels, which do "
                                                    r"not run under the bfloat16 autocast of learner.precision="),
    (["quantization=int8", "learner.device=cuda"], r"^rollout.quantization=int8 with rollout.engine=hf uses CPU int8 "
                                                   r"kernels, but learner.device=cuda: use rollout.engine=vllm"),
    (["quantization=fp8"], r"^rollout.quantization=fp8 needs fp8 GPU kernels: use rollout.engine=vllm"),
    (["rollout.engine=vllm", "quantization=bf16_rounded"], r"^rollout.quantization=bf16_rounded rounds the hf "),
    (["rollout.engine=vllm", "quantization=int8"], r"vLLM refuses it in float32: set learner.precision=bf16_mixed"),
    (["cluster=ray", "ray.address=10.0.0.1"], r"^ray.address='10.0.0.1' is not 'auto' or host:port"),
])
def test_what_an_engine_or_the_cluster_would_refuse_minutes_later_is_refused_by_the_config(overrides, message):
    # once refused only where the engine or the cluster starts (after the model loads), so a dry run passed them
    with pytest.raises(ValueError, match=message) as raised:
        build_config(overrides=overrides)
    assert "\n" not in str(raised.value)


def test_the_dry_run_refuses_a_sampler_the_engine_cannot_run(capsys):
    from grpoplus.entry.cli import main

    assert main(["train", "--dry-run", "quantization=int8", "precision=bf16_mixed"]) == 2
    err = capsys.readouterr().err
    assert "rollout.quantization=int8 samples with int8 kernels" in err and "Traceback" not in err


def test_vllm_refuses_a_lora_rank_above_its_largest_in_the_config():
    pytest.importorskip("peft")
    with pytest.raises(ValueError, match=r"^rollout.engine=vllm applies LoRA adapters of rank <= 512, got "
                                         r"learner.lora_rank=513: lower it, or use rollout.engine=hf"):
        build_config(overrides=["rollout.engine=vllm", "lora_rank=513"])


@pytest.mark.parametrize("overrides, message", [
    (["beta=-1"], r"^algo.beta must be >= 0, got -1.0$"),  # the algo section's own check: the user's key
    (["loss=foo"], r"^algo.loss='foo' is not valid; choose one of: "),
    (["quantization=fp8"], r"^rollout.quantization=fp8 needs fp8 GPU kernels"),  # a named rule
    (["beta=x"], r"^config key algo.beta: 'x' is not a valid float$"),  # the key's type
    (["rollout.engine_kwargs={gpu_memory_utilization: 0.5}"], r"^rollout.engine_kwargs \['gpu_memory_utilization'\]: "
                                                              r"the hf engine takes only pack_weights"),  # the engine's
])
def test_a_refused_config_is_a_config_error_naming_the_keys_as_the_user_writes_them(overrides, message):
    from grpoplus.config import ConfigError

    with pytest.raises(ConfigError, match=message) as raised:
        build_config(overrides=overrides)
    assert isinstance(raised.value, ValueError) and "AlgoConfig" not in str(raised.value)


def _leaf_error(check, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as raised:
        check(*args, **kwargs)
    return str(raised.value)


def _config_error(overrides: list[str]) -> str:
    from grpoplus.config import ConfigError

    with pytest.raises(ConfigError) as raised:
        build_config(overrides=overrides)
    assert "\n" not in str(raised.value)
    return str(raised.value)


def _leaf_checks():
    """(leaf check, its arguments, the config that asks it the same): a refusal stated once, in the leaf that guards
    its Python callers, and asked by the config's rule with the config's values."""
    import torch

    from grpoplus.core.endpoints import cluster_address
    from grpoplus.learner.replay import check_replay_checkpointing, check_replay_source
    from grpoplus.rewards.pipeline import pool_size
    from grpoplus.rewards.prm import check_step_separator
    from grpoplus.rollout.base import check_max_num_seqs
    from grpoplus.rollout.quantize import check_quantization
    from grpoplus.rollout.vllm_engine import check_vllm_options
    from grpoplus.sft.builtin import check_builtin_demos

    return [
        (check_quantization, ("fp8", "cpu"), ["quantization=fp8"]),
        (check_quantization, ("int8", "cuda"), ["quantization=int8", "learner.device=cuda"]),
        (check_quantization, ("int8", "cpu", torch.bfloat16), ["quantization=int8", "precision=bf16_mixed"]),
        (check_vllm_options, ("bf16_rounded", torch.float32, {}, 0), ["rollout.engine=vllm", "quantization=bf16_rounded"]),
        (check_vllm_options, ("int8", torch.float32, {}, 0), ["rollout.engine=vllm", "quantization=int8"]),
        (check_max_num_seqs, (-1,), ["rollout.max_num_seqs=-1"]),
        (check_replay_source, ("r2", "rollout"), ["routing_replay=r2", "logp_old=rollout"]),
        (check_replay_checkpointing, ("r3", True), ["routing_replay=r3", "gradient_checkpointing=true"]),
        (cluster_address, ("10.0.0.1",), ["cluster=ray", "ray.address=10.0.0.1"]),
        (pool_size, ("many",), ["reward_workers=many"]),
        (check_step_separator, ("",), ["prm=/some/prm", "turn_credit=process", "prm_step_separator=''"]),
        (check_builtin_demos, ("wordproblems-calculator", "arithmetic"),
         ["run.stage=sft", "sft.demos=wordproblems-calculator"]),
    ]


def test_a_refusal_a_leaf_makes_of_its_own_callers_is_the_config_rules_word_for_word():
    # the condition and its sentence live once, in the leaf; the rule asks it with the config's values, so that the
    # dry run refuses what the engine, the learner, the cluster or the pipeline would refuse minutes later
    for check, args, overrides in _leaf_checks():
        if overrides[0] == "cluster=ray":
            pytest.importorskip("ray")
        assert _leaf_error(check, *args) == _config_error(overrides), check.__name__


def test_vllm_and_a_lora_rank_above_its_largest_is_the_engines_refusal():
    pytest.importorskip("peft")
    import torch

    from grpoplus.rollout.vllm_engine import check_vllm_options

    said = _leaf_error(check_vllm_options, "none", torch.float32, {}, 513)
    assert said == _config_error(["rollout.engine=vllm", "lora_rank=513"])


@pytest.mark.parametrize("overrides, message", [
    (["rollout.max_num_seqs=-1"], r"^config key rollout.max_num_seqs must be >= 0 \(0 = the engine's choice\), got -1$"),
    (["learner.model=tiny-foo"], r"^learner.model=tiny-foo: no built-in model 'tiny-foo': the built-in tiny models are "),
    (["teacher=tiny-foo", "lambda_opd=1"], r"^learner.teacher=tiny-foo: no built-in model 'tiny-foo'"),
    (["data=rows.jsonl"], r"^learner.model unset with data.data=rows.jsonl: the built-in tiny model is warm-started on "
                          r"a built-in task, and a data set's run \(data.data\) names none: name a model directory"),
    (["data=rows.jsonl", "model=tiny-moe"], r"^learner.model=tiny-moe with data.data=rows.jsonl: the built-in tiny "
                                            r"model tiny-moe is warm-started on a built-in task"),
    (["task=nosuch"], r"^data.task=nosuch: unknown task 'nosuch'; choose one of: arithmetic, countdown, "),
    (["task=arithmetic", "difficulty=11"], r"^data.task=arithmetic, data.difficulty=11: arithmetic difficulty must be an "
                                           r"integer in \[1, 10\], got 11$"),
    (["task=guess", "difficulty=8"], r"^data.task=guess, data.difficulty=8: guess difficulty must be an integer in "
                                     r"\[1, 7\], got 8$"),
    (["task=countdown", "task_kwargs={n_tests: 3}"], r"^data.task=countdown, data.task_kwargs=\{'n_tests': 3\}: task "
                                                     r"'countdown' does not take argument\(s\) n_tests; it takes: "),
    (["task=countdown", "task_kwargs={n_train: -1}"], r"^data.task=countdown, data.task_kwargs=\{'n_train': -1\}: "
                                                      r"countdown: n_train and n_test must be >= 0, got n_train=-1$"),
    (["task=wordproblems"], r"^data.task=wordproblems writes chat prompts for an instruct model, and the built-in tiny "
                            r"model \(learner.model\) has no chat template: pass --model"),
    (["rewards=[task,nosuch]"], r"^data.rewards: unknown reward 'nosuch'; choose one of: "),
    (["rewards=[task,format,format]"], r"^data.rewards: reward names must be unique, \['format'\] appear more than once$"),
    (["rewards=[task,judge]"], r"^data.rewards: reward 'judge' needs url=, the server's base URL"),
    (["rewards=[task,judge:url=http://h:8000/v1,min_score=5,max_score=1]"],
     r"^data.rewards: reward 'judge': max_score=1 must be above min_score=5$"),
    (["rewards=[task,reward_model]"], r"^data.rewards: reward_model needs path=DIR"),
    (["rewards=[task,code:timeout_s=0]"], r"^data.rewards: run_python needs timeout_s > 0 and memory_mb > 0, got 0, 1024$"),
    (["overlong_shaping=false", "rewards=[task,soft_overlong:max_len=8,cache=16]"],
     r"^data.rewards: soft_overlong needs 0 < cache <= max_len, got cache=16, max_len=8$"),
    (["overlong_shaping=false", "rewards=[task,soft_overlong]"], r"^data.rewards: reward 'soft_overlong' needs max_len= "
                                                                  r"and cache= \(tokens\)"),
    (["run.stage=sft", "model=some/dir", "data=rows.jsonl"], r"^run.stage=sft learns from demonstrations, and a data "
                                                             r"set's rows \(data.data=rows.jsonl\) hold answers, not "
                                                             r"worked demonstrations: give them as sft.demos"),
])
def test_what_a_leaf_would_refuse_after_loading_is_a_config_error_before(overrides, message):
    # each was refused only where the task, the rewards, the policy or the demonstrations are built (a dry run passed)
    assert re.search(message, _config_error(overrides)), overrides


def test_what_the_refusals_of_the_task_and_the_rewards_leave_through():
    assert build_config(overrides=["task=wordproblems", "chat_template=false", "difficulty=4"]).data.difficulty == 4
    assert build_config(overrides=["task=wordproblems", "model=some/dir"]).learner.model == "some/dir"
    assert build_config(overrides=["data=rows.jsonl", "model=tiny-untrained"]).data.data == "rows.jsonl"
    assert build_config(overrides=["rewards=[task,judge:url=http://h:8000/v1]", "max_steps=2"]).data.rewards
    assert build_config(overrides=["overlong_shaping=false", "rewards=[task,soft_overlong:max_len=48,cache=8]"])
    assert build_config(overrides=["rollout.max_num_seqs=0"]).rollout.max_num_seqs == 0
