"""Export a session: an nbformat v4 notebook that records it, and a standalone ``repro.py``.

The notebook has a section per phase (Reproduce, Classify, Isolate, Fix, Verify): the commands
that were run as code cells with their stored outputs (the numbers as stream text, loss and
gradient-norm plots as ``image/png``), findings with file:line, the fix's diff and the
before/after table; phases not reached say so and why. Its content depends only on the session
(cell ids are positional, PNGs carry no timestamp), so exporting a reloaded session gives the same
notebook; only ``metadata.model_debugger.exported`` changes. Everything written passes through
:func:`redact`: values of secret-looking environment variables and token patterns.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import time

import numpy as np

from . import _plots
from ._repro import write_repro
from .logs import load_log
from .records import Run
from .redact import REDACTED, redact, redact_args
from .session import PHASES, REPORT_SCHEMA, DebugSession

__all__ = ["REDACTED", "build_notebook", "export", "export_notebook", "redact", "redact_args",
           "write_repro"]

# -- small formatting helpers -----------------------------------------------------------------
def _num(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _cell(v) -> str:
    return _num(v).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _loc(loc: dict | None) -> str:
    return f"{loc['file']}:{loc['line']}" if loc and loc.get("file") else "—"


def _cmd(*parts) -> str:
    return "!" + " ".join(shlex.quote(str(p)) for p in parts)


class _Notebook:
    """Cells with positional ids and execution counts, redacted as they are added."""

    def __init__(self) -> None:
        import nbformat.v4 as v4

        self.v4 = v4
        self.cells: list = []
        self.count = 0

    def _id(self) -> str:
        return f"md-{len(self.cells) + 1}"

    def md(self, *parts: str) -> None:
        text = "\n\n".join(p for p in parts if p)
        self.cells.append(self.v4.new_markdown_cell(redact(text), id=self._id()))

    def code(self, source: str, text: str = "", figures=(), result: str | None = None) -> None:
        self.count += 1
        outputs = []
        if text:
            outputs.append(self.v4.new_output("stream", name="stdout", text=redact(text)))
        for fig, caption in figures:
            outputs.append(self.v4.new_output("display_data", data={
                "image/png": _png(fig), "text/plain": redact(f"<Figure: {caption}>")}))
        if result is not None:
            outputs.append(self.v4.new_output("execute_result", data={"text/plain": redact(result)},
                                              execution_count=self.count))
        self.cells.append(self.v4.new_code_cell(redact(source), id=f"code-{len(self.cells) + 1}",
                                                execution_count=self.count, outputs=outputs))


def _png(fig) -> str:
    return base64.b64encode(_plots.figure_png(fig)).decode("ascii")


def _load(path: str) -> Run | None:
    return Run.load(path) if os.path.exists(path) else None


def _artifact(session: DebugSession) -> dict:
    return next((e for e in session.events if e["kind"] == "artifact"), {})


# -- sections -----------------------------------------------------------------------------------
def _run_row(i: int, seed, run: Run | None, category: str) -> list:
    if run is None or not run.steps:
        return [i + 1, seed, 0, None, None, None, None, None, category]
    loss, gn = run.series("loss"), run.series("gn")
    fin = loss[np.isfinite(loss)]
    bad, step = run.first("nonfinite"), _plots.first_nonfinite(run)
    first_bad = (f"step {bad.get('step')} ({bad.get('what')}, {bad.get('module') or '—'})"
                 if bad else (f"step {step}" if step is not None else None))
    return [i + 1, seed, len(run.steps), float(loss[0]) if np.isfinite(loss[0]) else str(loss[0]),
            float(fin[-1]) if fin.size else None, float(fin.min()) if fin.size else None,
            float(np.nanmax(gn)) if np.isfinite(gn).any() else None, first_bad, category]


def _reproduce(nb: _Notebook, session: DebugSession, art: dict) -> None:
    rep = session.reproduce
    nb.md("## 1. Reproduce")
    if art.get("type") == "log":
        cmd = _cmd("model-debugger", "diagnose", art.get("path", "LOG"),
                   *(["--error", art["error"]] if art.get("error") else []))
        what = (f"Nothing could be run: a **minimal reproducer** — the log `{art.get('path')}`"
                + (f" and the error text `{art['error']}`" if art.get("error") else "") + ".")
    else:
        args = redact_args(list(art.get("args") or []))
        runs = (rep or {}).get("runs", {}).get("total", 1)
        cmd = _cmd("model-debugger", "diagnose", art.get("script", "SCRIPT"), "--runs", runs,
                   *(["--seed", art["seed"]] if art.get("seed") is not None else []),
                   *(["--max-seconds", art["max_seconds"]] if art.get("max_seconds") else []),
                   *(["--", *args] if args else []))
        limit = f"{_num(art['max_seconds'])} s" if art.get("max_seconds") else "none"
        what = (f"The script `{art.get('script')}` ran under instrumentation in a child process "
                f"(arguments {args or 'none'}, seed {_num(art.get('seed'))}, time limit {limit})."
                f" The session's copy of the code is "
                f"`{os.path.join(session.directory, 'artifact.py')}`; `python repro.py` re-runs it.")
    if rep is None:
        nb.md(what, "**Not reached**: no reproduce record yet.")
        return
    nb.md(what, f"**Verdict: {rep.get('status')}** ({rep.get('summary')}); problem: "
                f"`{rep.get('problem') or 'none'}`.")
    lines = [f"reproduce: {rep.get('summary')} ({rep.get('problem') or 'no problem'})",
             f"steps: {rep.get('steps')}, epochs: {rep.get('epochs')}, "
             f"seconds: {_num(rep.get('seconds'))}",
             f"error: {rep.get('error') or 'none'}"
             + (f" at {_loc(rep.get('error_location'))}" if rep.get("error_location") else "")]
    lines += [f"code: {k} at {_loc(v)}" for k, v in (rep.get("code") or {}).items()]
    lines += [f"tried: {t}" for t in rep.get("tried", [])]
    figures, runs, rows = [], [], []
    total = rep.get("runs", {}).get("total", 0)
    cats = rep.get("runs", {}).get("categories", [])
    if art.get("type") == "log":
        run = None
        try:
            run = load_log(art["path"], art.get("error"))
        except (ValueError, OSError, KeyError) as exc:
            lines.append(f"(the log cannot be read again for plots: {exc})")
        runs = [run] if run is not None else []
        rows = [_run_row(0, None, run, cats[0] if cats else "—")]
    else:
        for i in range(total):
            run = _load(os.path.join(session.directory, "runs", str(i), "record.jsonl"))
            seed = None if art.get("seed") is None else art["seed"] + i
            rows.append(_run_row(i, seed, run, cats[i] if i < len(cats) else "—"))
            if run is not None:
                runs.append(run)
    if runs:
        figures.append((_plots.loss_figure(runs, [f"run {i + 1}" for i in range(len(runs))]),
                        "loss per step"))
        if any(r.steps and "gn" in r.steps[0] for r in runs):
            figures.append((_plots.grad_norm_figure(runs[0], "Gradient norms per step (run 1)"),
                            "gradient norms, run 1"))
    nb.code(cmd, "\n".join(lines) + "\n", figures)
    nb.md("Per run:", _table(["run", "seed", "steps", "first loss", "final finite loss",
                               "min loss", "max grad norm", "first non-finite", "category"], rows))
    errors = [r.error for r in runs if r is not None and r.error and r.error.get("traceback")]
    if errors:
        tb = "\n".join(errors[0]["traceback"].splitlines()[-30:])
        nb.md("The run's error (last lines of the traceback):", f"```\n{tb}\n```")


def _classify(nb: _Notebook, session: DebugSession, art: dict) -> None:
    nb.md("## 2. Classify")
    cls = session.classification
    if cls is None:
        nb.md(f"**Not reached**: {session.gates()['classify'] or 'no classification yet'}.")
        return
    ev = [[e.signal, e.value, e.detail] for e in cls.evidence]
    nb.md(f"Primary category: **`{cls.primary}`**"
          + (f"; secondary (handled after the primary is verified): "
             f"{', '.join(f'`{c}`' for c in cls.secondary)}" if cls.secondary else "") + ".",
          "The numbers behind it:", _table(["signal", "value", "detail"], ev) if ev else "")
    if art.get("type") == "log":
        src = (f"from model_debugger.logs import load_log\n"
               f"run = load_log({art.get('path')!r}, {art.get('error')!r})\n")
    else:
        record = os.path.join(session.directory, (session.reproduce or {}).get(
            "record", os.path.join("runs", "0", "record.jsonl")))
        src = f"from model_debugger.records import Run\nrun = Run.load({record!r})\n"
    src += ("from model_debugger.classify import classify\nfrom model_debugger.signals import "
            "compute\ncls = classify(compute(run))\ncls.primary, cls.secondary")
    nb.code(src, "".join(f"{e.signal} = {_num(e.value)}  # {e.detail}\n" for e in cls.evidence),
            result=repr((cls.primary, tuple(cls.secondary))))


def _finding_rows(findings: list[dict]) -> list[list]:
    return [[i + 1, f["check"], f["root_cause"], f["confirmed"], _loc(f.get("location")),
             f.get("explanation", "")] for i, f in enumerate(findings)]


def _isolate(nb: _Notebook, session: DebugSession) -> None:
    nb.md("## 3. Isolate")
    events = [e for e in session.events if e["kind"] == "isolate"]
    if not events:
        nb.md(f"**Not reached**: {session.gates()['isolate'] or 'no probes have run yet'}.")
        return
    for n, e in enumerate(events, 1):
        findings = e.get("findings", [])
        head = f"### Isolate, round {n}" if len(events) > 1 else ""
        confirmed = [f for f in findings if f["confirmed"]]
        verdict = (f"Root cause: **`{confirmed[0]['check']}`** ({confirmed[0]['root_cause']}) at "
                   f"`{_loc(confirmed[0].get('location'))}`." if confirmed else
                   "**No confirmed finding**: a hypothesis is not a root cause, so the Fix gate "
                   "stays closed.")
        table = _table(["#", "check", "root cause", "confirmed", "file:line", "explanation"],
                       _finding_rows(findings)) if findings else "No probe reported a finding."
        nb.md(head, f"{len(findings)} findings ({len(confirmed)} confirmed). {verdict}", table)
        timing = e.get("probe_seconds") or {}
        out = "".join(f"{f['check']}: {json.dumps(f.get('evidence', {}), default=str)}\n"
                      for f in findings)
        if timing:
            out += "probe seconds: " + ", ".join(f"{k}={_num(v)}" for k, v in timing.items())
            out += "\n"
        if e.get("noise"):
            out += f"seed noise: {json.dumps(e['noise'], default=str)}\n"
        nb.code(f"# Isolate round {n}: the measured evidence behind each finding\n"
                f"from model_debugger.session import DebugSession\n"
                f"events = DebugSession.load({session.directory!r}).events\n"
                f"[e for e in events if e['kind'] == 'isolate'][{n - 1}]['findings']", out)


def _finding_for(session: DebugSession, check: str, upto: int) -> dict | None:
    """The finding a fix addresses, as the latest Isolate round before the fix reported it."""
    return next((f for e in reversed(session.events[:upto]) if e["kind"] == "isolate"
                 for f in e.get("findings", []) if f["check"] == check), None)


def _fix(nb: _Notebook, session: DebugSession) -> None:
    nb.md("## 4. Fix")
    events = [e for e in session.events if e["kind"] == "fix"]
    if not events:
        nb.md(f"**Not reached**: {session.gates()['fix'] or 'no fix has been planned yet'}.")
        return
    for n, e in enumerate(events, 1):
        fix = e["fix"]
        f = _finding_for(session, fix.get("finding"), e["seq"]) or {}
        overrides = fix.get("overrides") or []
        nb.md(f"### Fix {n}: `{fix.get('finding')}`",
              f"**Finding addressed**: `{fix.get('finding')}` — root cause "
              f"**{fix.get('root_cause')}** at `{_loc(fix.get('location') or f.get('location'))}`"
              f" (confirmed: {_num(f.get('confirmed'))}).\n\n{f.get('explanation', '')}",
              f"**Suggestion**: {fix.get('suggestion') or '—'}",
              f"**Expected effect**: {fix.get('expected') or '—'}",
              f"**Touches**: {', '.join(fix.get('touches') or []) or '—'}; "
              f"{len(fix.get('hunks') or [])} hunk(s); approved: {_num(fix.get('approved'))}.",
              "**Boundary overrides**: " + ("; ".join(overrides) if overrides else
                                            "none (every boundary held)."),
              f"The change (the session's copy of the fixed code is `{fix.get('copy')}`):",
              f"```diff\n{(fix.get('diff') or '').rstrip()}\n```")
        ver = next((x["verification"] for x in session.events[e["seq"]:]
                    if x["kind"] == "verify"), None)
        flags = ["--seeds", len(ver.get("seeds") or [])] if ver and ver.get("seeds") else []
        flags += ["--allow-architecture"] * any("architecture" in o for o in overrides)
        flags += ["--data-consent"] * any("preprocessing" in o for o in overrides)
        nb.code(_cmd("model-debugger", "verify", session.directory, "--fixed",
                     fix.get("fixed") or fix.get("copy") or "fixed.py", "--yes", *flags),
                f"fix plan for {fix.get('finding')} ({fix.get('root_cause')}) at "
                f"{_loc(fix.get('location'))}: approved\n"
                f"touches: {', '.join(fix.get('touches') or []) or '-'}\n"
                f"overrides: {'; '.join(overrides) or 'none'}\n")


def _verify_runs(session: DebugSession, n: int, v: dict) -> tuple[dict, dict]:
    folder = os.path.join(session.directory, "verify", str(n))
    art = _artifact(session)
    before, after = {}, {}
    for seed in v.get("seeds") or []:
        run = _load(os.path.join(folder, f"before-{seed}.jsonl"))
        if run is None and art.get("seed") is not None and n == 1:  # reused reproduce runs
            run = _load(os.path.join(session.directory, "runs", str(seed - art["seed"]),
                                     "record.jsonl"))
        if run is not None:
            before[seed] = run
        run = _load(os.path.join(folder, f"after-{seed}.jsonl"))
        if run is not None:
            after[seed] = run
    return before, after


def _side_row(name: str, side: dict, seeds: list) -> list:
    vals = list(side.get("values") or [])
    vals += [None] * (len(seeds) - len(vals))
    return [name, *vals[:len(seeds)], side.get("mean"), side.get("std"), side.get("present")]


def _verify(nb: _Notebook, session: DebugSession) -> None:
    nb.md("## 5. Verify")
    events = [e for e in session.events if e["kind"] == "verify"]
    if not events:
        nb.md(f"**Not reached**: {session.gates()['verify'] or 'not verified yet'}.")
        return
    for n, e in enumerate(events, 1):
        v = e["verification"]
        seeds = v.get("seeds") or []
        b, a = v.get("before") or {}, v.get("after") or {}

        scale = " (log10)" if v.get("scale") == "log10" else ""
        table = _table(["", *[f"seed {s}" for s in seeds], "mean", "std", "problem present"],
                       [_side_row("before", b, seeds), _side_row("after", a, seeds)])
        remaining = v.get("remaining") or []
        nb.md(f"### Verify {n}: `{v.get('finding')}`",
              f"Signal that defined `{v.get('category')}`: **`{v.get('metric')}`**{scale}, "
              f"{v.get('direction')} is better; compared across {len(seeds)} seed(s).", table,
              _table(["noise band", "improvement", "verdict", "remaining symptom",
                      "other categories after"],
                     [[v.get("noise_band"), v.get("improvement"), v.get("verdict"),
                       v.get("remaining_symptom") or "none", ", ".join(remaining) or "none"]]),
              f"**Verdict: {v.get('verdict')}**."
              + (" Back to Isolate with the remaining symptom."
                 if v.get("verdict") == "partially_resolved" else ""))
        before, after = _verify_runs(session, n, v)
        figures = [(_plots.verification_figure(v), f"{v.get('metric')} before/after")]
        if before or after:
            figures.append((_plots.before_after_loss_figure(before, after), "loss before/after"))
        out = "".join(f"{name}: " + ", ".join(f"seed {s}={_num(x)}" for s, x in
                                              zip(seeds, side.get("values") or []))
                      + f"; mean {_num(side.get('mean'))}; present {side.get('present')}\n"
                      for name, side in (("before", b), ("after", a)))
        out += (f"noise band {_num(v.get('noise_band'))}, improvement "
                f"{_num(v.get('improvement'))}\nverdict: {v.get('verdict')}\n"
                f"remaining symptom: {v.get('remaining_symptom') or 'none'}\n")
        nb.code(f"# verification {n}: records under {os.path.join(session.directory, 'verify', str(n))}",
                out, figures)


# -- public API ---------------------------------------------------------------------------------
def _session(session: DebugSession | str) -> DebugSession:
    return DebugSession.load(session) if isinstance(session, (str, os.PathLike)) else session


def build_notebook(session: DebugSession | str):
    """The session as an ``nbformat`` v4 notebook node (not written; see :func:`export_notebook`)."""
    import nbformat

    session = _session(session)
    art = _artifact(session)
    nb = _Notebook()
    data = getattr(session, "_data", {})
    created = data.get("created")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(created)) if created else "—"
    rep = session.report()
    gates = session.gates()
    kinds = {e["kind"] for e in session.events}
    status = [[p.capitalize(), "done" if p in kinds else ("open" if gates[p] is None
                                                                  else f"blocked: {gates[p]}")]
              for p in PHASES]
    nb.md(f"# model_debugger session `{session.id}`",
          f"{data.get('title') or art.get('script') or art.get('path') or ''} — created {stamp}. "
          f"Current phase: **{rep['phase']}**; fix allowed: {_num(rep['fix_allowed'])}; "
          f"queue: {', '.join(rep.get('queue') or []) or 'empty'}.",
          "Reproduce → Classify → Isolate → Fix → Verify. Re-run the reproduction with "
          "`python repro.py` (written next to this notebook by `model-debugger export`).",
          _table(["phase", "status"], status))
    _reproduce(nb, session, art)
    _classify(nb, session, art)
    _isolate(nb, session)
    _fix(nb, session)
    _verify(nb, session)
    notebook = nb.v4.new_notebook(cells=nb.cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "model_debugger": {"session": session.id, "schema": REPORT_SCHEMA,
                           "phase": rep["phase"], "session_dir": session.directory},
    })
    nbformat.validate(notebook)
    return notebook


def export_notebook(session: DebugSession | str, path: str | None = None) -> str:
    """Write the session as a validated nbformat v4 notebook.

    Parameters
    ----------
    session : DebugSession or str
        A session or its folder.
    path : str, optional
        Where to write (default ``<session dir>/<session id>.ipynb``).

    Returns
    -------
    str
        The path written.
    """
    import nbformat

    session = _session(session)
    notebook = build_notebook(session)
    notebook.metadata["model_debugger"]["exported"] = time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                    time.gmtime())
    path = path or os.path.join(session.directory, f"{session.id}.ipynb")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    nbformat.write(notebook, path, version=4)
    return path


def export(session: DebugSession | str, path: str | None = None,
           repro: str | None = None) -> dict:
    """Write the notebook and ``repro.py`` (default: beside it); ``{"notebook", "repro"}``."""
    session = _session(session)
    notebook = export_notebook(session, path)
    repro = write_repro(session, repro or os.path.join(
        os.path.dirname(os.path.abspath(notebook)), "repro.py"))
    return {"notebook": notebook, "repro": repro}
