"""The findings table (check, root cause, confirmed or hypothesis, file:line, explanation)."""

from __future__ import annotations

import ipywidgets as W

from . import views


class FindingsTable(W.HTML):
    """Isolate's findings as an HTML table, refreshed from the session."""

    def update(self, findings: list[dict], root: str | None = None) -> None:
        self.value = views.findings(findings, root).html
