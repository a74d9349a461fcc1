"""Weight sources: every engine loads from any of them, and a copy of the policy takes them tensor by tensor."""

import copy

import pytest
import torch

from grpoplus.models.tiny import tiny_model
from grpoplus.rollout import HFEngine, SamplingParams
from grpoplus.rollout.weights import InProcess, StateDict, as_source, load_into, snapshot, tensors


def two_policies(tok):
    """A policy and a differently initialised copy of the same architecture."""
    return tiny_model(tok, size="nano", seed=0), tiny_model(tok, size="nano", seed=1)


def test_load_into_copies_every_tensor_in_place(tok):
    learner, copy_ = two_policies(tok)
    storage = {name: t.data_ptr() for name, t in copy_.state_dict().items()}
    assert load_into(copy_, StateDict(learner.state_dict())) is copy_
    for name, t in copy_.state_dict().items():
        assert torch.equal(t, learner.state_dict()[name]), name
        assert t.data_ptr() == storage[name], f"{name} was replaced, not copied into"


def test_a_module_is_its_own_source_and_loads_into_itself_unchanged(tok):
    learner, _ = two_policies(tok)
    source = as_source(learner)
    assert isinstance(source, InProcess) and source.module is learner
    before = copy.deepcopy(learner.state_dict())
    load_into(learner, learner)
    assert all(torch.equal(before[k], v) for k, v in learner.state_dict().items())
    with pytest.raises(TypeError, match="module or a grpoplus.rollout.weights source"):
        as_source({"weight": torch.zeros(1)})


def test_a_snapshot_keeps_the_version_it_was_taken_at(tok):
    learner, copy_ = two_policies(tok)
    taken = snapshot(learner)
    name, first = next(iter(learner.state_dict().items()))
    expected = first.clone()
    with torch.no_grad():
        first.add_(1.0)  # the learner goes on training
    assert torch.equal(dict(tensors(taken))[name], expected)
    load_into(copy_, taken)
    assert torch.equal(copy_.state_dict()[name], expected)


def test_mismatched_weights_are_refused_in_one_line(tok):
    learner, copy_ = two_policies(tok)
    weights = learner.state_dict()
    name = next(iter(weights))
    with pytest.raises(ValueError, match="lacks: both sides must load the same learner.model"):
        load_into(copy_, StateDict({**weights, "extra.weight": torch.zeros(2)}))
    with pytest.raises(ValueError, match=f"lack 1 of .*{name}"):
        load_into(copy_, StateDict({k: v for k, v in weights.items() if k != name}))
    with pytest.raises(ValueError, match="has shape"):  # copy_ would broadcast it silently
        load_into(copy_, StateDict({**weights, name: weights[name][:1]}))


def test_the_hf_engine_samples_the_same_from_any_source(tok):
    # An engine built on its own copy and synced from a state dict samples exactly what an engine sampling with the
    # learner's module itself samples.
    learner, copy_ = two_policies(tok)
    params = SamplingParams(n=2, max_new_tokens=6)
    shared, own = HFEngine(learner, tok), HFEngine(copy_, tok)
    own.sync_weights(StateDict({k: v.clone() for k, v in learner.state_dict().items()}), version=4)
    a = shared.generate(["12+3=", "9="], params, generator=torch.Generator().manual_seed(0))
    b = own.generate(["12+3=", "9="], params, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logp_roll, b.logp_roll)
    assert b.policy_version == 4 and own.base is copy_
