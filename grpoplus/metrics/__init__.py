"""Run health: per-step metrics on disk, the report/compare plots, and the run doctor.

Importing this package is cheap: matplotlib and TensorBoard are imported only by the
functions that draw or write events.
"""

from .doctor import (
    CHECKS,
    DoctorThresholds,
    Finding,
    LiveDoctor,
    diagnose,
    parse_thresholds,
    threshold_docs,
)
from .writer import METRICS_FILE, MetricsWriter, read_metrics

__all__ = [
    "CHECKS",
    "DoctorThresholds",
    "Finding",
    "LiveDoctor",
    "METRICS_FILE",
    "MetricsWriter",
    "diagnose",
    "parse_thresholds",
    "read_metrics",
    "threshold_docs",
]
