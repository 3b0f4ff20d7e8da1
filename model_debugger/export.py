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
import contextvars
import json
import math
import os
import re
import time

import numpy as np

from . import figures as _figures
from . import views
from ._repro import NOQA, _artifact, _int, _Paths, repro_source, write_repro
from .logs import load_log
from .records import Run
from .redact import REDACTED, redact, redact_args, redact_code
from .safe_write import (
    TargetExists,
    UnsafePath,
    check_component,
    check_target,
    inside,
    write_inside,
)
from .session import REPORT_SCHEMA, DebugSession
from .store import ARTIFACT, REPRO, Store, cell_copy

__all__ = ["REDACTED", "TargetExists", "UnsafePath", "build_notebook", "export", "export_files",
           "export_notebook", "redact", "redact_args", "verify_runs", "write_repro"]

# -- small formatting helpers -----------------------------------------------------------------
# Every recorded string that reaches markdown goes through _t (free text) or _c (code), each
# value redacted once, on its own: HTML is escaped, markdown that could make links, images,
# math, headings or code is neutralised. No pass runs over the markdown once it is built (a
# second redaction would read the markup as text and could eat a closing backtick).
# Absolute paths in any recorded text (tracebacks, error messages) are shown as _Paths shows a
# location: relative to the session's folder of origin, else under ``~``.
_MD_ACTIVE = re.compile(r"([\\`*\[\]#$!~])")
_REDACTED_ESC = re.escape("\\[REDACTED\\]")
_PATHS: contextvars.ContextVar = contextvars.ContextVar("model_debugger_export_paths",
                                                        default=None)


def _clean(v) -> str:
    """A recorded value as text: redacted, absolute home/session paths shortened."""
    text = redact(_num(v))
    paths = _PATHS.get()
    return paths.text(text) if paths is not None else text


def _escaped(v) -> str:
    text = _clean(v).replace("\r", " ").replace("\n", " ")
    text = _MD_ACTIVE.sub(r"\\\1", text)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    # keep our own marker readable where it cannot start a link
    return re.sub(_REDACTED_ESC + r"(?![(\[:])", REDACTED, text)


def _t(v) -> str:
    """A recorded value as inert markdown text (one line)."""
    return _escaped(v)


def _c(v) -> str:
    """A recorded value as inline code: ``<code>`` around escaped text, nothing to break out of.

    Not a backtick span: its content is HTML-escaped and its markdown neutralised like
    :func:`_t`, so no backtick, ``<`` or ``&`` in the value can end it or start markup.
    """
    text = _escaped(v)
    return f"<code>{text if text.strip() else '&nbsp;'}</code>"


def _fenced(text: str, lang: str = "") -> str:
    """A fenced code block whose fence is longer than any backtick run inside."""
    text = _clean(text or "")
    longest = max((len(r) for r in re.findall(r"`{3,}|~{3,}", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text}\n{fence}"


def _num(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _cell(v) -> str:
    if isinstance(v, (int, float)) or v is None:
        return _num(v)
    return _t(v).replace("|", "\\|")


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _loc(loc: dict | None, rel=None) -> str:
    if not isinstance(loc, dict) or not loc.get("file"):
        return "—"
    cell = cell_copy(loc["file"]) if isinstance(loc["file"], str) else None
    if cell:
        return f"%%{cell} cell, line {loc.get('line')}"
    return f"{rel(loc['file']) if rel else loc['file']}:{loc.get('line')}"


def _cmd(*parts) -> str:
    """A Python cell calling the CLI with a list of literal arguments: nothing is expanded."""
    args = ", ".join(repr(_clean(str(p))) for p in parts)
    return f"import model_debugger.cli\nmodel_debugger.cli.main([{args}])"


class _Notebook:
    """Cells with positional ids and execution counts, redacted as they are added."""

    def __init__(self) -> None:
        import nbformat.v4 as v4

        self.v4 = v4
        self.cells: list = []
        self.count, self.noqa = 0, False

    def _id(self) -> str:
        return f"md-{len(self.cells) + 1}"

    def md(self, *parts: str) -> None:
        """Add a markdown cell, as is.

        ``parts`` are built only from :func:`_t`/:func:`_c`/:func:`_fenced`/:func:`_table`
        values (each redacted on its own) and our own fixed text.
        """
        text = "\n\n".join(p for p in parts if p)
        self.cells.append(self.v4.new_markdown_cell(text, id=self._id()))

    def code(self, source: str, text: str = "", figures=(), result: str | None = None) -> None:
        """Add a code cell with its outputs (plain text, figures, a result).

        ``source`` is built from :func:`_cmd` and ``repr`` of :func:`_clean` values and added as
        is (a pass over the Python would change what it does); outputs are plain text.
        """
        self.count += 1
        if not self.noqa and not source.startswith("%%"):  # a cell magic must stay first
            source, self.noqa = f"{NOQA}\n{source}", True  # the code as it ran: lint skips it
        outputs = []
        if text:
            outputs.append(self.v4.new_output("stream", name="stdout", text=_clean(text)))
        for fig, caption in figures:
            outputs.append(self.v4.new_output("display_data", data={
                "image/png": _png(fig), "text/plain": _clean(f"<Figure: {caption}>")}))
        if result is not None:
            outputs.append(self.v4.new_output("execute_result", data={"text/plain": _clean(result)},
                                              execution_count=self.count))
        self.cells.append(self.v4.new_code_cell(source, id=f"code-{len(self.cells) + 1}",
                                                execution_count=self.count, outputs=outputs))


def _png(fig) -> str:
    return base64.b64encode(_figures.figure_png(fig)).decode("ascii")


def _load(session: DebugSession, *parts: str) -> Run | None:
    """A record of the session folder, never read through a symlink; None when missing.

    It is named as :mod:`~model_debugger.store` names it (e.g. ``Store.run_rel(0)``) or by its
    parts. The file is read once through :meth:`Store.read` (no link followed) and parsed from those
    bytes: no second open that a swapped-in symlink could redirect.
    """
    rel = "/".join(parts)
    data = session.store.read(rel)
    if data is None:
        return None
    if os.path.isdir(Store.ranks_beside(session.store.path(rel))):  # a multi-process job
        from .ranks import load_job

        return load_job(session.store.path(rel))
    return Run.parse(data)


def _log_run(session: DebugSession, art: dict) -> Run:
    """The log session's copy (inside the session folder) read again; never ``art['path']``."""
    copy = art.get("copy")
    if not isinstance(copy, str):
        raise ValueError("the session keeps no copy of the log")
    check_component(copy, "log copy")
    data = session.store.read(copy)
    if data is None:
        raise ValueError(f"the session's copy {copy!r} is missing or not a regular file")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="md-export-log-") as folder:
        path = os.path.join(folder, copy)
        with open(path, "wb") as fh:
            fh.write(data)
        return load_log(path, art.get("error") if isinstance(art.get("error"), str) else None)


# -- sections -----------------------------------------------------------------------------------
def _run_row(i: int, seed, run: Run | None, category: str) -> list:
    if run is None or not run.steps:
        return [i + 1, seed, 0, None, None, None, None, None, category]
    loss, gn = run.series("loss"), run.series("gn")
    fin = loss[np.isfinite(loss)]
    bad, step = run.first("nonfinite"), _figures.first_nonfinite(run)
    first_bad = (f"step {bad.get('step')} ({bad.get('what')}, {bad.get('module') or '—'})"
                 if bad else (f"step {step}" if step is not None else None))
    return [i + 1, seed, len(run.steps), float(loss[0]) if np.isfinite(loss[0]) else str(loss[0]),
            float(fin[-1]) if fin.size else None, float(fin.min()) if fin.size else None,
            float(np.nanmax(gn)) if np.isfinite(gn).any() else None, first_bad, category]


def _magic(line: str, code: str | None = None) -> str:
    """A cell of our magics, as the kernel ran it.

    ``line`` is built from our own words and numbers only; ``code`` (the user's cell) is
    redacted as code, so it still runs.
    """
    return f"%{line}" if code is None else f"%%{line}\n{redact_code(code).rstrip(chr(10))}"


def _cell_reproduce(nb: _Notebook, session: DebugSession, art: dict, rep: dict | None,
                    rel: _Paths) -> tuple[str, str]:
    """What a notebook session reproduced.

    The cell run in the kernel, its restored state and the earlier cells it depends on; the
    ``%%reproduce`` cell that ran it.
    """
    code = art.get("code") if isinstance(art.get("code"), str) else ""
    prelude = art.get("prelude") if isinstance(art.get("prelude"), str) else ""
    restores = [str(r) for r in art.get("restores") or []]
    seed = _int(art.get("seed"))
    runs = _int((rep or {}).get("runs", {}).get("total")) or 1
    flags = (f" --runs {runs}" if runs > 1 else "") + (f" --seed {seed}" if seed is not None
                                                        else "")
    restored = ("before each run the kernel's state was restored to what the cell started "
                "from: " + ", ".join(_c(r) for r in restores) if restores else
                "it found no model, optimizer or array to restore between runs")
    what = (f"The notebook cell below ran under instrumentation **in the kernel** ({runs} "
            f"run(s), seed {_num(seed)}); {restored}. The session keeps the cell in "
            f"{_c(rel(session.store.path(art.get('copy') or 'cell.py')))} and, with the earlier "
            f"cells it depends on, in {_c(rel(session.store.path(ARTIFACT)))}; "
            f"`python repro.py` runs those cells and the cell stand-alone.")
    if prelude.strip():
        what += "\n\nThe earlier cells it depends on (run before it, not under capture):\n\n" \
            + _fenced(prelude.rstrip(), "python")
    else:
        what += "\n\nIt depends on no earlier cell."
    return what, _magic("reproduce" + flags, code)


def _launch_flags(launch) -> list:
    """The ``diagnose`` flags of a multi-process job (its recorded launch options)."""
    if not isinstance(launch, dict):
        return []
    out = []
    for key in ("nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port",
                "collective_timeout"):
        value = launch.get(key)
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            out += [f"--{key.replace('_', '-')}", value]
    return out


def _reproduce(nb: _Notebook, session: DebugSession, art: dict, rel: _Paths) -> None:
    rep = session.reproduce
    nb.md("## 1. Reproduce")
    seed = _int(art.get("seed"))
    if art.get("type") == "log":
        error = art.get("error") if isinstance(art.get("error"), str) else None
        cmd = _cmd("diagnose", rel(art.get("path")) if art.get("path") else "LOG",
                   *(["--error", error] if error else []))
        what = (f"Nothing could be run: a **minimal reproducer** — the log {_c(rel(art.get('path')))}"
                + (f" and the error text {_c(error)}" if error else "") + ".")
    elif art.get("type") == "cell":
        what, cmd = _cell_reproduce(nb, session, art, rep, rel)
    else:
        args = redact_args([str(a) for a in art.get("args") or []])
        runs = _int((rep or {}).get("runs", {}).get("total")) or 1
        seconds = art.get("max_seconds") if isinstance(art.get("max_seconds"), (int, float)) \
            else None
        cmd = _cmd("diagnose", rel(art.get("script")) if art.get("script") else "SCRIPT",
                   "--runs", runs, *(["--seed", seed] if seed is not None else []),
                   *(["--max-seconds", seconds] if seconds else []),
                   *_launch_flags(art.get("launch")),
                   *(["--", *args] if args else []))
        limit = f"{_num(seconds)} s" if seconds else "none"
        shown = ", ".join(_c(a) for a in args) or "none"
        what = (f"The script {_c(rel(art.get('script')))} ran under instrumentation in a child "
                f"process (arguments {shown}, seed {_num(seed)}, time limit {limit})."
                f" The session's copy of the code is "
                f"{_c(rel(session.store.path(ARTIFACT)))}; `python repro.py` re-runs it.")
    if rep is None:
        nb.md(what, "**Not reached**: no reproduce record yet.")
        return
    nb.md(what, f"**Verdict: {_t(rep.get('status'))}** ({_t(rep.get('summary'))}); problem: "
                f"{_c(rep.get('problem') or 'none')}.")
    lines = [f"reproduce: {rep.get('summary')} ({rep.get('problem') or 'no problem'})",
             f"steps: {rep.get('steps')}, epochs: {rep.get('epochs')}, "
             f"seconds: {_num(rep.get('seconds'))}",
             f"error: {rep.get('error') or 'none'}"
             + (f" at {_loc(rep.get('error_location'), rel)}" if rep.get("error_location")
                else "")]
    code = rep.get("code") if isinstance(rep.get("code"), dict) else {}
    lines += [f"code: {k} at {_loc(v, rel)}" for k, v in code.items()]
    lines += [f"tried: {t}" for t in rep.get("tried", [])]
    figures, runs, rows = [], [], []
    total = _int(rep.get("runs", {}).get("total")) or 0
    cats = rep.get("runs", {}).get("categories", [])
    if art.get("type") == "log":
        run = None
        try:
            run = _log_run(session, art)
        except (ValueError, OSError, KeyError) as exc:
            lines.append(f"(the log cannot be read again for plots: {exc})")
        runs = [run] if run is not None else []
        rows = [_run_row(0, None, run, cats[0] if cats else "—")]
    else:
        for i in range(min(total, 1000)):
            run = _load(session, Store.run_rel(i))
            rows.append(_run_row(i, None if seed is None else seed + i, run,
                                 cats[i] if i < len(cats) else "—"))
            if run is not None:
                runs.append(run)
    if runs:
        figures.append((_figures.loss_figure(runs, [f"run {i + 1}" for i in range(len(runs))]),
                        "loss per step"))
        if any(r.steps and "gn" in r.steps[0] for r in runs):
            figures.append((_figures.grad_norm_figure(runs[0], "Gradient norms per step (run 1)"),
                            "gradient norms, run 1"))
    nb.code(cmd, "\n".join(lines) + "\n", figures)
    nb.md("Per run:", _table(["run", "seed", "steps", "first loss", "final finite loss",
                               "min loss", "max grad norm", "first non-finite", "category"], rows))
    ranks = views.rank_table(rep.get("rank_table"))
    if ranks is not None:
        nb.md(f"Per rank of run 1 (world size {_num(rep.get('ranks'))}; each rank's own record):",
              _table(list(ranks.header), [list(row) for row in ranks.rows]))
    errors = [r.error for r in runs if r is not None and isinstance(r.error, dict)
              and isinstance(r.error.get("traceback"), str)]
    if errors:
        tb = "\n".join(errors[0]["traceback"].splitlines()[-30:])
        nb.md("The run's error (last lines of the traceback):", _fenced(tb))


def _classify(nb: _Notebook, session: DebugSession, art: dict, rel: _Paths) -> None:
    nb.md("## 2. Classify")
    cls = session.classification
    if cls is None:
        nb.md(f"**Not reached**: {_t(session.gates()['classify'] or 'no classification yet')}.")
        return
    ev = [[e.signal, e.value, e.detail] for e in cls.evidence]
    nb.md(f"Primary category: **{_c(cls.primary)}**"
          + (f"; secondary (handled after the primary is verified): "
             f"{', '.join(_c(c) for c in cls.secondary)}" if cls.secondary else "") + ".",
          "The numbers behind it:", _table(["signal", "value", "detail"], ev) if ev else "")
    if art.get("type") == "log":
        copy = art.get("copy") if isinstance(art.get("copy"), str) else "log.csv"
        src = (f"from model_debugger.logs import load_log\n"
               f"run = load_log({_clean(rel(session.store.path(copy)))!r}, "
               f"{_clean(art.get('error')) if isinstance(art.get('error'), str) else None!r})\n")
    else:
        record = (session.reproduce or {}).get("record")
        if not isinstance(record, str):
            record = Store.run_rel(0)
        src = (f"from model_debugger.records import Run\n"
               f"run = Run.load({_clean(rel(session.store.path(record)))!r})\n")
    src += ("from model_debugger.classify import classify\nfrom model_debugger.signals import "
            "compute\ncls = classify(compute(run))\ncls.primary, cls.secondary")
    nb.code(src, "".join(f"{e.signal} = {_num(e.value)}  # {e.detail}\n" for e in cls.evidence),
            result=repr((cls.primary, tuple(cls.secondary))))


def _finding_rows(findings: list[dict], rel: _Paths) -> list[list]:
    return [[i + 1, f["check"], f["root_cause"], f["confirmed"], _loc(f.get("location"), rel),
             f.get("explanation", "")] for i, f in enumerate(findings)]


def _isolate(nb: _Notebook, session: DebugSession, rel: _Paths) -> None:
    nb.md("## 3. Isolate")
    events = [e for e in session.events if e["kind"] == "isolate"]
    if not events:
        nb.md(f"**Not reached**: {_t(session.gates()['isolate'] or 'no probes have run yet')}.")
        return
    for n, e in enumerate(events, 1):
        findings = e.get("findings", [])
        head = f"### Isolate, round {n}" if len(events) > 1 else ""
        confirmed = [f for f in findings if f["confirmed"]]
        verdict = (f"Root cause: **{_c(confirmed[0]['check'])}** "
                   f"({_t(confirmed[0]['root_cause'])}) at "
                   f"{_c(_loc(confirmed[0].get('location'), rel))}." if confirmed else
                   "**No confirmed finding**: a hypothesis is not a root cause, so the Fix gate "
                   "stays closed.")
        table = _table(["#", "check", "root cause", "confirmed", "file:line", "explanation"],
                       _finding_rows(findings, rel)) if findings else \
            "No probe reported a finding."
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
                f"events = DebugSession.load({_clean(rel(session.directory))!r}).events\n"
                f"[e for e in events if e['kind'] == 'isolate'][{n - 1}]['findings']", out)


def _finding_for(session: DebugSession, check: str, upto: int) -> dict | None:
    """The finding a fix addresses, as the latest Isolate round before the fix reported it."""
    return next((f for e in reversed(session.events[:upto]) if e["kind"] == "isolate"
                 for f in e.get("findings", []) if f["check"] == check), None)


def _fix(nb: _Notebook, session: DebugSession, art: dict, rel: _Paths) -> None:
    nb.md("## 4. Fix")
    events = [e for e in session.events if e["kind"] == "fix"]
    if not events:
        nb.md(f"**Not reached**: {_t(session.gates()['fix'] or 'no fix has been planned yet')}.")
        return
    cell = art.get("type") == "cell"
    for n, e in enumerate(events, 1):
        fix = e["fix"]
        f = _finding_for(session, fix.get("finding"), e["seq"]) or {}
        overrides = [str(o) for o in fix.get("overrides") or []]
        touches = ", ".join(str(t) for t in fix.get("touches") or [])
        nb.md(f"### Fix {n}: {_c(fix.get('finding'))}",
              f"**Finding addressed**: {_c(fix.get('finding'))} — root cause "
              f"**{_t(fix.get('root_cause'))}** at "
              f"{_c(_loc(fix.get('location') or f.get('location'), rel))}"
              f" (confirmed: {_t(f.get('confirmed'))}).\n\n{_t(f.get('explanation', ''))}",
              f"**Suggestion**: {_t(fix.get('suggestion') or '—')}",
              f"**Expected effect**: {_t(fix.get('expected') or '—')}",
              f"**Touches**: {_t(touches or '—')}; "
              f"{len(fix.get('hunks') or [])} hunk(s); approved: {_t(fix.get('approved'))}.",
              "**Boundary overrides**: " + ("; ".join(_t(o) for o in overrides) if overrides else
                                            "none (every boundary held)."),
              f"The change (the session's copy of the fixed code is {_c(fix.get('copy'))}):",
              _fenced(str(fix.get("diff") or "").rstrip(), "diff"))
        ver = next((x["verification"] for x in session.events[e["seq"]:]
                    if x["kind"] == "verify"), None)
        flags = ["--allow-architecture"] * any("architecture" in o for o in overrides)
        flags += ["--data-consent"] * any("preprocessing" in o for o in overrides)
        said = (f"fix plan for {fix.get('finding')} ({fix.get('root_cause')}) at "
                f"{_loc(fix.get('location'), rel)}: approved\n"
                f"touches: {touches or '-'}\n"
                f"overrides: {'; '.join(overrides) or 'none'}\n")
        if cell:  # the %%fix cell held the fixed code; %verify ran it (section 5)
            copy = fix.get("copy")
            data = session.store.read(copy) if isinstance(copy, str) else None
            fixed = data.decode("utf-8", "surrogateescape") if data is not None else ""
            nb.code(_magic(" ".join(["fix", "--yes", *flags]), fixed), said)
            continue
        if ver and ver.get("seeds"):
            flags = ["--seeds", len(ver.get("seeds") or []), *flags]
        fixed = fix.get("fixed") or fix.get("copy") or "fixed.py"
        nb.code(_cmd("verify", rel(session.directory), "--fixed", rel(str(fixed)), "--yes",
                     *flags), said)


def _seed_key(seed) -> int | None:
    """A seed as records name it (an int, or its text in JSON keys), else None."""
    if _int(seed) is not None:
        return seed
    if isinstance(seed, str) and seed.isdigit():
        return int(seed)
    return None


def _verify_records(session: DebugSession, n: int, v: dict) -> dict[str, dict[int, str | None]]:
    """Which record each side's run of the ``n``-th Verify came from.

    ``{"before": {seed: record}, "after": {...}}``, relative to the session folder (None: not
    known). Verify names them (``verification.records``), including the runs it reused from earlier
    (a reproduction run, an earlier Verify's runs of the same code). A session from before
    records were named: the runs written under ``verify/<n>/``, and for the first Verify the
    reproduction run of each seed it reused.
    """
    named = v.get("records")
    out: dict[str, dict[int, str | None]] = {"before": {}, "after": {}}
    if isinstance(named, dict) and named:
        for side in out:
            for seed, record in (named.get(side) or {}).items():
                key = _seed_key(seed)
                if key is not None and isinstance(record, str):
                    out[side][key] = record
        return out
    start = _int(_artifact(session).get("seed"))
    for seed in v.get("seeds") or []:
        if _seed_key(seed) is None:
            continue  # record file names are built from integer seeds only
        for side in out:
            record = Store.verify_rel(n, side, seed)
            if side == "before" and not session.store.exists(record):
                record = Store.run_rel(seed - start) if n == 1 and start is not None \
                    and seed >= start else None
            out[side][seed] = record
    return out


def verify_runs(session: DebugSession, n: int, v: dict) -> tuple[dict, dict]:
    """The before and after runs of the ``n``-th Verify (from 1), by seed (those that can be read).

    ``v`` is that Verify's ``verification`` JSON.
    """
    records = _verify_records(session, n, v)
    runs: list[dict] = [{}, {}]
    for side, found in zip(("before", "after"), runs):
        for seed, record in records[side].items():
            run = _load(session, record) if record else None
            if run is not None:
                found[seed] = run
    return runs[0], runs[1]


def _side_row(name: str, side: dict, seeds: list) -> list:
    vals = list(side.get("values") or [])
    vals += [None] * (len(seeds) - len(vals))
    return [name, *vals[:len(seeds)], side.get("mean"), side.get("std"), side.get("present")]


def _verify(nb: _Notebook, session: DebugSession, art: dict, rel: _Paths) -> None:
    nb.md("## 5. Verify")
    events = [e for e in session.events if e["kind"] == "verify"]
    if not events:
        nb.md(f"**Not reached**: {_t(session.gates()['verify'] or 'not verified yet')}.")
        return
    for n, e in enumerate(events, 1):
        v = e["verification"]
        seeds = v.get("seeds") or []
        b, a = v.get("before") or {}, v.get("after") or {}

        scale = " (log10)" if v.get("scale") == "log10" else ""
        table = _table(["", *[f"seed {_t(s)}" for s in seeds], "mean", "std",
                        "problem present"],
                       [_side_row("before", b, seeds), _side_row("after", a, seeds)])
        remaining = [str(r) for r in v.get("remaining") or []]
        nb.md(f"### Verify {n}: {_c(v.get('finding'))}",
              f"Signal that defined {_c(v.get('category'))}: **{_c(v.get('metric'))}**{scale}, "
              f"{_t(v.get('direction'))} is better; compared across {len(seeds)} seed(s).", table,
              _table(["noise band", "improvement", "verdict", "remaining symptom",
                      "other categories after"],
                     [[v.get("noise_band"), v.get("improvement"), v.get("verdict"),
                       v.get("remaining_symptom") or "none", ", ".join(remaining) or "none"]]),
              f"**Verdict: {_t(v.get('verdict'))}**."
              + (" Back to Isolate with the remaining symptom."
                 if v.get("verdict") == "partially_resolved" else ""))
        records = _verify_records(session, n, v)
        before, after = verify_runs(session, n, v)
        figures = [(_figures.verification_figure(v), f"{v.get('metric')} before/after")]
        if before or after:
            figures.append((_figures.before_after_loss_figure(before, after),
                            "loss before/after"))
        out = "".join(f"{name}: " + ", ".join(f"seed {s}={_num(x)}" for s, x in
                                              zip(seeds, side.get("values") or []))
                      + f"; mean {_num(side.get('mean'))}; present {side.get('present')}\n"
                      for name, side in (("before", b), ("after", a)))
        out += (f"noise band {_num(v.get('noise_band'))}, improvement "
                f"{_num(v.get('improvement'))}\nverdict: {v.get('verdict')}\n"
                f"remaining symptom: {v.get('remaining_symptom') or 'none'}\n")
        for side in ("before", "after"):
            for seed, record in records[side].items():
                reused = " (reused, not run again)" if record and \
                    record != Store.verify_rel(n, side, seed) else ""
                missing = "" if seed in (before if side == "before" else after) else \
                    " (not found)"
                out += f"{side} seed {seed}: {record or 'unknown record'}{reused}{missing}\n"
        if art.get("type") == "cell":
            source = _magic(f"verify --seeds {len(seeds)}")
        else:
            shown = {side: {seed: _clean(r) for seed, r in records[side].items() if r}
                     for side in records}
            source = (f"# verification {n}: the record of each side's run, relative to the "
                      f"session folder\nrecords = {shown!r}")
        nb.code(source, out, figures)


# -- public API ---------------------------------------------------------------------------------
def _session(session: DebugSession | str) -> DebugSession:
    return DebugSession.load(session) if isinstance(session, (str, os.PathLike)) else session


def build_notebook(session: DebugSession | str):
    """The session as an ``nbformat`` v4 notebook node (not written; see :func:`export_notebook`).

    Every recorded string is data: escaped in markdown, ``repr``'d in code, never expanded;
    recorded paths are shown relative to the folder the session ran in.
    """
    import nbformat

    session = _session(session)
    art = _artifact(session)
    rel = _Paths(session, art)
    token = _PATHS.set(rel)
    try:
        return _build(session, art, rel, nbformat)
    finally:
        _PATHS.reset(token)


def _build(session: DebugSession, art: dict, rel: _Paths, nbformat):
    nb = _Notebook()
    data = getattr(session, "_data", {})
    created = data.get("created")
    stamp = (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(created))
             if isinstance(created, (int, float)) and math.isfinite(created) else "—")
    rep = session.report()
    gates = session.gates()
    status = [[p.capitalize(), f"blocked: {gates[p]}" if st == "blocked" else st]
              for p, st in session.state.strip]
    title = data.get("title") or rel(art.get("script") or art.get("path") or "")
    nb.md(f"# model_debugger session {_c(session.id)}",
          f"{_t(title or '')} — created {stamp}. "
          f"Current phase: **{_t(rep['phase'])}**; fix allowed: {_t(rep['fix_allowed'])}; "
          f"queue: {_t(', '.join(str(q) for q in rep.get('queue') or []) or 'empty')}.",
          "Reproduce → Classify → Isolate → Fix → Verify. Re-run the reproduction with "
          "`python repro.py` (written next to this notebook by "
          + ("`%md_export`" if art.get("type") == "cell" else "`model-debugger export`") + "). "
          "Paths are relative to the folder the session ran in.",
          _table(["phase", "status"], status))
    _reproduce(nb, session, art, rel)
    _classify(nb, session, art, rel)
    _isolate(nb, session, rel)
    _fix(nb, session, art, rel)
    _verify(nb, session, art, rel)
    notebook = nb.v4.new_notebook(cells=nb.cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "model_debugger": {"session": session.id, "schema": REPORT_SCHEMA,
                           "phase": rep["phase"], "session_dir": rel(session.directory)},
    })
    nbformat.validate(notebook)
    return notebook


def _notebook_text(session: DebugSession) -> str:
    import nbformat

    notebook = build_notebook(session)
    notebook.metadata["model_debugger"]["exported"] = time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                    time.gmtime())
    return nbformat.writes(notebook, version=4)


def _default_name(session: DebugSession) -> str:
    return check_component(session.id, "session id") + ".ipynb"


def _targets(session: DebugSession, path: str | None, root: str | None) -> tuple[str, str, str]:
    """``(root, notebook, repro)``: absolute targets and the folder they must stay inside."""
    if path is None:  # the session's own folder
        folder = session.directory
        return folder, session.store.path(_default_name(session)), session.store.path(REPRO)
    if root is None:  # an explicit path: the folder it names is the one the user chose
        notebook = os.path.abspath(os.path.expanduser(path))
        root = os.path.dirname(notebook)
        os.makedirs(root, exist_ok=True)
    else:
        root = os.path.realpath(os.path.expanduser(root))
        notebook = inside(root, path)
    if not notebook.endswith(".ipynb"):
        raise UnsafePath(f"{path!r}: the export path must end with .ipynb")
    return root, notebook, os.path.join(os.path.dirname(notebook), REPRO)


def export_files(session: DebugSession | str, path: str | None = None, *,
                 root: str | None = None, overwrite: bool = False) -> dict:
    """Write the notebook and ``repro.py`` beside it through the safe writer.

    Parameters
    ----------
    session : DebugSession or str
        A session or its folder.
    path : str, optional
        The notebook (``.ipynb``), absolute or relative to ``root``. Default: the session's own
        folder (``<session dir>/<id>.ipynb``), where earlier exports are replaced.
    root : str, optional
        The folder the targets must stay inside (the server root, the notebook's folder).
        Default: the folder ``path`` names.
    overwrite : bool
        Replace existing files outside the session folder (default: refuse).

    Returns
    -------
    dict
        ``{"notebook": path, "repro": path, "replaced": [paths that existed before]}``.

    Raises
    ------
    UnsafePath
        A target outside ``root``, through a symlink, or a bad session id.
    TargetExists
        A target exists and ``overwrite`` is false (nothing was written).
    OSError
        Writing failed (e.g. a full disk); previous files are intact.
    """
    session = _session(session)
    own = path is None
    root, notebook, repro = _targets(session, path, root)
    text = _notebook_text(session)
    source = repro_source(session)
    compile(source, repro, "exec")
    mode = 0o600 if own else 0o666
    for target in (notebook, repro):  # refuse before writing anything
        check_target(root, os.path.relpath(target, root), overwrite=own or overwrite)
    replaced = []
    for target, content in ((notebook, text), (repro, source)):
        if write_inside(root, os.path.relpath(target, root), content,
                        overwrite=own or overwrite, mode=mode):
            replaced.append(target)
    return {"notebook": notebook, "repro": repro, "replaced": replaced}


def export_notebook(session: DebugSession | str, path: str | None = None) -> str:
    """Write the session as a validated nbformat v4 notebook (atomically; see :func:`export`).

    Parameters
    ----------
    session : DebugSession or str
        A session or its folder.
    path : str, optional
        Where to write (default ``<session dir>/<session id>.ipynb``); an existing file there is
        replaced, a symlink is refused.

    Returns
    -------
    str
        The path written.
    """
    session = _session(session)
    root, notebook, _ = _targets(session, path, None)
    write_inside(root, os.path.relpath(notebook, root), _notebook_text(session), overwrite=True,
                 mode=0o600 if path is None else 0o666)
    return notebook


def export(session: DebugSession | str, path: str | None = None,
           repro: str | None = None) -> dict:
    """Write the notebook and ``repro.py`` (default: beside it); ``{"notebook", "repro"}``.

    The library call replaces existing files (never through a symlink); the front ends use
    :func:`export_files`, which refuses or reports replacements.
    """
    session = _session(session)
    if repro is None:
        out = export_files(session, path, overwrite=True)
        return {"notebook": out["notebook"], "repro": out["repro"]}
    notebook = export_notebook(session, path)
    return {"notebook": notebook, "repro": write_repro(session, repro)}
