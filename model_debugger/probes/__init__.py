"""Isolate: one probe per module; importing this package registers them all.

Every module here whose name does not start with ``_`` (except the framework modules ``base``,
``report`` and ``suggestions``) is a probe and is imported in name order, so adding a probe is adding one file.
"""

import importlib as _importlib
import pkgutil as _pkgutil

from .base import (
    GENERIC_SUGGESTION,
    PROBES,
    Probe,
    ProbeContext,
    probes_for,
    rank,
    register,
    run_probes,
)
from .report import SHARED, Measured, ProbeReport, ProbeResult
from .suggestions import suggestion_for

FRAMEWORK_MODULES = ("base", "report", "suggestions")

for _module in _pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_") and _module.name not in FRAMEWORK_MODULES:
        _importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["GENERIC_SUGGESTION", "PROBES", "SHARED", "Measured", "Probe", "ProbeContext",
           "ProbeReport", "ProbeResult", "probes_for", "rank", "register", "run_probes",
           "suggestion_for"]
