import dataclasses
import importlib.util
from pathlib import Path

from grpoplus.metrics import CHECKS, DoctorThresholds, threshold_docs

ROOT = Path(__file__).resolve().parents[2]


def _written_docs() -> str:
    """The hand-written documentation: the site's pages (docs/) plus any NOTES-*.md a branch keeps until its text
    is merged into them."""
    return "\n".join(p.read_text() for p in [*sorted((ROOT / "docs").rglob("*.md")), *sorted(ROOT.glob("NOTES-*.md"))])


def _doctor_reference() -> str:
    """The site's generated doctor page (docs/hooks.py builds it from the code at every site build)."""
    spec = importlib.util.spec_from_file_location("grpoplus_docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks.doctor_page()


def test_docs_table_lists_every_threshold_with_its_default_and_doc():
    text = _doctor_reference()
    docs = threshold_docs()
    for f in dataclasses.fields(DoctorThresholds):
        assert f"| `{f.name}` | {f.default} | {docs[f.name]} |" in text, f.name


def test_docs_describe_every_finding_code():
    """The findings table of docs/concepts/run-health.md (written by hand: severity, when it fires, the fix)."""
    text = _written_docs()
    for code in CHECKS.names():
        assert f"| `{code}` |" in text, code
