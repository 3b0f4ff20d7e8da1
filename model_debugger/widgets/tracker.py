"""The phase tracker: the session's phase strip (each gate's reason) and the Approve button.

The tracker holds no state of its own. It subscribes to its session
(:meth:`~model_debugger.session.DebugSession.on_change`) and renders the :class:`State` every
event produces: the strip is ``state.strip`` (computed once, in :mod:`model_debugger.session`),
and ``fix_button.disabled`` is set in one place, from the state: Approve is enabled only while a
plan (``%%fix``) awaits approval and the Fix gate is open. Only the newest tracker of a kernel
is live; an older copy (an earlier cell's output) keeps showing the state, read-only.
"""

from __future__ import annotations

import html

import ipywidgets as W

_STYLE = {"done": ("#2e7d32", "done"), "current": ("#1565c0", "current"),
          "blocked": ("#9e9e9e", "blocked"), "open": ("#555", "open")}
READ_ONLY = "read-only: a newer tracker below is live"


class PhaseTracker(W.VBox):
    """Reproduce -> Classify -> Isolate -> Fix -> Verify of one session.

    Parameters
    ----------
    session : DebugSession
        What the tracker shows (it follows every event appended to the session's folder) and
        what the Approve button asks to approve the recorded plan.
    """

    def __init__(self, session) -> None:
        self.session = session
        self.live = True
        self.phases = W.HTML()
        self.fix_button = W.Button(description="Approve fix", button_style="success",
                                   icon="check", disabled=True,
                                   tooltip="Approve the fix plan shown by %%fix (needs a "
                                           "confirmed finding and a plan)")
        self.message = W.HTML()
        self.fix_button.on_click(self._approve)
        super().__init__([self.phases, self.fix_button, self.message])
        self._unsubscribe = session.on_change(self.refresh)
        self.refresh()

    def refresh(self, state=None) -> None:
        """Redraw from ``state`` (default: the session's); the only place the button is set."""
        state = state if state is not None else self.session.state
        cells = []
        for phase, status in state.strip:
            color, word = _STYLE.get(status, ("#555", status))
            reason = state.gates.get(phase)
            why = f"<br><small>{html.escape(reason)}</small>" if reason and status != "done" \
                else ""
            cells.append(f"<td style='padding:4px 10px;border-left:4px solid {color}'>"
                         f"<b>{phase.capitalize()}</b><br><span style='color:{color}'>{word}"
                         f"</span>{why}</td>")
        head = (f"<small>session {html.escape(self.session.id)} - phase "
                f"<b>{html.escape(state.phase)}</b>"
                + ("" if self.live else f" ({READ_ONLY})") + "</small>")
        self.phases.value = head + "<table><tr>" + "".join(cells) + "</tr></table>"
        ready = state.plan is not None and state.fix_allowed
        self.fix_button.disabled = not (self.live and ready)
        self.fix_button.button_style = "success" if not self.fix_button.disabled else ""
        self.message.value = f"<small>{html.escape(next_step(state))}</small>"
        self.fix_button.tooltip = (
            READ_ONLY if not self.live else
            f"Approve the plan for {state.plan.finding}" if ready else
            f"nothing to approve: {state.gates.get('fix')}" if state.gates.get("fix") else
            "nothing to approve: put the changed code in a %%fix cell")

    def retire(self) -> None:
        """Make this copy read-only (a newer tracker is live); it keeps showing the state."""
        self.live = False
        self.refresh()

    def _approve(self, _button=None) -> None:
        from ..session import GateError

        if not self.live:
            self.message.value = html.escape(READ_ONLY)
            return
        try:
            plan = self.session.approve()
        except GateError as exc:
            self.message.value = f"<span style='color:#b00020'>{html.escape(str(exc))}</span>"
            return
        self.message.value = (f"Approved the fix for <code>{html.escape(plan.finding)}</code>;"
                              " run <code>%verify</code>.")


    def close(self) -> None:
        """Stop following the session and close the widgets."""
        self._unsubscribe()
        for child in (self.phases, self.fix_button, self.message):
            child.close()
        super().close()


def next_step(state) -> str:
    """What to type next, from the session's state (redrawn with every event, never stale)."""
    phase = state.phase
    if phase == "reproduce":
        return "Next: run the training cell under %%reproduce."
    if phase == "classify":
        return "Next: %classify."
    if phase == "isolate":
        return "Next: %isolate."
    if phase == "verify" and state.pending is not None:
        return f"Approved the fix for {state.pending.finding}; next: %verify."
    if phase == "fix" and state.plan is not None:
        return f"Next: review the plan for {state.plan.finding}, then Approve (or %%fix --yes)."
    if phase == "fix":
        top = state.queue[0].check if state.queue else "the finding"
        return f"Next: put the corrected code for {top} in a %%fix cell."
    if phase == "done":
        verdict = state.verification.verdict if state.verification is not None else "done"
        return f"Done ({verdict}): %md_export writes the record."
    return ""
