import dataclasses
from pathlib import Path

from grpoplus.metrics import CHECKS, DoctorThresholds, threshold_docs

DOC = Path(__file__).resolve().parents[2] / "README.md"


def test_docs_table_lists_every_threshold_with_its_default_and_doc():
    text = DOC.read_text()
    docs = threshold_docs()
    for f in dataclasses.fields(DoctorThresholds):
        assert f"| `{f.name}` | {f.default} | {docs[f.name]} |" in text, f.name


def test_docs_describe_every_finding_code():
    text = DOC.read_text()
    for code in CHECKS.names():
        assert f"| `{code}` |" in text, code
