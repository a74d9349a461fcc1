"""`grpoplus train` on a mixture-of-experts policy: every routing replay mode runs end to end and
logs the routing metrics; replay on a dense policy is refused before training."""

import pytest

from grpoplus.entry.cli import main
from grpoplus.metrics import read_metrics
from grpoplus.models.tiny import tiny_model, tiny_moe_model
from grpoplus.models.tokenizer import char_tokenizer

SMALL = ["prompts_per_step=4", "group_size=4", "max_new_tokens=8", "eval_size=4", "eval_samples=0",
         "progress=false", "loggers=[]", "micro_batch_size=8", "num_minibatches=2", "threads=1"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, str]:
    tok = char_tokenizer()
    dirs = {}
    for name, model in (("moe", tiny_moe_model(tok, size="moe-nano", seed=0)), ("dense", tiny_model(tok, size="nano"))):
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        tok.save_pretrained(path)
        dirs[name] = str(path)
    return dirs


@pytest.mark.parametrize("mode", ["off", "r2", "r3"])
def test_every_replay_mode_trains_and_logs_routing_metrics(model_dirs, tmp_path, mode):
    out = tmp_path / mode
    assert main(["train", "--preset", "grpo", "--model", model_dirs["moe"], "--out", str(out), "max_steps=2",
                 f"routing_replay={mode}", *SMALL]) == 0
    last = read_metrics(out)[-1]
    keys = ("moe/routing_mismatch", "moe/routing_mismatch/layer0", "moe/routing_mismatch/layer1",
            "moe/routing_mismatch_first", "moe/load_max_frac")
    assert all(0.0 <= last[k] <= 1.0 for k in keys), {k: last.get(k) for k in keys}
    assert last["moe/load_max_frac"] >= 0.25  # 4 experts: the busiest takes at least 1 / 4


def test_replay_on_a_dense_policy_is_refused(model_dirs, tmp_path, capsys):
    assert main(["train", "--model", model_dirs["dense"], "--out", str(tmp_path / "d"), "routing_replay=r3",
                 *SMALL]) == 2
    assert "routing_replay=r3 needs a mixture-of-experts policy" in capsys.readouterr().err
    assert not (tmp_path / "d" / "metrics.jsonl").exists()


def test_entropy_bonus_forward_replays_the_routing_too(model_dirs, tmp_path):
    # The bonus takes another forward (logp and entropy with grad); the routing metrics come from the
    # replay context around it, so they exist only if that forward is replayed as well.
    out = tmp_path / "bonus"
    assert main(["train", "--preset", "grpo", "--model", model_dirs["moe"], "--out", str(out), "max_steps=1",
                 "routing_replay=r3", "entropy_coef=0.01", *SMALL]) == 0
    last = read_metrics(out)[-1]
    assert "loss/entropy_bonus" in last and 0.0 <= last["moe/routing_mismatch"] <= 1.0
