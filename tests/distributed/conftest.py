"""Shared helpers of the distributed tests: ``ranks.py`` (rank programs run in spawned processes) is
imported by name, so this directory goes on sys.path (spawned children inherit it)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def ray_instance():
    """A local Ray instance of 2 CPUs for the module's tests (the module has skipped without ray)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test of this directory on one thread."""
