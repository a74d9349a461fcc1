"""The failure gallery, weight sync: a sync that leaves one tensor of the engine's weights stale is named by the step
that samples with it (the sync_gap signal), and a fresh sync never is."""

import copy

import torch

from grpoplus.entry.cli import main
from grpoplus.metrics import read_metrics
from grpoplus.rollout.hf import HFEngine

SPREAD = "def spread(prompts, completions, **fields):\n    return [len(set(c)) / 10 for c in completions]\n"
SMALL = ["--preset", "grpo", "prompts_per_step=4", "group_size=4", "max_new_tokens=10", "eval_size=4", "eval_samples=0",
         "progress=false", "loggers=[]", "micro_batch_size=8", "threads=1", "health.stop_after=0", "lr=1e-3"]


def _leave_one_tensor_stale(monkeypatch, name_part: str) -> dict:
    """Every sync gives the engine a copy of the learner's weights with one tensor kept as the first sync (after step
    1's update) had it: from the second sync on, a sync that skipped that tensor."""
    sync, first = HFEngine.sync_weights, {}

    def stale_sync(self, weights, version):
        sync(self, weights, version)
        module = copy.deepcopy(self.model)
        name, tensor = next((n, t) for n, t in module.named_parameters() if name_part in n)
        first.setdefault(name, tensor.detach().clone())
        with torch.no_grad():
            tensor.copy_(first[name])
        self.model = module

    monkeypatch.setattr(HFEngine, "sync_weights", stale_sync)
    return first


def _train(nano_dir, tmp_path) -> str:
    """A 3-step run whose reward always differs within a group (so every step trains and measures the gap)."""
    (tmp_path / "spread.py").write_text(SPREAD)
    out = tmp_path / "run"
    assert main(["train", "--model", nano_dir, "--out", str(out), "max_steps=3",
                 f"rewards=[{tmp_path / 'spread.py'}:spread]", *SMALL]) == 0
    return out


def test_a_sync_that_leaves_one_tensor_stale_is_named_by_the_next_step(nano_dir, tmp_path, monkeypatch, capsys):
    stale = _leave_one_tensor_stale(monkeypatch, "layers.0.mlp.down_proj")
    out = _train(nano_dir, tmp_path)
    err = capsys.readouterr().err
    assert list(stale) == ["model.layers.0.mlp.down_proj.weight"]
    k3 = {r["step"]: r["mismatch/k3"] for r in read_metrics(out)[1:]}
    assert k3[1] < 1e-9 and k3[2] < 1e-9  # sampled with the weights the learner holds (the start; update 1's)
    assert "health: step 1: sync_gap" not in err and "health: step 2: sync_gap" not in err
    assert "health: step 3: sync_gap: the engine's log-probs differ from the learner's right after the weight sync" \
        in err and k3[3] > 1e-8  # update 2 did not reach the engine's down_proj of layer 0
    main(["doctor", str(out)])
    assert "sync_gap" in capsys.readouterr().out


def test_a_fresh_sync_is_never_named(nano_dir, tmp_path, capsys):
    out = _train(nano_dir, tmp_path)
    assert "sync_gap" not in capsys.readouterr().err
    assert all(r["mismatch/k3"] < 1e-9 for r in read_metrics(out)[1:])
