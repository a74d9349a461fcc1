import json

import pytest
import torch
from safetensors.torch import load_file

import grpoplus.sft.warmstart as warmstart
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.sft.warmstart import REQUIRED_FILES, build_warmstart, encode_sft, warmstart_dir, warmstart_recipe

QUICK = dict(size="nano", steps=3, batch_size=4)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOPLUS_CACHE", str(tmp_path))
    return tmp_path


def test_build_writes_a_complete_hf_dir_under_the_cache(cache):
    path = build_warmstart("arithmetic", **QUICK)
    assert path.parent == cache / "warmstart"
    assert path.name.startswith("arithmetic-d4-nano-")
    assert all((path / name).is_file() for name in REQUIRED_FILES)
    recipe = json.loads((path / "recipe.json").read_text())
    assert (recipe["task"], recipe["difficulty"], recipe["steps"]) == ("arithmetic", 4, 3)
    assert [p.name for p in path.parent.iterdir() if p.suffix != ".lock"] == [path.name]  # no staging dir left behind


def test_second_call_reuses_the_cache(monkeypatch):
    first = build_warmstart("arithmetic", **QUICK)

    def must_not_build(*args, **kwargs):
        raise AssertionError("rebuilt a complete cache")

    monkeypatch.setattr(warmstart, "build_into", must_not_build)
    assert build_warmstart("arithmetic", **QUICK) == first


def test_a_build_waits_for_one_in_progress_and_takes_its_result(capsys, monkeypatch):
    """Two processes asking for the same warm start (two workers, two runs) build it once: the second waits on the
    lock file and returns the first one's dir."""
    import threading

    from filelock import FileLock

    recipe = warmstart_recipe("arithmetic", **QUICK)
    final = warmstart_dir(recipe)
    final.parent.mkdir(parents=True)
    other = FileLock(final.parent / f".{final.name}.lock")  # the first process, building
    other.acquire()
    result = []
    waiting = threading.Thread(target=lambda: result.append(build_warmstart("arithmetic", **QUICK)))
    waiting.start()
    waiting.join(timeout=2.0)
    assert waiting.is_alive() and not result  # it waits, and builds nothing meanwhile
    warmstart.build_into(final, recipe)  # the first process's result
    built = []
    monkeypatch.setattr(warmstart, "build_into", lambda *a: built.append(a))
    other.release()
    waiting.join(timeout=30.0)
    assert result == [final] and not built
    assert "waiting for another process building" in capsys.readouterr().err


def test_half_written_cache_is_rebuilt(cache):
    recipe = warmstart_recipe("arithmetic", **QUICK)
    broken = warmstart_dir(recipe)
    broken.mkdir(parents=True)
    (broken / "config.json").write_text("{}")  # as if killed before the weights were written
    path = build_warmstart("arithmetic", **QUICK)
    assert path == broken
    assert all((path / name).is_file() for name in REQUIRED_FILES)
    assert json.loads((path / "config.json").read_text())["model_type"] == "llama"


def test_same_recipe_same_weights_and_recipe_changes_the_dir():
    a = build_warmstart("arithmetic", **QUICK)
    weights_a = load_file(a / "model.safetensors")
    b = build_warmstart("arithmetic", rebuild=True, **QUICK)
    assert a == b
    weights_b = load_file(b / "model.safetensors")
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    assert build_warmstart("arithmetic", seed=1, **QUICK) != a


def test_sft_labels_cover_the_response_and_eos_only():
    tok = char_tokenizer()
    batch = encode_sft(tok, ["1+2=", "3="], ["3#3", "#3"])
    # row 0: <bos> 1 + 2 = | 3 # 3 <eos>  -> 5 prompt tokens masked, 4 labelled
    assert batch["labels"][0].tolist()[:5] == [-100] * 5
    assert tok.decode(batch["labels"][0, 5:9].tolist()) == "3#3<eos>"
    # row 1 is right-padded: <bos> 3 = | # 3 <eos> then 3 pads, all unlabelled
    assert batch["labels"][1].tolist()[6:] == [-100] * 3
    assert batch["attention_mask"][1].tolist() == [1] * 6 + [0] * 3


def test_cli_builds_and_prints_the_dir(capsys):
    warmstart.main(["--task", "countdown", "--size", "nano", "--steps", "2", "--batch-size", "4"])
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert "countdown-d3-nano-" in printed


def test_build_prints_progress_lines_to_stderr(capsys):
    build_warmstart("arithmetic", size="nano", steps=10, batch_size=4)
    err = capsys.readouterr().err
    assert "warm start: building arithmetic-d4-nano-" in err and "10 supervised steps" in err
    assert "warm start: step 10/10 loss" in err and "s left)" in err
    assert "warm start: done in" in err
    build_warmstart("arithmetic", size="nano", steps=10, batch_size=4)
    assert capsys.readouterr().err == ""  # a cached warm start is silent


def test_warm_start_never_trains_on_the_fixed_held_out_problems(monkeypatch):
    from grpoplus.tasks import get_task

    seen = {}

    def capture(model, tokenizer, prompts, targets, **kwargs):
        seen["prompts"] = set(prompts)
        return [0.0]

    monkeypatch.setattr(warmstart, "train_sft", capture)
    held_out = {ex.prompt for ex in get_task("arithmetic", seed=0).split("test")}
    own = {ex.prompt for ex in get_task("arithmetic", seed=1).split("train")}
    assert own & held_out  # seed 1's training split holds problems of seed 0's held-out split
    build_warmstart("arithmetic", seed=1, eval_seed=0, **QUICK)
    assert seen["prompts"] == own - held_out
    # Evaluating on the run's own seed leaves the recipe (and so the cached dir) as it was.
    assert warmstart_recipe("arithmetic", seed=1, eval_seed=1, **QUICK) == warmstart_recipe("arithmetic", seed=1, **QUICK)
    assert "eval_seed" in warmstart_recipe("arithmetic", seed=1, eval_seed=0, **QUICK)
