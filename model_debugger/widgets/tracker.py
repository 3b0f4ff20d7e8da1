"""The phase tracker: five phases (done / current / blocked, with each gate's reason) and Approve.

The tracker holds no state of its own. :meth:`PhaseTracker.refresh` reads the session, and the
notebook session calls it after every change, so ``fix_button.disabled`` is exactly
``not session.fix_allowed``: the button cannot be enabled by hand without confirmed evidence.
"""

from __future__ import annotations

import html

import ipywidgets as W

from ..session import PHASES

_STYLE = {"done": ("#2e7d32", "done"), "current": ("#1565c0", "current"),
          "blocked": ("#9e9e9e", "blocked"), "ready": ("#555", "ready")}


def phase_states(report: dict) -> list[tuple[str, str, str | None]]:
    """``[(phase, state, reason)]`` with state ``done``, ``current``, ``blocked`` or ``ready``."""
    phase = report["phase"]
    gates = report.get("gates") or {}
    current = PHASES.index(phase) if phase in PHASES else len(PHASES)
    out = []
    for i, p in enumerate(PHASES):
        if i < current:
            state = "done"
        elif i == current:
            state = "current"
        else:
            state = "blocked" if gates.get(p) else "ready"
        out.append((p, state, gates.get(p)))
    return out


class PhaseTracker(W.VBox):
    """Reproduce -> Classify -> Isolate -> Fix -> Verify for one notebook session.

    Parameters
    ----------
    owner : NotebookSession
        What the tracker shows and what the Approve button asks to record a fix.
    """

    def __init__(self, owner) -> None:
        self.owner = owner
        self.phases = W.HTML()
        self.fix_button = W.Button(description="Approve fix", button_style="success",
                                   icon="check", disabled=True,
                                   tooltip="Record the fix plan shown by %%fix (needs a "
                                           "confirmed finding)")
        self.message = W.HTML()
        self.fix_button.on_click(self._approve)
        super().__init__([self.phases, self.fix_button, self.message])
        self.refresh()

    def refresh(self) -> None:
        """Redraw from the session; the only place ``fix_button.disabled`` is set."""
        report = self.owner.report()
        cells = []
        for phase, state, reason in phase_states(report):
            color, word = _STYLE[state]
            why = f"<br><small>{html.escape(reason)}</small>" if reason and state != "done" \
                else ""
            cells.append(f"<td style='padding:4px 10px;border-left:4px solid {color}'>"
                         f"<b>{phase.capitalize()}</b><br><span style='color:{color}'>{word}"
                         f"</span>{why}</td>")
        head = (f"<small>session {html.escape(report['session'])} - phase "
                f"<b>{html.escape(report['phase'])}</b></small>")
        self.phases.value = head + "<table><tr>" + "".join(cells) + "</tr></table>"
        self.fix_button.disabled = not report["fix_allowed"]

    def _approve(self, _button=None) -> None:
        from ..session import GateError

        try:
            plan = self.owner.approve()
        except GateError as exc:
            self.message.value = f"<span style='color:#b00020'>{html.escape(str(exc))}</span>"
            return
        self.message.value = (f"Approved the fix for <code>{html.escape(plan['finding'])}</code>;"
                              " run <code>%verify</code>.")
