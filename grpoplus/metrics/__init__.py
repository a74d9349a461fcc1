"""Run health: per-step metrics on disk (and in TensorBoard or an experiment tracker), the
report/compare plots, and the run doctor.

Importing this package is cheap: matplotlib, TensorBoard and the trackers are imported only
by the functions that draw or write to them.
"""

from .checks import CHECKS, DoctorThresholds, Finding, threshold_docs
from .doctor import LiveDoctor, batch_info_from_config, diagnose, parse_thresholds
from .loggers import LOGGERS, Logger, require_loggers
from .writer import METRICS_FILE, MetricsWriter, read_metrics

__all__ = [
    "CHECKS",
    "DoctorThresholds",
    "Finding",
    "LOGGERS",
    "LiveDoctor",
    "Logger",
    "METRICS_FILE",
    "MetricsWriter",
    "batch_info_from_config",
    "diagnose",
    "parse_thresholds",
    "read_metrics",
    "require_loggers",
    "threshold_docs",
]
