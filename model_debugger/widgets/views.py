"""Display objects of session results for the magics: :mod:`model_debugger.views` documents.

Every view carries both representations (``text/plain``, the CLI's words, and ``text/html``), so
a notebook read without a browser (nbclient, ``nbconvert --to markdown``, a test) still holds the
numbers. The documents are built and rendered by :mod:`model_debugger.views`; this module only
wraps them for IPython's display.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .. import views as _v
from ..views import location

__all__ = ["View", "classification", "findings", "location", "message", "plan", "refused",
           "reproduce", "status", "verification", "view"]


class View:
    """A display object with a plain-text and an HTML representation.

    Parameters
    ----------
    text : str
        What a terminal or a test reads.
    html_body : str
        What a notebook shows.
    """

    def __init__(self, text: str, html_body: str) -> None:
        self.text = text
        self.html = html_body

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return {"text/plain": self.text, "text/html": self.html}

    def __repr__(self) -> str:
        return self.text


def view(docs: _v.Doc | Iterable[_v.Doc]) -> View:
    """A display object of one document or several."""
    return View(_v.text(docs), _v.html(docs))


def message(text: str, level: str = "info") -> View:
    """A one-line notice; ``level`` is ``info``, ``ok``, ``warning`` or ``error``."""
    return view(_v.message(text, level))


def reproduce(verdict, error: BaseException | None = None, root: str | None = None) -> View:
    """The Reproduce verdict (a :class:`~model_debugger.records.Reproduction` or its JSON)."""
    return view(_v.reproduction(verdict, error, root))


def classification(report) -> View:
    """The view of a classification, or of the reason there is none yet.

    ``report``: a JSON report holding ``classification`` and ``gates``, a
    :class:`~model_debugger.session.State`, or a :class:`~model_debugger.records.Classification`.
    """
    cls, reason = _classification_of(report)
    doc = _v.classification(cls, reason)
    if cls is None and reason and "reproduce" in reason:
        doc = _v.Doc(doc.title + " - run %%reproduce first", doc.lines, doc.status)
    return view(doc)


def _classification_of(report):
    if isinstance(report, Mapping) and ("classification" in report or "gates" in report):
        return report.get("classification"), (report.get("gates") or {}).get("classify")
    if hasattr(report, "gates") and hasattr(report, "classification"):  # a State
        return report.classification, report.gates.get("classify")
    return report, None


def findings(items, root: str | None = None) -> View:
    """Isolate's findings (typed or JSON), locations relative to the session folder ``root``."""
    return view(_v.findings(items or [], root))


def plan(p, root: str | None = None) -> View:
    """A fix plan awaiting approval."""
    return view(_v.plan(p, root))


def refused(reasons: list[str]) -> View:
    """Why a fix was refused (nothing was recorded)."""
    return view(_v.refused(reasons))


def verification(v) -> View:
    """Verify's verdict (a :class:`~model_debugger.records.Verification` or its JSON)."""
    doc = _v.verification(v)
    return view(doc if doc is not None else _v.message("Verify: not verified yet", "warning"))


def status(report: Mapping) -> View:
    """The session at a glance (a report)."""
    return view(_v.status(report))
