"""Tiny classifiers (a reward model, a process reward model) saved as Hugging Face directories."""

import os
import sys

import pytest
import torch
from transformers import LlamaForSequenceClassification, LlamaForTokenClassification

from grpoplus.models.tiny import tiny_config
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.rewards import verifier

# A verification worker that hangs on the answer HANG, whatever the machine (sympy's time on a power tower is not)
HANGING_WORKER = """
import json, sys, time
print("ready", flush=True)
for line in sys.stdin:
    request = json.loads(line)
    if request["pred"] == "HANG":
        time.sleep(3600)
    print(json.dumps({"equal": request["gold"] == request["pred"]}), flush=True)
"""

CLASSES = {"sequence": LlamaForSequenceClassification, "token": LlamaForTokenClassification}


def save_classifier(path, kind: str, num_labels: int, tokenizer=None, seed: int = 0) -> str:
    """A random nano Llama classifier of ``kind`` for ``tokenizer`` (default: the char tokenizer), saved in ``path``."""
    tok = tokenizer or char_tokenizer()
    config = tiny_config(len(tok), size="nano", num_labels=num_labels, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CLASSES[kind](config)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    """``classifier_dir(kind, num_labels)``: the directory of a saved nano classifier (one per kind and label count)."""
    made = {}

    def make(kind: str, num_labels: int) -> str:
        if (kind, num_labels) not in made:
            made[kind, num_labels] = save_classifier(tmp_path_factory.mktemp(f"{kind}{num_labels}"), kind, num_labels)
        return made[kind, num_labels]

    return make


@pytest.fixture
def new_classifier(tmp_path):
    """``new_classifier(name, kind, num_labels, seed=0, tokenizer=None)``: a fresh classifier directory under tmp_path
    (one no other test has loaded)."""
    return lambda name, kind, num_labels, seed=0, tokenizer=None: save_classifier(
        tmp_path / name, kind, num_labels, tokenizer, seed)


@pytest.fixture
def hanging_verifier(monkeypatch):
    """This process's math verifier, replaced by one whose worker hangs on the answer HANG."""
    hanging = verifier.MathVerifier(command=[sys.executable, "-c", HANGING_WORKER])
    monkeypatch.setitem(verifier._DEFAULTS, os.getpid(), hanging)
    yield hanging
    hanging.close()
