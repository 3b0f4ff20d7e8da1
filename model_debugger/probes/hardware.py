"""``hardware``: failures that point at the device, not the code. Escalated, never patched.

Two measured signatures: an error whose text comes from the driver or the memory's error
correction (ECC, Xid, a GPU fallen off the bus), and a non-finite loss that does not repeat when
the same batch goes through the same weights and loss again.
"""

from __future__ import annotations

import re

from .base import Probe, ProbeContext, register

_DEVICE_ERRORS = re.compile(
    r"uncorrectable ECC|ECC error|\bXid\b|NVRM|fallen off the bus|unspecified launch failure|"
    r"hardware error|device (?:has )?(?:lost|hung)|CUDA error: (?:an )?illegal instruction|"
    r"GPU is lost|machine check", re.IGNORECASE)


@register
class Hardware(Probe):
    """Device failures: driver or ECC error text, a non-finite loss that does not replay."""

    id = "hardware"
    categories = ("*",)
    fix = ("Escalate: rerun on another device, check drivers and memory; do not patch the "
           "training code.")

    def run(self, ctx: ProbeContext):
        """A confirmed finding, to escalate, for each of the two signatures found."""
        out = []
        err = ctx.run.error
        text = f"{err.get('type', '')}: {err.get('message', '')}" if err else ""
        m = _DEVICE_ERRORS.search(text)
        if m:
            out.append(self.finding(
                "hardware", True,
                f"The run failed with a device-level error ('{m.group(0)}'): this comes from the "
                "driver or the hardware, not from the training code. Escalate (rerun on another "
                "device, check the driver/ECC logs); do not change the code for it.",
                err.get("location"), error=text[:300], escalate=True, strength=0.95))
        bad = ctx.run.first("nonfinite")
        if bad is not None and bad.get("replay") == "finite":
            out.append(self.finding(
                "hardware", True,
                f"The loss was non-finite at step {bad['step']}, but the same batch through the "
                "same weights and loss gives a finite value: the failure does not repeat "
                "deterministically. Suspect the device (memory errors, an overheating or faulty "
                "GPU) or a data race; escalate and rerun elsewhere before changing the code.",
                ctx.ref("backward"), step=bad["step"], replay="finite", escalate=True,
                strength=0.9))
        return out
