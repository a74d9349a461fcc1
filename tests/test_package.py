"""The wheel built from the checkout holds the whole package, and its version is grpoplus.__version__.

The wheel is built from a copy of pyproject.toml, README.md and grpoplus/ (the checkout stays free of
build/), with the setuptools of this environment: no download. .ci/run then installs such a wheel into
a fresh virtualenv and runs the main job from outside the checkout.
"""

import email
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import grpoplus

ROOT = Path(__file__).resolve().parents[1]


def _backend_ok() -> bool:
    needs = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for req in map(Requirement, needs):
        try:
            have = version(req.name)
        except Exception:
            return False
        if not req.specifier.contains(have, prereleases=True):
            return False
    return True


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    if not _backend_ok():
        pytest.skip("the build backend of pyproject.toml's [build-system] is not installed here")
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "grpoplus", src / "grpoplus", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path_factory.mktemp("dist")
    build = ("import sys, setuptools.build_meta as backend; "
             "print(backend.build_wheel(sys.argv[1]))")
    run = subprocess.run([sys.executable, "-c", build, str(dist)], cwd=src, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-4000:]
    name = run.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(dist / name) as whl:
        yield whl


def _package_files() -> set[str]:
    """Every file of grpoplus/ in the checkout (modules and anything the code reads), as wheel paths."""
    return {path.relative_to(ROOT).as_posix() for path in (ROOT / "grpoplus").rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}


def test_the_wheel_holds_every_file_of_the_package(wheel):
    names = set(wheel.namelist())
    files = _package_files()
    assert any(f.startswith("grpoplus/teacher/") for f in files)  # subpackages are walked
    missing = sorted(files - names)
    assert not missing, f"not in the wheel: {missing}"
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "docs/"))]


def test_the_wheel_version_is_the_package_version_and_it_names_the_command(wheel):
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    fields = email.message_from_bytes(wheel.read(meta))
    assert fields["Name"] == "grpoplus"
    assert fields["Version"] == grpoplus.__version__
    assert meta == f"grpoplus-{grpoplus.__version__}.dist-info/METADATA"
    entry = wheel.read(meta.replace("METADATA", "entry_points.txt")).decode()
    assert "grpoplus = grpoplus.entry.cli:entry" in entry  # cli.entry: main, then the exit (see its docstring)
