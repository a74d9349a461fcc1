"""The config tree: presets, YAML, key=value overrides, and the errors bad input gets."""

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


def test_max_len_follows_max_new_tokens_unless_set():
    assert build_config("dr_grpo", overrides=["max_new_tokens=24"]).algo.max_len == 24
    assert build_config("dr_grpo", overrides=["max_new_tokens=24", "max_len=100"]).algo.max_len == 100


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
])
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ValueError, match=message):
        build_config("dapo", overrides=override)


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
