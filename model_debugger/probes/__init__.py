"""Isolate: one probe per module; importing this package registers them all."""

from . import (  # noqa: F401 - registration side effects
    batch_memory,
    class_imbalance,
    constant_baseline,
    data_volume,
    dataloader_throughput,
    dead_units,
    detached_output,
    distribution_shift,
    eval_mode,
    feature_scaling,
    gradient_flow,
    graph_retention,
    hardware,
    label_alignment,
    late_onset,
    leakage,
    lint,
    loss_output_mismatch,
    lr_range,
    missing_zero_grad,
    optimizer_recreated,
    overfit_small_batch,
    seed_variance,
)
from .base import (
    GENERIC_SUGGESTION,
    PROBES,
    Probe,
    ProbeContext,
    probes_for,
    rank,
    register,
    run_probes,
    suggestion_for,
)
from .report import SHARED, Measured, ProbeReport, ProbeResult

__all__ = ["GENERIC_SUGGESTION", "PROBES", "SHARED", "Measured", "Probe", "ProbeContext",
           "ProbeReport", "ProbeResult", "probes_for", "rank", "register", "run_probes",
           "suggestion_for"]
