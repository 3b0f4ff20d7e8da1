"""One view layer for every front end: phase results as small documents, rendered as text or HTML.

A builder (:func:`reproduction`, :func:`classification`, :func:`findings`, :func:`plan`,
:func:`fix`, :func:`verification`, :func:`status`, :func:`report`) turns a typed record of
:mod:`model_debugger.records` (or the report JSON of the same record) into a :class:`Doc`: a
title, lines, tables and preformatted blocks, and a status. :func:`text` renders a document for a
terminal (the CLI prints it; the magics use it as ``text/plain``), :func:`html` renders it for a
notebook, every recorded string HTML-escaped. Nothing here formats a number twice: the CLI and the
magics show the same words.
"""

from __future__ import annotations

import html as _html
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .records import Classification, Finding, FixPlan, RecordError, Reproduction, Verification

LEVELS = ("info", "ok", "warning", "error")
_COLORS = {"info": "#333", "ok": "#1b5e20", "warning": "#8a6d00", "error": "#b00020"}


# -- the document model ----------------------------------------------------------------------
@dataclass(frozen=True)
class Table:
    """Rows under a header.

    ``line`` formats one row as a text line (``str.format`` fields by position); default: the
    cells joined by two spaces. ``text_header``: the text shows the header as a first line too.
    """

    header: tuple[str, ...]
    rows: tuple[tuple, ...]
    line: str | None = None
    text_header: bool = False


@dataclass(frozen=True)
class Block:
    """Preformatted text (a diff, a traceback), shown as it is."""

    text: str


@dataclass(frozen=True)
class Check:
    """One finding as a check of a checks report: a status badge, what it found, the numbers.

    Attributes
    ----------
    status : str
        ``confirmed`` (an experiment or a measurement supports it), ``refuted`` (the experiment
        that undid the suspected cause left the problem as it was) or ``hypothesis`` (untested).
    check, root_cause, where, explanation : str
        The probe, the root-cause kind, ``file:line`` and the probe's words.
    href : str or None
        A link that opens the located file at its line (relative, percent-encoded, with a
        ``#line=`` fragment, the editor's 0-based line), None when there is none.
    measured : str or None
        The before/after numbers of the experiment, one line.
    details : tuple of (str, str)
        The rest of the measured evidence, rounded for reading (shown folded in HTML).
    cell : tuple of (str, int) or None
        A location in a notebook cell: ``("reproduce" | "fix", line)``; the JupyterLab
        extension reveals that cell at the line when the location is clicked.
    """

    status: str
    check: str
    root_cause: str
    where: str
    explanation: str
    href: str | None = None
    measured: str | None = None
    details: tuple = ()
    cell: tuple | None = None


@dataclass(frozen=True)
class Doc:
    """A view: a title, then lines (``str``, :class:`Table` or :class:`Block`).

    Attributes
    ----------
    title : str
        The first line (bold in HTML).
    lines : tuple
        What follows; a ``str`` line keeps its leading spaces (indentation).
    status : str
        One of :data:`LEVELS`: the colour of the HTML title.
    """

    title: str
    lines: tuple = ()
    status: str = "info"

    def __post_init__(self) -> None:
        if self.status not in LEVELS:
            raise ValueError(f"unknown status {self.status!r} (expected one of {LEVELS})")


def text(docs: Doc | Iterable[Doc]) -> str:
    """Plain text of one document or several (one after the other), without a final newline."""
    docs = [docs] if isinstance(docs, Doc) else list(docs)
    out: list[str] = []
    for doc in docs:
        out.append(doc.title)
        for part in doc.lines:
            if isinstance(part, Check):
                out += [f"  [{part.status}] {part.check} ({part.root_cause}) at {part.where}",
                        f"      {part.explanation}"]
                if part.measured:
                    out.append(f"      measured: {part.measured}")
            elif isinstance(part, Table):
                fmt = part.line
                rows = (part.header, *part.rows) if part.text_header else part.rows
                out += [(fmt.format(*(_cell(v) for v in row)) if fmt else
                         "  " + "  ".join(_cell(v) for v in row)).rstrip() for row in rows]
            elif isinstance(part, Block):
                out.append(part.text.rstrip("\n"))
            else:
                out.append(str(part))
    return "\n".join(out)


def html(docs: Doc | Iterable[Doc]) -> str:
    """HTML of one document or several; every recorded string is escaped."""
    docs = [docs] if isinstance(docs, Doc) else list(docs)
    return "".join(_html_one(d) for d in docs)


def _e(value) -> str:
    return _html.escape(_cell(value), quote=True)


def _html_one(doc: Doc) -> str:
    color = _COLORS[doc.status]
    parts = [f"<div class='md-view md-{doc.status}'>"
             f"<b style='color:{color}'>{_e(doc.title)}</b>"]
    lines: list[str] = []

    def flush() -> None:
        if lines:
            parts.append("<div style='white-space:pre-wrap;font-family:monospace'>"
                         + "<br>".join(_e(x) for x in lines) + "</div>")
            lines.clear()

    for part in doc.lines:
        if isinstance(part, Check):
            flush()
            parts.append(_check_html(part))
        elif isinstance(part, Table):
            flush()
            head = "".join(f"<th style='text-align:left'>{_e(h)}</th>" for h in part.header)
            body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{_e(c)}</td>"
                                            for c in row) + "</tr>" for row in part.rows)
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif isinstance(part, Block):
            flush()
            parts.append(f"<pre>{_e(part.text)}</pre>")
        else:
            lines.append(str(part))
    flush()
    return "".join(parts) + "</div>"


_BADGES = {"confirmed": "#1b5e20", "refuted": "#b00020", "hypothesis": "#616161"}


def _check_html(c: Check) -> str:
    """A finding as a card: badge, check, root cause, a link to the location, folded numbers."""
    badge = (f"<span class='md-badge md-badge-{_e(c.status)}' style='background:"
             f"{_BADGES.get(c.status, '#616161')};color:#fff;border-radius:3px;padding:0 6px;"
             f"font-size:85%'>{_e(c.status)}</span>")
    if c.cell:
        where = (f"<a class='md-location' data-md-cell='{_e(c.cell[0])}' "
                 f"data-md-line='{_e(c.cell[1])}' title='reveal the cell'>{_e(c.where)}</a>")
    elif c.href:
        where = f"<a href='{_e(c.href)}' class='md-location'>{_e(c.where)}</a>"
    else:
        where = _e(c.where)
    body = [f"<div class='md-check md-check-{_e(c.status)}' style='border-left:3px solid "
            f"{_BADGES.get(c.status, '#616161')};padding:2px 8px;margin:4px 0'>",
            f"{badge} <b>{_e(c.check)}</b> <span style='color:#555'>({_e(c.root_cause)})</span>"
            f" at {where}", f"<div>{_e(c.explanation)}</div>"]
    if c.measured:
        body.append(f"<div><small><b>measured:</b> {_e(c.measured)}</small></div>")
    if c.details:
        rows = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in c.details)
        body.append(f"<details><summary><small>evidence</small></summary>"
                    f"<table class='md-evidence'>{rows}</table></details>")
    return "".join(body) + "</div>"


def _plural(n, word: str) -> str:
    """``1 epoch``, ``2 epochs``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    return str(value)


def _g(value, spec: str = ".4g") -> str:
    """A number in a sentence (``n/a`` when missing or not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "n/a" if value is None else str(value)
    return format(value, spec)


# -- reading records -----------------------------------------------------------------------------
def _typed(cls, value):
    """``value`` as the typed record ``cls`` (from its JSON when it is a dict), or None."""
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        try:
            return cls.from_json(dict(value))
        except (RecordError, TypeError, KeyError):
            return None
    return None


def location(loc: Mapping | None, root: str | None = None) -> str:
    """``file:line`` of a finding or a code reference, relative to ``root`` when inside it.

    A line of a notebook session's cell reads ``%%reproduce cell, line N`` (or ``%%fix``),
    not the path of the session's copy of it.
    """
    if not isinstance(loc, Mapping) or not loc.get("file"):
        return "-"
    cell = _cell_of(loc)
    if cell:
        return f"%%{cell[0]} cell, line {cell[1]}"
    path = str(loc["file"])
    if root and os.path.isabs(path):
        base = os.path.abspath(root)
        if path.startswith(base + os.sep):
            path = os.path.relpath(path, base)
    return f"{path}:{loc.get('line', '?')}"


# -- builders ------------------------------------------------------------------------------------
def message(text_: str, level: str = "info") -> Doc:
    """A one-line notice; ``level`` is ``info``, ``ok``, ``warning`` or ``error``."""
    return Doc(str(text_), (), level if level in LEVELS else "info")


def reproduction(rep: Reproduction | Mapping | None, error: BaseException | None = None,
                 root: str | None = None) -> Doc:
    """Reproduce's verdict: status, steps, epochs, time, the error, what was tried.

    Parameters
    ----------
    rep : Reproduction or dict or None
        The verdict (None: not recorded yet).
    error : BaseException, optional
        The exception that ended an in-kernel run, when the verdict does not name one.
    root : str, optional
        Locations inside this folder are shown relative to it.
    """
    rep = _typed(Reproduction, rep)
    if rep is None:
        return Doc("Reproduce: not recorded", (), "warning")
    get = rep.get
    seconds = get("seconds")
    title = (f"Reproduce: {rep.summary} ({rep.status}) - {rep.steps} steps, "
             f"{_plural(get('epochs', 0) or 0, 'epoch')}, {_g(seconds, '.1f')} s")
    lines: list = []
    if get("error"):
        where = get("error_location")
        lines.append(f"  error: {get('error')}"
                     + (f" at {location(where, root)}" if where else ""))
    elif error is not None:
        lines.append(f"  error: {type(error).__name__}: {error}")
    crash = get("crash")
    if isinstance(crash, Mapping):
        after = crash.get("after_step")
        lines.append(f"  crashed: {crash.get('how')}; "
                     + (f"after step {after}" if after is not None else "before any step"))
    if rep.status == "interrupted":
        lines.append("  interrupted (Ctrl-C): the record is partial")
    if rep.reason:
        lines.append(f"  not observed: {rep.reason}")
    if get("bad_lines"):
        lines.append(f"  record: {get('bad_lines')} unreadable lines skipped (the rest was kept)")
    lines += [f"  tried {t}" for t in get("tried") or []]
    ranks = rank_table(get("rank_table"), get("ranks"))
    if ranks is not None:
        lines += [f"  ranks: {get('ranks')} (world size); per rank:", ranks]
    one = get("single_rank")
    if isinstance(one, Mapping):
        lines.append(f"  ranks: only this process was captured, rank {one.get('rank')} of "
                     f"{one.get('world_size')} (torch.distributed is initialised here); every "
                     "rank: model-debugger diagnose SCRIPT --nproc-per-node N")
    code = get("code")
    if isinstance(code, Mapping):
        lines += [f"  code: {kind} at {location(loc, root)}" for kind, loc in code.items()]
    level = {"reproduced": "ok", "not_reproduced": "info", "not_observed": "warning"}.get(
        rep.status, "error")
    return Doc(title, tuple(lines), level)


RANK_COLUMNS = (("rank", "rank"), ("status", "status"), ("steps", "steps"),
                ("step_ms", "step ms"), ("data_wait_ms", "data ms"), ("own_ms", "own ms"),
                ("blocked_ms", "blocked ms"), ("peak_rss_mb", "peak MB"),
                ("loss_final", "loss"), ("grad_norm_final", "grad norm"))


def rank_table(rows, world=None) -> Table | None:
    """The per-rank table of a multi-process job (None for a single process).

    Columns: :data:`RANK_COLUMNS`, then the first non-finite value (step, what, module) and
    where the rank ended (the collective or place it waited in).
    """
    if not isinstance(rows, list) or not rows:
        return None
    out = []
    for row in rows:
        if not isinstance(row, Mapping):
            continue
        bad = row.get("first_nonfinite")
        bad = f"step {bad.get('step')} {bad.get('what')} {bad.get('module') or ''}".strip() \
            if isinstance(bad, Mapping) else None
        end = row.get("last_collective")
        end = (f"{end.get('where') or 'done'}{' (waiting)' if end.get('waiting') else ''}"
               if isinstance(end, Mapping) else None)
        out.append((*(row.get(k) for k, _ in RANK_COLUMNS), bad, end))
    header = (*(h for _, h in RANK_COLUMNS), "first non-finite", "ended in")
    widths = [max(len(header[i]), *(len(_cell(r[i])) for r in out)) for i in range(len(header))]
    fmt = "    " + "  ".join(f"{{:<{w}}}" for w in widths)
    return Table(header, tuple(out), fmt, text_header=True)


def classification(cls: Classification | Mapping | None, reason: str | None = None) -> Doc:
    """The primary category, the secondaries, and the numbers behind them.

    ``reason`` says why there is none (the Classify gate) when ``cls`` is None.
    """
    cls = _typed(Classification, cls)
    if cls is None:
        return Doc(f"Classification: not classified ({reason or 'no classification recorded'})",
                   (), "warning")
    second = ", ".join(cls.secondary) or "none"
    rows = tuple((e.signal, e.value, e.detail) for e in cls.evidence)
    lines = (Table(("signal", "value", "rule"), rows, "  {0} = {1}  ({2})"),) if rows else ()
    return Doc(f"Classification: {cls.primary} (secondary: {second})", lines,
               "ok" if cls.primary == "healthy" else "info")


def findings(items: Iterable[Finding | Mapping], root: str | None = None, *,
             ran: bool = True, reason: str | None = None) -> Doc:
    """Isolate's findings: confirmed or hypothesis, check, root cause, file:line, explanation.

    Parameters
    ----------
    items : iterable of Finding or dict
    root : str, optional
        Locations inside this folder are shown relative to it.
    ran : bool
        False when Isolate has not run yet (``reason``: why not).
    """
    found = [f for f in (_typed(Finding, x) for x in items) if f is not None]
    if not found:
        if not ran:
            return Doc(f"Isolate: not run ({reason or 'no probes have run yet'})", (), "warning")
        return Doc("Isolate: no findings (nothing measured points at a cause)")
    checks = tuple(Check(finding_status(f), f.check, f.root_cause, location(f.location, root),
                         f.explanation, _href(f.location), _measured(f), _details(f),
                         _cell_of(f.location))
                   for f in found)
    confirmed = sum(f.confirmed for f in found)
    return Doc(f"Isolate: {len(found)} finding{'s' * (len(found) != 1)} ({confirmed} confirmed)",
               (_summary(found, checks, root), *checks), "ok" if confirmed else "info")


def finding_status(f: Finding) -> str:
    """A finding's badge: ``confirmed``, ``refuted`` or ``hypothesis``.

    ``refuted``: its experiment ran (a copy with the cause undone, or a re-run with the
    intervention) and did not remove the problem; ``hypothesis``: nothing tested it.
    """
    if f.confirmed:
        return "confirmed"
    ev = f.evidence or {}
    iv = ev.get("intervention")
    tested = isinstance(iv, Mapping) and "untested" not in iv and iv.get("moved") is False
    return "refuted" if tested or ev.get("undone") is False else "hypothesis"


def _summary(found: list[Finding], checks: tuple, root: str | None) -> str:
    """The report's first line: what was found, how sure, and what to type next."""
    top = found[0]
    counts = {s: sum(c.status == s for c in checks) for s in ("confirmed", "refuted", "hypothesis")}
    tally = ", ".join(f"{n} {'hypotheses' if s == 'hypothesis' and n > 1 else s}"
                      for s, n in counts.items() if n)
    if not top.confirmed and all(f.category == "healthy" for f in found):
        return (f"  Summary: the run looks healthy; {tally} about code that can hide a problem "
                "its signals did not show. Next: read them below and change the code if the "
                "pitfall is not intended.")
    if not top.confirmed:
        return (f"  Summary: no cause confirmed ({tally}). Next: %isolate --budget 120 for a "
                "longer search, or test the hypotheses below by hand.")
    iv = (top.evidence or {}).get("intervention")
    how = ("confirmed by a re-run with the cause undone" if isinstance(iv, Mapping) and
           iv.get("moved") else "confirmed by a copy trained with the cause undone"
           if (top.evidence or {}).get("undone") else "confirmed by a measurement")
    cat = top.category or "the problem"
    return (f"  Summary: {cat} from {top.root_cause} ({top.check}) at "
            f"{location(top.location, root)}, {how} ({tally}). Next: put the corrected code in "
            "a %%fix cell (the suggested change is in the plan).")


def _cell_of(loc: Mapping | None) -> tuple | None:
    """``(cell, line)`` when ``loc`` is a line of a notebook session's cell, else None."""
    from .store import cell_copy

    if not isinstance(loc, Mapping) or not isinstance(loc.get("file"), str):
        return None
    cell = cell_copy(loc["file"])
    return (cell, loc.get("line") if isinstance(loc.get("line"), int) else "?") if cell else None


def _href(loc: Mapping | None) -> str | None:
    """A relative link that opens a located file under the working folder at its line.

    Percent-encoded; the ``#line=`` fragment (0-based, RFC 5147) is how JupyterLab's editor
    is told the line. None outside the working folder, and for a notebook cell's copy.
    """
    from urllib.parse import quote

    if not isinstance(loc, Mapping) or not isinstance(loc.get("file"), str) or _cell_of(loc):
        return None
    path = loc["file"]
    try:
        rel = os.path.relpath(path, os.getcwd()) if os.path.isabs(path) else path
    except ValueError:
        return None
    if rel.startswith(".." + os.sep) or rel == ".." or not os.path.isfile(rel):
        return None
    line = loc.get("line")
    fragment = f"#line={line - 1}" if isinstance(line, int) and line > 0 else ""
    return quote(rel.replace(os.sep, "/")) + fragment


_HIDDEN = ("strength", "category", "undone", "decisive", "intervention", "probe_error")


def _measured(f: Finding) -> str | None:
    """The experiment's before/after numbers, one line (None when no experiment ran)."""
    iv = (f.evidence or {}).get("intervention")
    if not isinstance(iv, Mapping) or "untested" in iv or iv.get("metric") is None:
        return None
    band = iv.get("noise_band")
    return (f"re-run with {iv.get('id')}: {iv.get('metric')} {_g(iv.get('before_mean'))} -> "
            f"{_g(iv.get('after_mean'))} ({iv.get('direction', '?')} is better; noise band "
            f"{_g(band)}; seeds {list(iv.get('seeds') or [])})")


def _details(f: Finding) -> tuple:
    """The finding's other evidence, rounded: numbers to 4 significant digits, lists shortened."""
    out = []
    for key, value in (f.evidence or {}).items():
        if key in _HIDDEN:
            continue
        out.append((str(key), _round(value)))
    return tuple(out)


def _round(value) -> str:
    if isinstance(value, bool) or value is None:
        return _cell(value)
    if isinstance(value, float):
        return _g(value)
    if isinstance(value, (list, tuple)):
        shown = ", ".join(_round(v) for v in list(value)[:8])
        return f"[{shown}{', ...' if len(value) > 8 else ''}]"
    if isinstance(value, Mapping):
        shown = ", ".join(f"{k}: {_round(v)}" for k, v in list(value.items())[:8])
        return "{" + shown + (", ..." if len(value) > 8 else "") + "}"
    return str(value)


def plan(p: FixPlan | Mapping, root: str | None = None) -> Doc:
    """A fix plan awaiting approval: the finding, the suggestion, the expected effect, the diff."""
    p = _typed(FixPlan, p)
    if p is None:
        return Doc("Fix plan: not readable", (), "error")
    lines: list = [f"  suggestion: {p.suggestion}", f"  expected: {p.expected}"]
    lines += [f"  override: {o}" for o in p.overrides]
    if p.diff:
        lines.append(Block(p.diff))
    return Doc(f"Fix plan for {p.finding} ({p.root_cause}) at {location(p.location, root)}",
               tuple(lines))


def refused(reasons: Iterable[str]) -> Doc:
    """Why a fix was refused (nothing was recorded)."""
    return Doc("Fix refused (nothing recorded):", tuple(f"  - {r}" for r in reasons), "error")


def fix(p: FixPlan | Mapping | None) -> Doc | None:
    """The last approved fix, one line (None when no fix was approved)."""
    p = _typed(FixPlan, p)
    if p is None:
        return None
    return Doc(f"Fix: {p.finding} ({p.root_cause}) - "
               + ("approved" if p.approved else "awaiting approval"),
               tuple(f"  override: {o}" for o in p.overrides))


def verification(v: Verification | Mapping | None) -> Doc | None:
    """Verify's verdict: the defining signal before and after, per seed, and the noise band."""
    v = _typed(Verification, v)
    if v is None:
        return None
    scale = " (log10)" if v.get("scale") == "log10" else ""
    title = (f"Verify: {v.verdict} ({v.category}: {v.metric}{scale}, {v.get('direction')} is "
             f"better; seeds {list(v.seeds)})")
    rows = []
    for name, side in (("before", v.before), ("after", v.after)):
        side = side if isinstance(side, Mapping) else {}
        values = side.get("values")
        shown = "[" + ", ".join(_g(x) for x in values) + "]" if isinstance(values, list) else \
            values
        rows.append((name, shown, _g(side.get("mean")), side.get("present")))
    lines: list = [Table(("", "per seed", "mean", f"{v.category} present"), tuple(rows),
                         "  {0:6} {1} mean {2}; " + f"{v.category} in " + "{3}"),
                   f"  noise band {_g(v.get('noise_band'), '.3g')}, improvement "
                   f"{_g(v.get('improvement'))}"]
    cured = v.get("cured_where_seen") or []
    if cured and v.seeds:
        seen = [v.seeds[i] for i in cured if i < len(v.seeds)]
        lines.append(f"  judged where it occurred: seeds {seen} each improved and are clean")
    if v.remaining_symptom:
        lines.append(f"  remaining: {v.remaining_symptom}")
    level = {"resolved": "ok", "partially_resolved": "warning"}.get(v.verdict, "error")
    return Doc(title, tuple(lines), level)


def _strip(report: Mapping) -> list[tuple[str, str]]:
    return [(p.get("phase"), p.get("status")) for p in report.get("phases") or []
            if isinstance(p, Mapping)]


def status(report: Mapping) -> Doc:
    """The session at a glance: phase strip, gates, classification, queue, last fix and verdict."""
    cls = report.get("classification") or {}
    ver = report.get("verification") or {}
    strip = _strip(report)
    lines = [f"  folder: {report.get('session_dir')}",
             f"  phase: {report.get('phase')}; fix allowed: {report.get('fix_allowed')}"]
    if strip:
        lines.append("  phases: " + ", ".join(f"{p} {s}" for p, s in strip))
    lines += [f"  classification: {cls.get('primary', '-')}",
              f"  queue: {', '.join(report.get('queue') or []) or '-'}",
              f"  last fix: {(report.get('fix') or {}).get('finding', '-')}",
              f"  last verdict: {ver.get('verdict', '-')}"]
    if report.get("phase") == "done":  # nothing is blocked: the method is finished
        lines.append("  done: %md_export (or model-debugger export) writes the record")
    else:
        lines += [f"  gate {k}: {r}" for k, r in (report.get("gates") or {}).items() if r]
    return Doc(f"Session {report.get('session')}", tuple(lines))


def footer(report: Mapping) -> Doc:
    """Where the session stands and where it is saved (the CLI's last lines)."""
    return Doc(f"Next phase: {report.get('phase')} "
               f"(fix allowed: {str(bool(report.get('fix_allowed'))).lower()})",
               (f"Session saved: {report.get('session_dir')}",))


def report(rep: Mapping, isolated: bool | None = None) -> list[Doc]:
    """Every phase of a report (:meth:`DebugSession.report`), in order, then the footer.

    ``isolated`` says whether Isolate has run (``session.state.isolations``); without it, the
    report's phase strip is read.
    """
    gates = rep.get("gates") or {}
    root = rep.get("session_dir")
    if isolated is None:
        isolated = dict(_strip(rep)).get("isolate") == "done"
    docs = [reproduction(rep.get("reproduce"), root=root),
            classification(rep.get("classification"), gates.get("classify")),
            findings(rep.get("findings") or [], root, ran=isolated,
                     reason=gates.get("isolate"))]
    docs += [d for d in (fix(rep.get("fix")), verification(rep.get("verification")))
             if d is not None]
    docs.append(footer(rep))
    return docs
