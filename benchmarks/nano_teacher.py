"""The student and teacher of tests/teacher/test_local_teacher.py saved as Hugging Face model directories.

    python benchmarks/nano_teacher.py /tmp/nano      # /tmp/nano/student and /tmp/nano/teacher

The student is the built-in nano model, untrained, seed 0; the teacher is the nano model of seed 1 with its final
norm scaled by 8 (unlike the student, and far more certain). ``docs/results/distillation.md`` distils one into the
other with ``benchmarks/seeds.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer


def save(folder: Path) -> None:
    tok = char_tokenizer()
    student, teacher = tiny_model(tok, size="nano", seed=0), tiny_model(tok, size="nano", seed=1)
    with torch.no_grad():
        teacher.model.norm.weight.mul_(8.0)
    for name, model in (("student", student), ("teacher", teacher)):
        model.save_pretrained(folder / name)
        tok.save_pretrained(folder / name)
        print(folder / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    save(parser.parse_args().folder)


if __name__ == "__main__":
    main()
