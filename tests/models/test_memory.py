"""Model loading refuses, in one line and before reading any weight, what cannot work: a dir that is not a
model, a model too large for the memory available, a chat task on a tokenizer without a chat template."""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import LlamaConfig

from grpoplus.assemble.factories import build_task_and_model
from grpoplus.config import build_config
from grpoplus.models import memory
from grpoplus.models.footprint import MARGIN, Footprint, need_bytes
from grpoplus.models.load import load_policy
from grpoplus.models.sizes import KNOWN, ModelSize
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.plan import resolve


@pytest.fixture
def writable_nano_dir(tmp_path) -> Path:
    """A nano model directory of the test's own (the tests break it)."""
    tok = char_tokenizer()
    tiny_model(tok, size="nano").save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    return tmp_path


def test_hf_parameter_count_is_the_models_own(writable_nano_dir):
    model = tiny_model(char_tokenizer(), size="nano")
    assert memory.hf_parameter_count(writable_nano_dir) == sum(p.numel() for p in model.parameters())


def test_gguf_parameter_count_reads_the_header(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    file = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(file), "llama")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bc", "<eos>"])  # an array of strings to skip
    writer.add_uint32("llama.block_count", 2)
    writer.add_tensor("token_embd.weight", np.zeros((7, 5), dtype=np.float32))
    writer.add_tensor("blk.0.ffn_up.weight", np.zeros((3, 4, 2), dtype=np.float16))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        step()
    writer.close()
    assert memory.gguf_parameter_count(file) == 7 * 5 + 3 * 4 * 2
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all, not at all")
    with pytest.raises(ValueError, match="not a readable GGUF"):
        memory.gguf_parameter_count(tmp_path / "bad.gguf")


def test_the_load_check_counts_weights_grads_adam_and_the_samplers_copy():
    # 1M fp32 parameters of an unknown architecture: full fine-tuning holds weights + grads + 2 Adam moments
    # = 16 bytes each, x 1.25 margin = 20 MB; LoRA the base weights alone (adapters unknown) = 5 MB; the hf engine
    # sampling in the same process on a CPU adds oneDNN's reordered copy of the (here: all) weights, 4 bytes each
    size = ModelSize("m", 1_000_000, "a test")
    assert need_bytes(Footprint(), size) == 20_000_000
    assert need_bytes(Footprint(lora_rank=8), size) == 5_000_000
    assert need_bytes(Footprint(engine="hf"), size) == 25_000_000
    assert need_bytes(Footprint(engine="hf", on_gpus=True), size) == 20_000_000  # no reordering on a GPU
    # a 4-bit base is quantised where it loads: the whole model as loaded (fp32) comes first
    smol = KNOWN["SmolLM2-135M-Instruct"].arch
    smollm2 = ModelSize("smollm2", smol.parameters(), "a test", smol)
    assert need_bytes(Footprint(lora_rank=8, quantize="nf4"), smollm2) == int(smol.parameters() * 4 * MARGIN)


def test_a_model_too_large_for_the_memory_is_refused_before_loading(writable_nano_dir):
    # A 70B-class config next to the nano weights: the estimate must stop it before any weight is read.
    big = LlamaConfig(vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                      num_attention_heads=64, num_key_value_heads=8)
    (writable_nano_dir / "config.json").write_text(big.to_json_string())
    with pytest.raises(ValueError, match=r"6\d\.\d\dB parameters: full fine-tuning .* GB is available .*lora_rank"):
        load_policy(str(writable_nano_dir))
    with pytest.raises(ValueError, match=r"LoRA needs about .*\(base weights, LoRA adapters;"):
        load_policy(str(writable_nano_dir), footprint=Footprint(lora_rank=16))


def test_dirs_that_are_not_models_are_named(writable_nano_dir):
    (writable_nano_dir / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="has config.json but no weights"):
        load_policy(str(writable_nano_dir))
    tiny_model(char_tokenizer(), size="nano").save_pretrained(writable_nano_dir)
    (writable_nano_dir / "config.json").write_text("{ not json")
    with pytest.raises(ValueError, match="config.json is not readable JSON"):
        load_policy(str(writable_nano_dir))
    (writable_nano_dir / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(ValueError, match="is a 'no-such-architecture' model, an architecture transformers"):
        load_policy(str(writable_nano_dir))
    (writable_nano_dir / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": "wide"}))
    with pytest.raises(ValueError, match="config.json is not a usable model config"):
        load_policy(str(writable_nano_dir))


def test_chat_task_needs_a_tokenizer_with_a_chat_template(writable_nano_dir, tmp_path):
    common = [f"out={tmp_path / 'run'}", "task=wordproblems"]
    with pytest.raises(ValueError, match="pass --model"):  # the built-in tiny model: refused before its warm start
        build_task_and_model(resolve(build_config(overrides=common)))
    with pytest.raises(ValueError, match="has no chat template"):
        build_task_and_model(resolve(build_config(overrides=[*common, f"model={writable_nano_dir}"])))
    task, train, *_ = build_task_and_model(resolve(build_config(overrides=[*common, f"model={writable_nano_dir}",
                                                                           "chat_template=false"])))
    assert train[0].prompt.endswith("'#### <number>'.")  # the raw question, as asked


_KEEP_OR_GIVE_BACK = """
import sys, torch
from grpoplus.models.memory import give_back_freed_memory
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
big = torch.ones(24 << 18)  # 24 MiB, mapped and freed: glibc then keeps blocks below 24 MiB in its heap
del big
before = rss()
blocks, pins = [], []
for _ in range(100):  # 100 x 2 MiB, touched, each followed by a small block that stays: holes when they go
    blocks.append(torch.ones(1 << 19))
    pins.append(torch.ones(1 << 14))
del blocks
if sys.argv[1] == "given back":
    assert give_back_freed_memory()
print((rss() - before) / 2**20)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim")
@pytest.mark.parametrize("mode", ["kept", "given back"])
def test_freed_tensors_go_back_to_the_system_when_given_back(mode):
    out = subprocess.run([sys.executable, "-c", _KEEP_OR_GIVE_BACK, mode], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-2000:]
    kept_mib = float(out.stdout.split()[-1])
    if mode == "kept":
        assert kept_mib > 150  # glibc keeps the freed 200 MiB
    else:
        assert kept_mib < 20


def test_sharded_training_state_counts_its_share_per_rank():
    size = ModelSize("m", 1_000_000, "a test")
    whole, eight = need_bytes(Footprint(), size), need_bytes(Footprint(shards=8, whole_copy=True), size)
    # rank 0's whole copy (what the engines and checkpoints read) + a shard of weights, gradients and AdamW's moments
    assert eight == int(1_000_000 * 4 * (1 + 4 / 8) * MARGIN) < whole
    assert need_bytes(Footprint(shards=8), size) == int(1_000_000 * 4 * 4 / 8 * MARGIN)  # ranks 1-7
    assert need_bytes(Footprint(trains=False), size) == int(4_000_000 * MARGIN)
