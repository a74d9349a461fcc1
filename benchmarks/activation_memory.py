"""What a training forward keeps for its backward, per token, against the activation model of
``learner.micro_batch_size=auto`` (:func:`grpoplus.models.footprint.activation_bytes_per_token`).

Each shape is a Llama-style decoder of two layers with a well-known model's layer widths (the per-token bytes of one
layer do not depend on the depth). The learner's own forward (:func:`grpoplus.learner.logprobs.logprobs_of`) runs
with autograd's saved-tensor hooks counting every tensor kept for the backward (the weights aside), at two row counts;
their difference over the tokens added is what a token keeps, the head's fixed share aside. The model must bound it
(ratio >= 1) without wasting much memory (ratio near 1)::

    python benchmarks/activation_memory.py                       # CPU: float32 and bfloat16 autocast
    python benchmarks/activation_memory.py --device cuda         # a GPU (its SDPA kernels keep what they keep)

One JSON line per shape and precision, then a summary line (the smallest and largest ratio); ``--record [DIR]``
stores them as a record (:mod:`records`). Runs in seconds.
"""

from __future__ import annotations

import argparse
import json

import torch
from records import add_record_argument, store
from transformers import LlamaConfig, LlamaForCausalLM

from grpoplus.learner.logprobs import logprobs_of
from grpoplus.models.footprint import activation_bytes_per_token
from grpoplus.models.sizes import arch_from_config

SHAPES = {  # name -> (hidden, intermediate, heads, kv heads): the layer widths of well-known models
    "tiny": (128, 384, 4, 2), "smollm2-135m": (576, 1536, 9, 3), "qwen2.5-0.5b": (896, 4864, 14, 2),
    "qwen2.5-1.5b": (1536, 8960, 12, 2),
}
ROWS, WIDTH = (2, 4), 64  # two row counts of prompt + response, WIDTH tokens each half


def kept_bytes(model, rows: int, device: str, precision: str) -> int:
    """Bytes of the tensors autograd keeps for the backward of one training forward of ``rows`` rows."""
    kept, weights = {}, {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(3, model.config.vocab_size, (rows, WIDTH), generator=torch.Generator().manual_seed(0)).to(device)
    mask = torch.ones_like(ids)
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16_mixed")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        logprobs_of(model, ids, mask, ids, mask, temperature=1.0)
    return sum(size for ptr, size in kept.items() if ptr not in weights)


def measure(name: str, device: str, precision: str) -> dict:
    hidden, intermediate, heads, kv_heads = SHAPES[name]
    config = LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device).train()
    small, large = (kept_bytes(model, rows, device, precision) for rows in ROWS)
    counted = (large - small) / ((ROWS[1] - ROWS[0]) * 2 * WIDTH)
    modelled = activation_bytes_per_token(arch_from_config(config.to_dict()), precision, checkpointing=False)
    return {"shape": name, "device": device, "precision": precision, "layers": 2, "counted_bytes_per_token": counted,
            "model_bytes_per_token": modelled, "ratio": round(modelled / counted, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    add_record_argument(parser)
    args = parser.parse_args()
    records = [measure(name, args.device, precision) for name in args.shapes.split(",")
               for precision in ("fp32", "bf16_mixed")]
    for record in records:
        print(json.dumps(record))
    ratios = [r["ratio"] for r in records]
    summary = {"summary": "activation model / counted bytes per token", "device": args.device,
               "min_ratio": min(ratios), "max_ratio": max(ratios), "bounds": min(ratios) >= 1.0}
    print(json.dumps(summary))
    store("activation_memory", {"rows": records, "summary": summary}, args.record, args.device)


if __name__ == "__main__":
    main()
