import dataclasses
from pathlib import Path

from grpoplus.metrics import CHECKS, DoctorThresholds, threshold_docs

ROOT = Path(__file__).resolve().parents[2]


def _docs() -> str:
    """README.md plus any NOTES-*.md a branch keeps until its text is merged into it."""
    return "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted(ROOT.glob("NOTES-*.md"))])


def test_docs_table_lists_every_threshold_with_its_default_and_doc():
    text = _docs()
    docs = threshold_docs()
    for f in dataclasses.fields(DoctorThresholds):
        assert f"| `{f.name}` | {f.default} | {docs[f.name]} |" in text, f.name


def test_docs_describe_every_finding_code():
    text = _docs()
    for code in CHECKS.names():
        assert f"| `{code}` |" in text, code
