"""Static views of session results: each is shown as HTML in a notebook and as plain text elsewhere.

Every view carries both representations (``text/plain`` and ``text/html``), so a notebook read
without a browser (nbclient, ``nbconvert --to markdown``, a test) still holds the numbers.
"""

from __future__ import annotations

import html
import os


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


def _e(value) -> str:
    return html.escape(str(value))


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th style='text-align:left'>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{_e(c)}</td>" for c in r)
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def message(text: str, level: str = "info") -> View:
    """A one-line notice; ``level`` is ``info``, ``warning`` or ``error``."""
    color = {"info": "#333", "warning": "#8a6d00", "error": "#b00020"}.get(level, "#333")
    return View(text, f"<div style='color:{color};white-space:pre-wrap'>{_e(text)}</div>")


def location(loc: dict | None, root: str | None = None) -> str:
    """``file:line`` of a finding or reference, relative to the session folder when inside it."""
    if not loc:
        return "-"
    path = loc.get("file") or "?"
    if root and os.path.isabs(path) and path.startswith(os.path.abspath(root) + os.sep):
        path = os.path.relpath(path, root)
    return f"{path}:{loc.get('line', '?')}"


def reproduce(verdict: dict, error: BaseException | None = None) -> View:
    """The Reproduce verdict: status, steps, epochs, the error that ended the run."""
    lines = [f"Reproduce: {verdict.get('summary')} ({verdict.get('status')}), "
             f"{verdict.get('steps', 0)} steps, {verdict.get('epochs', 0)} epochs, "
             f"{verdict.get('seconds', 0)} s"]
    if verdict.get("error"):
        lines.append(f"the run ended with {verdict['error']} (partial record kept)")
    elif error is not None:
        lines.append(f"the run ended with {type(error).__name__}: {error} (partial record kept)")
    if verdict.get("reason"):  # not_observed: why no training step was seen
        lines.append(f"not observed: {verdict['reason']}")
    for t in verdict.get("tried", []) or []:
        lines.append(f"  tried: {t}")
    text = "\n".join(lines)
    return View(text, "<pre>" + _e(text) + "</pre>")


def classification(report: dict) -> View:
    """The primary category, the secondaries, and the numbers behind them."""
    cls = report.get("classification")
    if not cls:
        reason = (report.get("gates") or {}).get("classify") or "nothing classified yet"
        return message(f"Classify: {reason} (run %%reproduce first)", "warning")
    rows = [[e["signal"], e["value"], e["detail"]] for e in cls.get("evidence", [])]
    second = ", ".join(cls.get("secondary", [])) or "none"
    text = (f"Classification: {cls['primary']} (secondary: {second})\n"
            + "\n".join(f"  {s} = {v}  ({d})" for s, v, d in rows))
    body = (f"<b>Classification: {_e(cls['primary'])}</b> (secondary: {_e(second)})"
            + _table(["signal", "value", "rule"], rows))
    return View(text, body)


def findings(items: list[dict], root: str | None = None) -> View:
    """The findings table: check, root cause, confirmed, file:line, explanation."""
    if not items:
        return message("Isolate: no findings (nothing measured points at a cause)")
    rows = [[f["check"], f["root_cause"], "confirmed" if f["confirmed"] else "hypothesis",
             location(f.get("location"), root), f["explanation"]] for f in items]
    text = "Findings:\n" + "\n".join(
        f"  [{r[2]}] {r[0]} ({r[1]}) at {r[3]}: {r[4]}" for r in rows)
    return View(text, "<b>Findings</b>" + _table(
        ["check", "root cause", "status", "file:line", "explanation"], rows))


def plan(p: dict, root: str | None = None) -> View:
    """A fix plan: the finding, the suggestion, the diff and the expected effect."""
    where = location(p.get("location"), root)
    lines = [f"Fix plan for {p['finding']} ({p['root_cause']}) at {where}",
             f"suggestion: {p['suggestion']}", f"expected: {p['expected']}"]
    lines += [f"override: {o}" for o in p.get("overrides", [])]
    text = "\n".join(lines) + "\n" + p.get("diff", "")
    body = (f"<b>Fix plan</b> for <code>{_e(p['finding'])}</code> ({_e(p['root_cause'])}) at "
            f"<code>{_e(where)}</code>"
            f"<br>Suggestion: {_e(p['suggestion'])}<br>Expected effect: {_e(p['expected'])}"
            + "".join(f"<br>Override: {_e(o)}" for o in p.get("overrides", []))
            + f"<pre>{_e(p.get('diff', ''))}</pre>")
    return View(text, body)


def refused(reasons: list[str]) -> View:
    """Why a fix was refused (nothing was recorded)."""
    text = "Fix refused (nothing recorded):\n" + "\n".join(f"  - {r}" for r in reasons)
    return View(text, "<b style='color:#b00020'>Fix refused</b> (nothing recorded)<ul>"
                + "".join(f"<li>{_e(r)}</li>" for r in reasons) + "</ul>")


def verification(v: dict) -> View:
    """Verify's verdict: the defining signal before and after, per seed, and the noise band."""
    b, a = v.get("before", {}), v.get("after", {})
    rows = [["before", b.get("values"), b.get("mean"), b.get("present")],
            ["after", a.get("values"), a.get("mean"), a.get("present")]]
    text = (f"Verify: {v['verdict']} ({v['category']}, {v['metric']} {v['direction']} is better,"
            f" noise band {v['noise_band']}, seeds {v.get('seeds')})\n"
            + "\n".join(f"  {r[0]}: values={r[1]} mean={r[2]} category present {r[3]}"
                        for r in rows))
    if v.get("remaining_symptom"):
        text += f"\n  remaining: {v['remaining_symptom']}"
    body = (f"<b>Verify: {_e(v['verdict'])}</b> ({_e(v['category'])}; {_e(v['metric'])}, "
            f"{_e(v['direction'])} is better; noise band {_e(v['noise_band'])})"
            + _table(["", "per seed", "mean", "category present"], rows)
            + (f"<br>Remaining: {_e(v['remaining_symptom'])}" if v.get("remaining_symptom")
               else ""))
    return View(text, body)


def status(report: dict) -> View:
    """The session at a glance: phase, gates, classification, queue, last fix and verdict."""
    cls = report.get("classification") or {}
    ver = report.get("verification") or {}
    lines = [f"Session {report['session']} ({report['session_dir']})",
             f"phase: {report['phase']}; fix allowed: {report['fix_allowed']}",
             f"classification: {cls.get('primary', '-')}",
             f"queue: {', '.join(report.get('queue', [])) or '-'}",
             f"last fix: {(report.get('fix') or {}).get('finding', '-')}",
             f"last verdict: {ver.get('verdict', '-')}"]
    lines += [f"gate {k}: {r}" for k, r in (report.get("gates") or {}).items() if r]
    text = "\n".join(lines)
    return View(text, "<pre>" + _e(text) + "</pre>")
