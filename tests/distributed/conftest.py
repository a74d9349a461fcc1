"""Shared helpers of the distributed tests: ``ranks.py`` (rank programs run in spawned processes) is
imported by name, so this directory goes on sys.path (spawned children inherit it)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
