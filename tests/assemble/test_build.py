"""The build layer's data: a held-out set fixed by data.eval_seed that no training prompt is part of; the
learning rate that follows the model."""

import json

import pytest
import torch

from grpoplus.assemble.data import build_data
from grpoplus.config import build_config
from grpoplus.plan import resolve
from grpoplus.tasks import get_task


def _prompts(examples) -> set[str]:
    return {ex.prompt for ex in examples}


NO_WARM_START = "model=tiny-untrained"
"""A data set's run names its model: the built-in tiny one is warm-started on a built-in task (the config rule models),
but for tiny-untrained."""


def _build(*overrides):
    """(task, train, test) of the dapo preset's run with ``overrides``, made from its plan's data part."""
    plan = resolve(build_config("dapo", overrides=list(overrides)))
    return build_data(plan.data, None, plan.seed)


def test_eval_set_is_fixed_across_run_seeds_and_never_trained_on():
    fixed = _prompts(get_task("arithmetic", seed=0).split("test"))
    for seed in (1, 2):
        _, train, test = _build(f"seed={seed}")
        assert _prompts(test) == fixed  # data.eval_seed=0 for every run.seed
        own_train = get_task("arithmetic", seed=seed).split("train")
        assert _prompts(own_train) & fixed  # the seed's own training split holds held-out problems...
        assert not _prompts(train) & fixed  # ...which are filtered out
        assert _prompts(train) == _prompts(own_train) - fixed


def test_seed_0_keeps_its_splits_as_they_were():
    task = get_task("arithmetic", seed=0)
    _, train, test = _build()
    assert train == list(task.split("train")) and test == list(task.split("test"))


def test_eval_seed_chooses_the_held_out_rows_of_a_data_set(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) for i in range(40)) + "\n")
    splits = [_build(f"data={data}", f"seed={seed}", "chat_template=false", NO_WARM_START) for seed in (0, 5)]
    assert _prompts(splits[0][2]) == _prompts(splits[1][2])
    for _, train, test in splits:
        assert not _prompts(train) & _prompts(test) and len(train) + len(test) == 40
    moved = _build(f"data={data}", "eval_seed=1", "chat_template=false", NO_WARM_START)
    assert _prompts(moved[2]) != _prompts(splits[0][2])


def test_the_learning_rate_follows_the_model_unless_given(capfd):
    pytest.importorskip("peft", reason="learner.lora_rank needs the lora extra: pip install -e '.[lora]'")
    # A rate tuned on the 0.34M built-in model damages a real one: toy 2e-4, full fine-tuning 1e-6, LoRA 1e-5.
    from grpoplus.assemble.factories import learning_rate

    def rate(model, *overrides):
        return learning_rate(resolve(build_config(overrides=list(overrides))).learner.optimizer, model)

    toy, real = torch.nn.Linear(10, 10), torch.nn.Embedding(12_000_000, 1)
    assert rate(toy) == 2e-4 and capfd.readouterr().err == ""
    assert rate(real) == 1e-6
    assert rate(real, "lora_rank=8") == 1e-5
    assert capfd.readouterr().err.splitlines() == [
        "grpoplus: note: learner.lr=1e-06 (full fine-tuning of a 12M-parameter model; set learner.lr to choose)",
        "grpoplus: note: learner.lr=1e-05 (LoRA adapters of a 12M-parameter model; set learner.lr to choose)"]
    assert rate(real, "lr=3e-5") == 3e-5 and capfd.readouterr().err == ""


def test_rows_that_all_share_one_prompt_need_a_problem_id_or_held_out_rows_of_their_own(tmp_path):
    # the idiom of an environment that draws its own task: every row says only "play"
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": "play", "answer": str(i)}) + "\n" for i in range(20)))
    overrides = (f"data={data}", "chat_template=false", NO_WARM_START)
    with pytest.raises(ValueError, match=r"^every one of the \d+ training rows shares its problem with a held-out row "
                                         r".*give each row a problem_id field .* \(data.eval_data\)$"):
        _build(*overrides)
    data.write_text("".join(json.dumps({"prompt": "play", "answer": str(i), "problem_id": f"game-{i}"}) + "\n"
                            for i in range(20)))
    _, train, test = _build(*overrides)
    assert train and test and not {e.fields["problem_id"] for e in train} & {e.fields["problem_id"] for e in test}
