"""Security suite for exports: the attacks of issue #14 against the real writers.

Crafted sessions go through the real REST handler on a token server (pytest-jupyter), the comm
command, the CLI and the library; notebooks are checked through real ``nbconvert --to html`` and
IPython's input transformer. Each test names the attack it holds against.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import textwrap

import nbformat
import pytest

from model_debugger import safe_write
from model_debugger.export import build_notebook, export, export_files
from model_debugger.records import Classification, Evidence, Finding
from model_debugger.session import DebugSession

pytest.importorskip("jupyter_server")
pytest.importorskip("pytest_jupyter")
pytest.importorskip("matplotlib")

from tornado.httpclient import HTTPClientError  # noqa: E402

pytest_plugins = ["pytest_jupyter.jupyter_server"]

XSS_NAME = '<img src=x onerror=alert(1)>'
XSS_ERROR = "RuntimeError: <script>alert('boom')</script> `code` <b onmouseover=alert(2)>"
XSS_LINK = "[click me](javascript:alert(3)) ![i](javascript:alert(4)) $\\href{javascript:x}{y}$"
EXPANDS = '{__import__("os").system("touch PWNED")}'
ODD = ['a"""b', "it's \"quoted\"", "new\nline", "{x}", "$HOME", "back\\slash", "ünïcødé ✓",
       "``` fence", "tab\tsep"]


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"model_debugger.server": True}}}


def _crafted(root, script: str = "train.py", args=(), error: str | None = None,
             explanation: str = "lr 3 diverges", cwd: str | None = None) -> DebugSession:
    """A script session as an attacker could leave it on disk (every phase up to Isolate)."""
    s = DebugSession.create(str(root), title=os.path.basename(script))
    with open(os.path.join(s.directory, "artifact.py"), "w") as fh:
        fh.write("print('train')\n")
    s._append("artifact", type="script", script=script, args=list(args), seed=0,
             max_seconds=None, **({"cwd": cwd} if cwd else {}))
    s.record_reproduce({"status": "reproduced", "summary": f"reproduced 1/1 {XSS_NAME}",
                        "steps": 5, "epochs": 1, "error": error, "seconds": 1.0,
                        "problem": "gradient_instability", "tried": [XSS_LINK],
                        "runs": {"total": 1, "reproduced": 1,
                                 "categories": ["gradient_instability"]}})
    s.record_classification(Classification("gradient_instability", (), (
        Evidence("first_nonfinite_step", 4, f"first non-finite {XSS_NAME}"),)), {})
    s.record_findings([Finding("lr_range", "hyperparameter", True, explanation,
                               {"file": script, "line": 42}, {"safe_lr": 0.05})])
    return s


def _edit(session: DebugSession, change) -> None:
    path = os.path.join(session.directory, "session.json")
    with open(path) as fh:
        data = json.load(fh)
    change(data)
    with open(path, "w") as fh:
        json.dump(data, fh)


async def _post(jp_fetch, body: dict) -> tuple[int, dict]:
    try:
        response = await jp_fetch("model-debugger", "export", method="POST",
                                  body=json.dumps(body))
    except HTTPClientError as exc:
        return exc.code, json.loads(exc.response.body)
    return response.code, json.loads(response.body)


def _files(folder) -> dict:
    out = {}
    for base, _dirs, names in os.walk(folder):
        for name in names:
            path = os.path.join(base, name)
            out[path] = open(path, "rb").read() if not os.path.islink(path) else b"<link>"
    return out


# -- REST: one safe writer ------------------------------------------------------------------
async def test_rest_session_id_with_dots_writes_nothing_outside(jp_fetch, jp_root_dir, tmp_path):
    s = _crafted(jp_root_dir / ".model_debugger")
    _edit(s, lambda d: d.update(id="../../../outside/x"))
    before = _files(tmp_path)
    code, data = await _post(jp_fetch, {"session": f".model_debugger/{s.id}"})
    assert code == 422, data
    assert "session id" in data["message"]
    assert not (tmp_path / "outside").exists()
    assert not list(tmp_path.rglob("x.ipynb"))
    assert _files(tmp_path) == before


@pytest.mark.parametrize("target", ["repro.py", "record.ipynb"])
async def test_rest_symlinked_target_file_is_not_followed(jp_fetch, jp_root_dir, tmp_path,
                                                          target):
    s = _crafted(jp_root_dir / ".model_debugger")
    victim = jp_root_dir / "victim.ipynb"  # inside the root: the old check let this through
    victim.write_text("precious\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("outside\n")
    (jp_root_dir / "out").mkdir()
    os.symlink(victim if target == "record.ipynb" else outside, jp_root_dir / "out" / target)
    code, data = await _post(jp_fetch, {"session": f".model_debugger/{s.id}",
                                        "path": "out/record.ipynb", "overwrite": True})
    assert code == 403, data
    assert "symlink" in data["message"]
    assert victim.read_text() == "precious\n" and outside.read_text() == "outside\n"
    assert os.path.islink(jp_root_dir / "out" / target)


async def test_rest_symlinked_repro_in_the_session_folder_is_not_followed(jp_fetch, jp_root_dir,
                                                                          tmp_path):
    s = _crafted(jp_root_dir / ".model_debugger")
    outside = tmp_path / "bashrc"
    outside.write_text("alias ls=ls\n")
    os.symlink(outside, os.path.join(s.directory, "repro.py"))
    code, data = await _post(jp_fetch, {"session": f".model_debugger/{s.id}"})
    assert code == 403, data
    assert outside.read_text() == "alias ls=ls\n"


@pytest.mark.parametrize("existing", [False, True])
async def test_rest_symlinked_parent_folder_is_not_followed(jp_fetch, jp_root_dir, existing):
    s = _crafted(jp_root_dir / ".model_debugger")
    (jp_root_dir / "elsewhere").mkdir()
    if existing:  # a file behind the link: still 403 (not 409, which would confirm it)
        (jp_root_dir / "elsewhere" / "repro.py").write_text("keep\n")
    os.symlink(jp_root_dir / "elsewhere", jp_root_dir / "alias")
    code, data = await _post(jp_fetch, {"session": f".model_debugger/{s.id}",
                                        "path": "alias/record.ipynb"})
    assert code == 403, data
    assert os.listdir(jp_root_dir / "elsewhere") == (["repro.py"] if existing else [])
    if existing:
        assert (jp_root_dir / "elsewhere" / "repro.py").read_text() == "keep\n"


async def test_rest_existing_files_are_409_unless_overwrite(jp_fetch, jp_root_dir):
    s = _crafted(jp_root_dir / ".model_debugger")
    (jp_root_dir / "out").mkdir()
    (jp_root_dir / "out" / "repro.py").write_text("# the user's own script\n")
    body = {"session": f".model_debugger/{s.id}", "path": "out/record.ipynb"}
    code, data = await _post(jp_fetch, body)
    assert code == 409, data
    assert "overwrite" in data["message"]
    assert not (jp_root_dir / "out" / "record.ipynb").exists()  # nothing half-written
    assert (jp_root_dir / "out" / "repro.py").read_text() == "# the user's own script\n"
    code, data = await _post(jp_fetch, {**body, "overwrite": True})
    assert code == 200, data
    assert data["replaced"] == ["out/repro.py"]
    nbformat.validate(nbformat.read(str(jp_root_dir / "out" / "record.ipynb"), as_version=4))
    (jp_root_dir / "out" / "repro.py").unlink()
    code, data = await _post(jp_fetch, body)  # the notebook alone exists now: still refused
    assert code == 409 and "record.ipynb" in data["message"], data
    code, data = await _post(jp_fetch, {**body, "overwrite": "yes"})
    assert code == 400


async def test_rest_log_session_never_embeds_an_arbitrary_path(jp_fetch, jp_root_dir, tmp_path):
    from model_debugger.diagnose import diagnose_log

    log = jp_root_dir / "train.csv"
    log.write_text("step,loss\n" + "".join(f"{i},{2.0 ** i}\n" for i in range(20)))
    s = diagnose_log(str(log), root=str(jp_root_dir / ".model_debugger"))
    secret = tmp_path / "id_rsa"
    secret.write_text("step,loss\n0,1\nPRIVATE-MATERIAL-7731\n")

    def point_outside(data):
        art = next(e for e in data["events"] if e["kind"] == "artifact")
        art["path"] = str(secret)
        art.pop("copy", None)
    _edit(s, point_outside)
    if os.path.exists(os.path.join(s.directory, "log.csv")):
        os.unlink(os.path.join(s.directory, "log.csv"))
    code, data = await _post(jp_fetch, {"session": f".model_debugger/{s.id}",
                                        "path": "exp/log.ipynb"})
    assert code == 200, data
    for name in ("exp/log.ipynb", "exp/repro.py"):
        assert "PRIVATE-MATERIAL" not in (jp_root_dir / name).read_text()
    # the contents API cannot read it either
    response = await jp_fetch("api", "contents", "exp", "repro.py")
    assert "PRIVATE-MATERIAL" not in json.loads(response.body)["content"]


async def test_rest_artifact_copy_symlink_is_not_embedded(jp_fetch, jp_root_dir, tmp_path):
    s = _crafted(jp_root_dir / ".model_debugger")
    secret = tmp_path / "credentials"
    secret.write_text("aws = 'CREDENTIAL-MATERIAL-991'\n")
    os.unlink(os.path.join(s.directory, "artifact.py"))
    os.symlink(secret, os.path.join(s.directory, "artifact.py"))
    code, data = await _post(jp_fetch, {"session": f".model_debugger/{s.id}",
                                        "path": "x/record.ipynb"})
    assert code == 200, data
    assert "CREDENTIAL-MATERIAL" not in (jp_root_dir / "x" / "repro.py").read_text()


# -- the comm: paths stay in the notebook's folder --------------------------------------------
class _Frontend:
    def __init__(self) -> None:
        self.sent: list[dict] = []

    def send(self, data=None, **_kw) -> None:
        self.sent.append(data)


@pytest.fixture
def kernel_ns(tmp_path, monkeypatch):
    from model_debugger import notebook

    (tmp_path / "nb").mkdir()
    ns = notebook.NotebookSession(namespace={"__name__": "__main__"},
                                  root=str(tmp_path / "nb" / ".model_debugger"))
    monkeypatch.chdir(tmp_path / "nb")
    ns.use(_crafted(tmp_path / "nb" / ".model_debugger"))
    yield ns
    ns.close()


def _request(kernel_ns, args: dict) -> dict:
    from model_debugger import comm as md_comm

    frontend = _Frontend()
    md_comm.Sidebar(kernel_ns).receive(frontend, {"content": {"data": {
        "type": "request", "id": "x", "command": "export", "args": args}}})
    return frontend.sent[-1]


@pytest.mark.parametrize("path", ["../escaped.ipynb", "TMP/abs.ipynb", "sub/../../up.ipynb"])
def test_comm_export_outside_the_notebook_folder_is_refused(kernel_ns, tmp_path, path):
    path = path.replace("TMP", str(tmp_path))
    before = _files(tmp_path)
    reply = _request(kernel_ns, {"path": path})
    assert reply["ok"] is False and "outside" in reply["error"], reply
    assert {p for p in _files(tmp_path) if not p.startswith(str(tmp_path / "nb"))} == \
        {p for p in before if not p.startswith(str(tmp_path / "nb"))}
    assert not list(tmp_path.glob("*.ipynb"))


def test_comm_does_not_overwrite_an_existing_notebook(kernel_ns, tmp_path):
    mine = tmp_path / "nb" / "analysis.ipynb"
    mine.write_text('{"my": "work"}')
    reply = _request(kernel_ns, {"path": "analysis.ipynb"})
    assert reply["ok"] is False and "exists" in reply["error"], reply
    assert mine.read_text() == '{"my": "work"}'
    reply = _request(kernel_ns, {"path": "analysis.ipynb", "overwrite": True})
    assert reply["ok"] is True, reply
    assert reply["result"]["replaced"] == [str(mine)]
    reply = _request(kernel_ns, {})  # the default lies in the session's own folder: re-export replaces
    assert reply["ok"] is True and _request(kernel_ns, {})["ok"] is True


# -- exports are data, never code -------------------------------------------------------------
def _html(nb) -> str:
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nb)
    return body


def _live(html: str) -> list[str]:
    """What a browser would run of the recorded text: tags, attributes and scripts with it."""
    from html.parser import HTMLParser

    found: list[str] = []

    class Parser(HTMLParser):
        script = False

        def handle_starttag(self, tag, attrs):
            self.script = tag == "script"
            for name, value in attrs:
                value = (value or "").strip().lower()
                if "alert" in value or value.startswith(("javascript:", "data:text/html")):
                    found.append(f"<{tag} {name}={value}>")
            if tag in ("img", "b", "iframe", "svg") and any(
                    (v or "") in ("x", "y") or n.startswith("on") for n, v in attrs):
                found.append(f"<{tag} {attrs}>")

        def handle_endtag(self, tag):
            self.script = False

        def handle_data(self, data):
            if self.script and "alert" in data:
                found.append(f"<script>{data[:80]}")

    Parser().feed(html)
    return found


def test_html_and_javascript_in_recorded_strings_stay_inert(tmp_path):
    s = _crafted(tmp_path / "sessions", script=str(tmp_path / f"{XSS_NAME}.py"),
                 args=[XSS_NAME], error=XSS_ERROR, explanation=f"{XSS_LINK} {XSS_ERROR}")
    _edit(s, lambda d: d.update(title=XSS_NAME + " <script>alert(5)</script>"))
    nb = build_notebook(DebugSession.load(s.directory))
    html = _html(nb)
    assert _live(html) == []
    # the text is still there for the reader, escaped
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "alert(&#39;boom&#39;)" in html or "alert('boom')" in html
    import re

    md = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert not re.search(r"(?<!\\)\]\(javascript:|(?<!\\)!\[", md)  # no live link or image
    assert "&lt;script&gt;alert('boom')&lt;/script&gt;" in md  # free text: HTML-escaped


def test_backticks_in_code_spans_cannot_break_out(tmp_path):
    name = "x` <img src=y onerror=alert(7)> `y"
    s = _crafted(tmp_path / "sessions", script=str(tmp_path / name))
    nb = build_notebook(s)
    html = _html(nb)
    assert _live(html) == []
    assert "&lt;img src=y onerror=alert(7)&gt;" in html


def _command_cells(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"
            and "model_debugger.cli" in c.source]


def test_no_recorded_text_is_expanded_by_ipython(tmp_path, monkeypatch):
    from IPython.core.inputtransformer2 import TransformerManager

    import model_debugger.cli

    args = [EXPANDS, "$HOME", "{os.getcwd()}", "!ls", "%time", "x?"]
    s = _crafted(tmp_path / "sessions", script=str(tmp_path / f"{EXPANDS}.py"), args=args)
    fixed = tmp_path / f"fixed{EXPANDS}.py"
    s._append("fix", fix={"finding": "lr_range", "root_cause": "hyperparameter",
                         "location": None, "diff": "", "hunks": [], "touches": [],
                         "suggestion": EXPANDS, "expected": "", "overrides": [],
                         "fixed": str(fixed), "copy": "fixes/1.py", "approved": True})
    nb = build_notebook(s)
    manager = TransformerManager()
    for cell in nb.cells:
        if cell.cell_type == "code":  # plain Python: IPython has nothing to rewrite
            assert manager.transform_cell(cell.source) == cell.source + (
                "" if cell.source.endswith("\n") else "\n"), cell.source
            compile(cell.source, "<cell>", "exec")
    cells = _command_cells(nb)
    assert len(cells) == 2
    # run the command cells in a real shell with the CLI entry replaced by a recorder
    from IPython.core.interactiveshell import InteractiveShell

    calls = []
    monkeypatch.setattr(model_debugger.cli, "main", lambda argv: calls.append(list(argv)) or 0)
    monkeypatch.chdir(tmp_path)
    shell = InteractiveShell.instance()
    for source in cells:
        result = shell.run_cell(source, store_history=False)
        assert result.error_in_exec is None and result.error_before_exec is None
    assert not (tmp_path / "PWNED").exists()
    assert calls[0][:2] == ["diagnose", f"{EXPANDS}.py"]
    assert calls[0][calls[0].index("--") + 1:] == args  # every argument arrives as written
    assert calls[1][calls[1].index("--fixed") + 1] == f"fixed{EXPANDS}.py"


def test_log_session_error_text_is_not_expanded(tmp_path):
    from IPython.core.inputtransformer2 import TransformerManager

    from model_debugger.diagnose import diagnose_log

    log = tmp_path / "loss.csv"
    log.write_text("step,loss\n" + "".join(f"{i},{1.0 / (i + 1)}\n" for i in range(20)))
    s = diagnose_log(str(log), error=EXPANDS, root=str(tmp_path / "sessions"))
    nb = build_notebook(s)
    for cell in nb.cells:
        if cell.cell_type == "code":
            transformed = TransformerManager().transform_cell(cell.source)
            assert transformed.rstrip("\n") == cell.source.rstrip("\n"), cell.source
            assert "get_ipython" not in transformed
    (cell,) = _command_cells(nb)
    assert repr(EXPANDS) in cell


SCRIPT = textwrap.dedent('''
    import sys
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    X, y = torch.randn(32, 3), torch.randn(32, 1)
    for step in range(6):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(X), y)
        loss.backward()
        opt.step()
    raise RuntimeError("<script>alert('x')</script> {__import__('os').system('touch PWNED')}"
                       + repr(sys.argv[1:]))
''')


def test_any_character_in_a_real_script_name_and_arguments_exports(tmp_path, monkeypatch):
    """A real diagnosed run whose file name and arguments hold quotes, ``\"\"\"``, newlines."""
    pytest.importorskip("torch")
    from model_debugger.diagnose import diagnose_script

    monkeypatch.chdir(tmp_path)
    script = tmp_path / 'odd """ {x} $y \'q\' ünï.py'
    script.write_text(SCRIPT)
    with open(os.devnull, "w") as sink:
        s = diagnose_script(str(script), args=ODD, runs=1, seed=0,
                            root=str(tmp_path / ".model_debugger"), stdout=sink,
                            probe_seconds=0.0)
    out = export(s, str(tmp_path / "export" / "record.ipynb"))
    nb = nbformat.read(out["notebook"], as_version=4)
    nbformat.validate(nb)
    assert _live(_html(nb)) == []
    source = open(out["repro"], encoding="utf-8").read()
    compile(source, out["repro"], "exec")
    namespace: dict = {}
    exec(compile(source.split("\ndef ")[0], "repro", "exec"), namespace)  # the constants only
    assert namespace["ARGS"] == ODD
    assert repr(os.path.basename(str(script))) in namespace["DESCRIPTION"]
    assert namespace["SCRIPT_NAME"] == "artifact.py"  # never a path from the record
    assert "raise RuntimeError" in namespace["SCRIPT"]
    assert not (tmp_path / "PWNED").exists()


def test_repro_never_writes_outside_its_folder_from_a_crafted_name(tmp_path):
    s = _crafted(tmp_path / "sessions", script="/x/../../../../etc/..")
    source = export(s, str(tmp_path / "e" / "r.ipynb"))["repro"]
    namespace: dict = {}
    text = open(source).read()
    exec(compile(text.split("\ndef ")[0], "repro", "exec"), namespace)
    assert namespace["SCRIPT_NAME"] == "artifact.py"


# -- paths, overwrite, full disk -----------------------------------------------------------------
def test_exports_hold_no_absolute_home_paths(tmp_path, monkeypatch):
    home = tmp_path / "home" / "alice"
    project = home / "project"
    project.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(project)
    s = _crafted(project / ".model_debugger", script=str(project / "train.py"),
                 cwd=str(project))
    s._append("fix", fix={"finding": "lr_range", "root_cause": "hyperparameter",
                         "location": {"file": str(project / "train.py"), "line": 3},
                         "diff": "", "hunks": [], "touches": [], "suggestion": "",
                         "expected": "", "overrides": [], "fixed": str(home / "fixed.py"),
                         "copy": "fixes/1.py", "approved": True})
    out = export(s, str(project / "record.ipynb"))
    for path in out.values():
        text = open(path, encoding="utf-8").read()
        assert str(home) not in text, path
    text = open(out["notebook"], encoding="utf-8").read()
    assert "train.py:42" in text and "~/fixed.py" in text
    assert f".model_debugger/{s.id}" in text


def test_cli_export_says_what_it_replaced(tmp_path, capsys):
    from model_debugger.cli import main

    s = _crafted(tmp_path / "sessions")
    target = tmp_path / "out" / "record.ipynb"
    assert main(["export", s.directory, "-o", str(target)]) == 0
    assert "Replaced" not in capsys.readouterr().out
    assert main(["export", s.directory, "-o", str(target)]) == 0
    out = capsys.readouterr().out
    assert f"Replaced: {target}" in out and f"Replaced: {target.parent / 'repro.py'}" in out
    os.symlink(tmp_path / "elsewhere.ipynb", tmp_path / "out" / "link.ipynb")
    assert main(["export", s.directory, "-o", str(tmp_path / "out" / "link.ipynb")]) == 2
    err = capsys.readouterr().err
    assert "symlink" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "elsewhere.ipynb").exists()


def test_library_export_refuses_a_crafted_session_id(tmp_path):
    s = _crafted(tmp_path / "a" / "sessions")
    _edit(s, lambda d: d.update(id="../../../x"))
    with pytest.raises(safe_write.UnsafePath, match="session id"):
        export(DebugSession.load(s.directory))
    assert not list(tmp_path.rglob("x.ipynb"))


def test_enospc_during_the_write_leaves_the_previous_notebook_intact(tmp_path, monkeypatch):
    s = _crafted(tmp_path / "sessions")
    target = tmp_path / "record.ipynb"
    export(s, str(target))
    previous = target.read_bytes()
    real_write = os.write

    def full_disk(fd, data):
        real_write(fd, bytes(data)[:100])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError) as info:
        export_files(s, str(target), overwrite=True)
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC
    assert target.read_bytes() == previous
    nbformat.validate(nbformat.read(str(target), as_version=4))
    assert sorted(os.listdir(tmp_path)) == ["record.ipynb", "repro.py", "sessions"]  # no temp


def test_a_really_full_disk_leaves_the_previous_notebook_intact(tmp_path):
    """A 512 KB tmpfs filled up: the export fails, the previous notebook is still valid."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        s = _crafted(tmp_path / "sessions")
        target = mnt / "record.ipynb"
        export(s, str(target))
        previous = target.read_bytes()
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        with pytest.raises(OSError) as info:
            export(s, str(target))
        assert info.value.errno == errno.ENOSPC
        assert target.read_bytes() == previous
        nbformat.validate(nbformat.read(str(target), as_version=4))
        assert [n for n in os.listdir(mnt) if n.endswith(".tmp")] == []
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_safe_writer_refuses_every_symlinked_component(tmp_path):
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    os.symlink(tmp_path / "out", root / "a" / "link")
    for path in ("a/link/x.txt", "a/link/b/x.txt", "../out/x.txt", str(tmp_path / "out" / "x")):
        with pytest.raises(safe_write.UnsafePath):
            safe_write.write_inside(str(root), path, "data")
    assert os.listdir(tmp_path / "out") == []
    assert safe_write.write_inside(str(root), "a/b/c/new.txt", "one") is False
    with pytest.raises(safe_write.TargetExists):
        safe_write.write_inside(str(root), "a/b/c/new.txt", "two")
    assert safe_write.write_inside(str(root), "a/b/c/new.txt", "two", overwrite=True) is True
    assert (root / "a" / "b" / "c" / "new.txt").read_text() == "two"



# -- review of issue #14: one redaction per value, paths in free text, reads that follow nothing --
def test_a_secret_looking_argument_cannot_eat_a_closing_backtick(tmp_path, monkeypatch):
    """``token:`` then HTML: a second redaction over the built markdown used to read ``token:``
    as a key and the closing backtick as its value, leaving a live ``<img onerror>``; over the
    code cell it turned ``'token:', '...'`` into code that no longer compiles."""
    import model_debugger.cli
    from model_debugger.redact import redact_args

    args = ["token:", XSS_NAME, "pwd=", "`", "password:", "<b onmouseover=alert(2)>x</b>"]
    s = _crafted(tmp_path / "sessions", script=str(tmp_path / "train.py"), args=args)
    nb = build_notebook(DebugSession.load(s.directory))
    html = _html(nb)
    assert _live(html) == []
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    for cell in nb.cells:
        if cell.cell_type == "code":
            compile(cell.source, "<cell>", "exec")
    from IPython.core.interactiveshell import InteractiveShell

    calls = []
    monkeypatch.setattr(model_debugger.cli, "main", lambda argv: calls.append(list(argv)) or 0)
    result = InteractiveShell.instance().run_cell(_command_cells(nb)[0], store_history=False)
    assert result.error_in_exec is None and result.error_before_exec is None
    assert calls[0][calls[0].index("--") + 1:] == redact_args(args)


def test_tracebacks_and_error_text_hold_no_absolute_home_paths(tmp_path, monkeypatch):
    home = tmp_path / "home" / "alice"
    project = home / "project"
    project.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    error = f'RuntimeError: cannot open {home}/data/x.csv (from {project}/train.py)'
    s = _crafted(project / ".model_debugger", script=str(project / "train.py"), error=error,
                 cwd=str(project))
    tb = (f'Traceback (most recent call last):\n  File "{project}/train.py", line 9, in <module>\n'
          f'  File "{home}/lib/util.py", line 3, in load\n{error}\n')
    run = os.path.join(s.directory, "runs", "0")
    os.makedirs(run)
    with open(os.path.join(run, "record.jsonl"), "w") as fh:
        for event in ({"t": "start"}, {"t": "step", "step": 0, "loss": 1.0},
                      {"t": "error", "kind": "exception", "type": "RuntimeError",
                       "message": error, "traceback": tb}, {"t": "end"}):
            fh.write(json.dumps(event) + "\n")
    out = export(s, str(project / "record.ipynb"))
    for path in out.values():
        assert str(home) not in open(path, encoding="utf-8").read(), path
    nb = nbformat.read(out["notebook"], as_version=4)
    text = "\n".join(c.source for c in nb.cells) + "\n".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert 'File "train.py", line 9' in text and 'File "~/lib/util.py", line 3' in text
    assert "~/data/x.csv" in text


async def test_rest_session_json_symlinked_outside_the_root_is_not_shown(jp_fetch, jp_root_dir,
                                                                        tmp_path):
    outside = _crafted(tmp_path / "elsewhere" / ".model_debugger")
    _edit(outside, lambda d: d.update(title="OUTSIDE-THE-ROOT"))
    for name, make in (("linkfile", lambda d: os.symlink(
            os.path.join(outside.directory, "session.json"), os.path.join(d, "session.json"))),
                       ("linkdir", None)):
        store = jp_root_dir / ".model_debugger"
        store.mkdir(exist_ok=True)
        if make is None:
            os.symlink(outside.directory, store / name)
        else:
            (store / name).mkdir()
            make(str(store / name))
    response = await jp_fetch("model-debugger", "sessions")
    body = response.body.decode()
    assert "OUTSIDE-THE-ROOT" not in body
    assert json.loads(body)["sessions"] == []
    for name in ("linkfile", "linkdir"):
        with pytest.raises(HTTPClientError) as err:
            await jp_fetch("model-debugger", "sessions", f".model_debugger/{name}")
        assert err.value.code in (403, 404)
        assert "OUTSIDE-THE-ROOT" not in err.value.response.body.decode()
        code, data = await _post(jp_fetch, {"session": f".model_debugger/{name}"})
        assert code in (403, 404), data


def test_records_are_parsed_from_the_bytes_read_without_following_links(tmp_path):
    from model_debugger.export import _load
    from model_debugger.records import Run

    s = _crafted(tmp_path / "sessions")
    folder = os.path.join(s.directory, "runs", "0")
    os.makedirs(folder)
    text = '{"t": "start"}\nnot json\r\n{"t": "step", "step": 0, "loss": 1.5}\n{"t"'
    with open(os.path.join(folder, "record.jsonl"), "w", newline="") as fh:
        fh.write(text)
    parsed, loaded = Run.parse(text.encode()), Run.load(os.path.join(folder, "record.jsonl"))
    assert (parsed.events, parsed.bad_lines, parsed.truncated) == \
        (loaded.events, loaded.bad_lines, loaded.truncated) == (loaded.events, 1, True)
    assert _load(s, "runs", "0", "record.jsonl").events == loaded.events
    os.rename(os.path.join(folder, "record.jsonl"), tmp_path / "real.jsonl")
    os.symlink(tmp_path / "real.jsonl", os.path.join(folder, "record.jsonl"))
    assert _load(s, "runs", "0", "record.jsonl") is None


def _run_repro(out: dict, tmp_path) -> subprocess.CompletedProcess:
    import sys

    return subprocess.run([sys.executable, out["repro"], "--runs", "1",
                           "--out", str(tmp_path / "runs")], capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path))


def test_repro_embeds_the_code_copy_as_code_not_as_redacted_text(tmp_path):
    """``token = tok`` is code that reads a secret: plain-text redaction made it
    ``token = [REDACTED]`` (a NameError in repro.py)."""
    from model_debugger.redact import write_private

    s = _crafted(tmp_path / "sessions")
    write_private(os.path.join(s.directory, "artifact.py"),
                  'tok = "abc"\ntoken = tok\npassword = token.upper()\n'
                  'print("token-ok", len(token), password.lower() == tok)\n')
    out = export(s, str(tmp_path / "e" / "r.ipynb"))
    namespace: dict = {}
    exec(compile(open(out["repro"]).read().split("\ndef ")[0], "repro", "exec"), namespace)
    assert "token = tok\n" in namespace["SCRIPT"]
    done = _run_repro(out, tmp_path)
    assert "the script raised" not in done.stderr, done.stderr
    assert "token-ok 3 True" in done.stdout, done.stdout + done.stderr


def test_repro_of_a_latin_1_script_runs_it(tmp_path):
    """A ``# coding: latin-1`` script: its copy is not UTF-8; repro.py used to embed ''."""
    s = _crafted(tmp_path / "sessions")
    with open(os.path.join(s.directory, "artifact.py"), "wb") as fh:
        fh.write('# -*- coding: latin-1 -*-\nprint("caf\xe9-ok", len("\xe9\xe8"))\n'
                 .encode("latin-1"))
    out = export(s, str(tmp_path / "e" / "r.ipynb"))
    namespace: dict = {}
    exec(compile(open(out["repro"]).read().split("\ndef ")[0], "repro", "exec"), namespace)
    assert "caf\xe9-ok" in namespace["SCRIPT"]
    done = _run_repro(out, tmp_path)
    assert "the script raised" not in done.stderr, done.stderr
    assert "caf\xe9-ok 2" in done.stdout, done.stdout + done.stderr
