"""The documentation site: it builds with ``mkdocs build --strict`` (a broken link or anchor fails it), its
Reference pages list every registry entry and every config key of the code, README is a landing page whose
links resolve, and the built front page renders in a real headless browser (Debian's chromium)."""

import dataclasses
import functools
import html
import http.server
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

pytest.importorskip("mkdocs", reason="the documentation site needs mkdocs-material: pip install -e '.[test]'")
pytest.importorskip("material", reason="the documentation site needs mkdocs-material: pip install -e '.[test]'")


def _hooks():
    spec = importlib.util.spec_from_file_location("grpoplus_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=config.parent, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    start = time.perf_counter()
    result = _mkdocs_build(ROOT / "mkdocs.yml", out)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    print(f"mkdocs build --strict: {seconds:.1f} s")
    return out


def _page(site: Path, path: str) -> str:
    return (site / path / "index.html").read_text()


def test_validation_turns_a_broken_anchor_and_a_missing_page_into_build_errors(tmp_path):
    """The project's own `validation:` and `strict:` settings, on a two-page site with a broken anchor and link."""
    import yaml

    settings = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\n[there](other.md#no-such-heading) [gone](missing.md)\n")
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## A heading\n")
    config = {"site_name": "t", "strict": settings["strict"], "validation": settings["validation"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    result = _mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "does not contain an anchor '#no-such-heading'" in result.stderr
    assert "'missing.md'" in result.stderr


@pytest.mark.slow
def test_the_configuration_reference_lists_every_key_with_its_section_and_default(site):
    from grpoplus.config import SECTIONS

    page = html.unescape(_page(site, "reference/config"))
    for section, cls in SECTIONS.items():
        assert f'id="{section}"' in page, section
        for f in dataclasses.fields(cls):
            assert f"<code>{section}.{f.name}</code>" in page, f"{section}.{f.name}"
    rows = re.findall(r"<tr>\s*<td><code>(\w+)\.(\w+)</code></td>", page)
    assert len(rows) == sum(len(dataclasses.fields(cls)) for cls in SECTIONS.values())


def test_the_registries_reference_lists_every_entry_of_every_registry(site):
    from grpoplus.core.registry import Registry

    hooks = _hooks()
    listed = hooks.registries()
    # every Registry object of an imported grpoplus module is on a page (presets: the presets page)
    found = {id(obj): f"{name}.{attr}" for name, module in list(sys.modules.items()) if name.startswith("grpoplus")
             for attr, obj in vars(module).items() if isinstance(obj, Registry)}
    from grpoplus.algo import PRESETS

    assert set(found) == {id(registry) for *_, registry in listed} | {id(PRESETS)}, found
    registries_page = html.unescape(_page(site, "reference/registries"))
    doctor_page = html.unescape(_page(site, "reference/doctor"))
    for title, _, attr, _, registry in listed:
        page = doctor_page if attr == "CHECKS" else registries_page
        assert title in page
        assert registry.names(), attr
        for name in registry.names():
            if not getattr(registry.get(name), "__module__", "grpoplus").startswith("grpoplus"):
                continue  # registered by another test of this session: the site is built in a fresh process
            assert f"<td><code>{name}</code></td>" in page, (attr, name)
            assert hooks.summary(registry.get(name))  # a docstring (or a lab experiment's title)


def test_the_presets_page_states_every_preset_as_describe_does(site):
    from grpoplus.algo import PRESETS
    from grpoplus.algo.presets import describe

    page = html.unescape(_page(site, "reference/presets"))
    text = re.sub(r"<[^>]+>", "", page)
    for name in PRESETS.names():
        assert f"<td><code>{name}</code></td>" in page, name
        assert describe(name).split(": ", 1)[1] in text, name


def test_the_doctor_page_lists_every_check_and_threshold_with_its_default_and_doc(site):
    from grpoplus.metrics import CHECKS, DoctorThresholds, threshold_docs

    page = html.unescape(_page(site, "reference/doctor"))
    docs = threshold_docs()
    for f in dataclasses.fields(DoctorThresholds):
        assert f"<td><code>{f.name}</code></td>\n<td>{f.default}</td>\n<td>{docs[f.name]}</td>" in page, f.name
    for code in CHECKS.names():
        assert f"<td><code>{code}</code></td>" in page, code


def test_the_rules_page_lists_every_config_rule_in_order(site):
    from grpoplus.config.rules import RULES

    page = html.unescape(_page(site, "reference/rules"))
    places = [page.index(f"<td><code>{r.name}</code></td>") for r in RULES]
    assert places == sorted(places) and all(r.what and r.what in page for r in RULES)


def test_the_configuration_page_names_every_section():
    from grpoplus.config import SECTIONS

    text = (DOCS / "getting-started" / "configuration.md").read_text()
    first = text[:text.index("A run starts from a preset")]
    assert [name for name in SECTIONS if f"`{name}`" not in first] == []


def test_generated_tables_in_hand_written_pages(site):
    from grpoplus.core.packages import OPTIONAL_PACKAGES

    start = html.unescape(_page(site, "getting-started"))
    for module, (_, pip) in OPTIONAL_PACKAGES.items():
        assert f"<td><code>{module}</code></td>" in start and pip in start, module
    lora = html.unescape(_page(site, "how-to/lora"))
    for key in ("learner.lora_rank", "learner.lora_alpha", "learner.lora_dropout", "learner.lora_target_modules"):
        assert f"<td><code>{key}</code></td>" in lora, key
    for path in DOCS.rglob("*.md"):  # every placeholder was replaced
        built = site / path.relative_to(DOCS).with_suffix("") / "index.html"
        if path.name == "index.md":
            built = site / path.relative_to(DOCS).parent / "index.html"
        assert "<!-- config-keys" not in built.read_text() and "<!-- optional-packages" not in built.read_text(), path


STAMP = re.compile(r"^> \*\*(?:.*\. )?Machine:\*\* .+ · \*\*Date:\*\* .+ · \*\*Commit:\*\* (?:not recorded "
                   r"\(first in the README at `[0-9a-f]{7}`.*\)|.*`[0-9a-f]{7}`.*)$", re.M)


def test_every_table_and_figure_of_the_results_pages_is_stamped_with_its_machine_and_date():
    pages = sorted(p for p in (DOCS / "results").glob("*.md") if p.name != "index.md")
    assert len(pages) >= 10
    for path in pages:
        text = path.read_text()
        assert STAMP.search(text), path.name
        for section in re.split(r"^## ", text, flags=re.M):
            if re.search(r"^\|---|^!\[", section, re.M):
                assert STAMP.search(section), (path.name, section.splitlines()[0])


def test_every_commit_stamp_names_commits_of_this_repository():
    """A stamp's commit is a commit id git knows (not a branch name, which moves), or says it was not recorded."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    stamps = [(path, line) for path in [README, *DOCS.rglob("*.md")] for line in path.read_text().splitlines()
              if "**Commit:**" in line and "YYYY-MM-DD" not in line]  # results/index.md's template aside
    assert len(stamps) >= 30
    for path, line in stamps:
        stamp = line.split("**Commit:**", 1)[1]
        ids = re.findall(r"`([0-9a-f]{7,40})`", stamp)
        assert ids or "not recorded" in stamp, (path.name, stamp)
        for commit in ids:
            known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
            assert known.returncode == 0, (path.name, commit, stamp)


def test_readme_is_a_landing_page_whose_links_resolve():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) < 250, len(lines)
    assert lines[2:6] == ["```bash",
                          "pip install torch==2.13.0 && pip install -e . && grpoplus train --preset dapo --task arithmetic"
                          " --out runs/demo",
                          "pip install torch==2.13.0 && pip install -e '.[test]' && python -m pytest -n auto --dist loadgroup",
                          "```"]
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), target
    from grpoplus.algo import PRESETS

    table = text[text.index("## Presets and their papers"):text.index("## Where it runs")]
    for name in PRESETS.names():
        assert f"`{name}`" in table, name
    for where in ("CPU", "GPU", "vLLM", "Ray"):
        assert f"\n| {where} |" in text, where


def test_the_python_quick_start_on_the_site_is_the_readme_one():
    def quick_start(text: str) -> str:
        section = text[text.index("## Training from Python"):] if "## Training from Python" in text else text
        return re.search(r"```python\n(.*?)```", section, re.S).group(1)

    assert quick_start((DOCS / "getting-started" / "python.md").read_text()) == quick_start(README.read_text())


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if found := shutil.which(name):
            return found
    return None


@pytest.mark.skipif(_chromium() is None, reason="no chromium binary found (Debian: apt-get install -y chromium; "
                                                  ".ci/run installs it when it runs as root)")
def test_the_front_page_renders_in_a_headless_browser(site, tmp_path):
    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    browser = [_chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}"]
    try:
        dom = subprocess.run([*browser, "--virtual-time-budget=5000", "--dump-dom", url],
                             capture_output=True, text=True, timeout=120)
        shot = subprocess.run([*browser, f"--screenshot={tmp_path / 'front.png'}", "--window-size=1280,900", url],
                              capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    assert 'class="md-header' in page  # Material's header
    title = re.search(r'<span class="md-ellipsis">\s*(.*?)\s*</span>', page, re.S)
    assert title and title.group(1) == "grpoplus", title and title.group(1)
    assert re.search(r'<h1 id="grpoplus">grpoplus<a class="headerlink"', page)  # the page's first heading
    html_tag = re.search(r"<html[^>]*>", page).group(0)
    assert "no-js" not in html_tag and " js" in html_tag, html_tag  # Material's scripts ran (the built file says no-js)
    assert shot.returncode == 0, shot.stderr[-2000:]
    png = (tmp_path / "front.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_the_architectures_page_lists_every_family_and_its_paths(site):
    from grpoplus.learner.packing import PACKED_MODEL_TYPES
    from grpoplus.models.families import FAMILIES, VLLM

    page = html.unescape(_page(site, "reference/architectures"))
    for name in FAMILIES:
        cells = page[page.index(f"<td><code>{name}</code></td>"):].split("</tr>")[0].split("<td>")[1:]
        assert cells[-1].startswith(VLLM[name]), name
        head = cells[2]  # the learner's LM head: chunked unless a scale or soft-cap follows it
        assert head.startswith("chunked") == (name not in ("granite", "granitemoehybrid", "gemma3_text", "gemma4_text"))
        assert cells[4].startswith("packed") == (name in PACKED_MODEL_TYPES), name  # the matrix's packing verdict
