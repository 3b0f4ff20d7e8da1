"""What the probes return: one probe's :class:`ProbeResult`, the run's :class:`ProbeReport`.

Besides findings, a probe may measure a quantity other phases use: the seed-noise band Verify
compares against (``seed_variance``), the learning-rate bracket of the sweep (``lr_range``).
Such a quantity is a declared field of :class:`Measured`; the probe returns it in its
:class:`ProbeResult` and :func:`~model_debugger.probes.run_probes` carries it into the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..records import Finding


@dataclass(frozen=True, kw_only=True)
class Measured:
    """Quantities a probe measured for the phases after Isolate (None: not measured).

    Attributes
    ----------
    seed_noise : dict or None
        ``{"mean", "std", "cv", "finals"}``: final losses of short trainings that differ only in
        the seed (``seed_variance``); Verify widens its noise band by ``cv``.
    lr_range : dict or None
        ``{"best_lr", "diverge_lr", "safe_lr"}`` of a learning-rate sweep (``lr_range``).
    learnable : dict or None
        ``{"reference", "metric", "score", "model_score", "rows"}``: an independent learner's
        held-out score on the kept rows against the run's own (``reference_learner``): whether
        the data holds more than the model learned.
    """

    seed_noise: dict | None = None
    lr_range: dict | None = None
    learnable: dict | None = None


# the names of the shared quantities, declared once (the fields of Measured)
SHARED: tuple[str, ...] = tuple(f.name for f in fields(Measured))


@dataclass(frozen=True, kw_only=True)
class ProbeResult(Measured):
    """What one probe's ``run`` returns when it measured a shared quantity too.

    A probe that only finds things may return a plain list of findings instead.

    Attributes
    ----------
    findings : tuple of Finding
    """

    findings: tuple[Finding, ...] = ()

    @classmethod
    def of(cls, returned) -> ProbeResult:
        """A probe's return value (a ProbeResult or a list of findings) as a ProbeResult."""
        return returned if isinstance(returned, ProbeResult) else cls(findings=tuple(returned))


@dataclass(frozen=True, kw_only=True)
class ProbeReport(Measured):
    """The probes' results for one context: ranked findings, timings, shared measurements.

    Attributes
    ----------
    findings : tuple of Finding
        Ranked: confirmed first, then by category order, then by strength.
    probe_seconds : dict
        ``{probe id: seconds}`` for every probe that ran.
    seed_noise, lr_range, learnable : dict or None
        See :class:`Measured`.
    """

    findings: tuple[Finding, ...] = ()
    probe_seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        """The report as JSON-ready data (every field; findings as their JSON)."""
        return {"findings": [f.to_json() for f in self.findings],
                "probe_seconds": dict(self.probe_seconds),
                **{name: getattr(self, name) for name in SHARED}}

    @classmethod
    def from_json(cls, data: dict) -> ProbeReport:
        """The report from :meth:`to_json`'s data (raises RecordError outside the vocabulary)."""
        return cls(findings=tuple(Finding.from_json(f) for f in data.get("findings", ())),
                   probe_seconds=dict(data.get("probe_seconds") or {}),
                   **{name: data.get(name) for name in SHARED})
