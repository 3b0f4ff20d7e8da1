"""``batch_memory``: memory per sample, measured, extrapolated to the size that failed."""

from __future__ import annotations

import re

import numpy as np

from ..pitfalls.optimization import batch_that_fits
from .base import Probe, ProbeContext, register

_DTYPE_BYTES = {"float": 4, "double": 8, "half": 2, "bfloat16": 2, "int32": 4, "int64": 8,
                "int8": 1, "uint8": 1, "bool": 1, "int16": 2}
_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 1e3, "mb": 1e6,
          "gb": 1e9, "tb": 1e12}


def requested_bytes(message: str) -> float | None:
    """The allocation an OOM message names ("tried to allocate 2.00 GiB" / "... 123 bytes")."""
    m = re.search(r"allocate\s+([\d.]+)\s*(bytes|[KMGT]i?B)\b", message, re.IGNORECASE)
    if not m:  # TensorFlow: "OOM when allocating tensor with shape[1024,64] and type float"
        m = re.search(r"shape\[([\d,\s]*)\] and type (\w+)", message)
        size = _DTYPE_BYTES.get(m.group(2)) if m else None
        if size is None:
            return None
        return float(np.prod([int(d) for d in m.group(1).split(",") if d.strip()],
                             dtype=np.float64)) * size
    unit = "b" if m.group(2).lower() == "bytes" else m.group(2).lower()
    return float(m.group(1)) * _UNITS[unit]


def gpu_free_bytes(message: str) -> float | None:
    """Free device memory a CUDA OOM message reports ("... of which 1.50 GiB is free")."""
    m = re.search(r"of which\s+([\d.]+)\s*([KMGT]i?B)\s+is free", message, re.IGNORECASE)
    return float(m.group(1)) * _UNITS[m.group(2).lower()] if m else None


def available_bytes() -> float | None:
    """Memory the kernel reports available (``MemAvailable``), in bytes; None where unreadable."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@register
class BatchMemory(Probe):
    """After an out-of-memory error: activation memory per sample and the batch that fits."""

    id = "batch_memory"
    categories = ("memory_issue",)
    needs_live = True
    frameworks = ("torch", "keras")

    def suggestion(self, finding) -> str:
        """The largest batch that fits, when it was measured; else the default suggestion."""
        fits = (finding.evidence or {}).get("largest_batch_that_fits")
        if fits:
            return (f"Lower the batch size to at most {fits} (or use gradient accumulation to "
                    "keep the effective batch).")
        return super().suggestion(finding)

    def run(self, ctx: ProbeContext):
        """One finding when the run ended out of memory and a copy of the model can be measured.

        Bytes per sample are measured with one forward pass of a fresh copy; the failing allocation
        (from the error message) gives the batch it implies, the free memory the largest batch that
        fits. Confirmed when the allocation exceeds the memory available.
        """
        err = ctx.run.error
        tr = ctx.trainer
        if err is None or err.get("kind") != "oom" or tr is None or tr.n == 0:
            return []
        inputs, _ = tr.subset(slice(0, min(32, tr.n)))
        per_sample, params = tr.per_sample_bytes(inputs), tr.param_bytes()
        want = requested_bytes(err.get("message", ""))
        avail = gpu_free_bytes(err.get("message", "")) or available_bytes()
        fits = batch_that_fits(per_sample, avail, 4 * params) if avail else None
        implied = int(want / per_sample) if want else None
        usual = int(tr.n / max(len(ctx.train_batches), 1))
        return [self.finding(
            "hyperparameter", bool(want and avail and want > avail),
            f"One training sample needs about {per_sample / 2**10:.1f} KiB of activations "
            f"(measured on a batch of {len(inputs[0])}); the failing allocation of "
            f"{(want or 0) / 2**30:.3g} GiB corresponds to a batch of ~{implied or '?'} samples, "
            f"while about {fits or '?'} fit in the {(avail or 0) / 2**30:.1f} GiB available. "
            f"The batch at the failing line is far larger than the {usual} used before.",
            err.get("location") or ctx.ref("backward"), bytes_per_sample=per_sample,
            requested_bytes=want, available_bytes=avail, largest_batch_that_fits=fits,
            implied_batch=implied, strength=0.8)]
