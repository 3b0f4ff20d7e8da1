"""The sidebar comm (kernel side) and the snapshot JSON Schema shared with the TypeScript types."""

from __future__ import annotations

import json
import os
import queue
import re
import textwrap
import time

import pytest

from model_debugger import comm as md_comm
from model_debugger import schema as md_schema
from model_debugger.records import Classification, Evidence, Finding
from model_debugger.session import DebugSession

jsonschema = pytest.importorskip("jsonschema")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


class FakeComm:
    """Records what the kernel sends; lets a test play the frontend."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.closed = False
        self._on_msg = None
        self._on_close = None

    def send(self, data=None, **_kw) -> None:
        json.dumps(data, allow_nan=False)  # what the wire accepts
        self.sent.append(data)

    def on_msg(self, callback) -> None:
        self._on_msg = callback

    def on_close(self, callback) -> None:
        self._on_close = callback

    def close(self, *_a, **_kw) -> None:
        self.closed = True

    def receive(self, data: dict) -> None:
        self._on_msg({"content": {"data": data}})


class FakeManager:
    def __init__(self) -> None:
        self.targets: dict = {}

    def register_target(self, name, handler) -> None:
        self.targets[name] = handler

    def unregister_target(self, name, handler) -> None:
        assert self.targets.pop(name) is handler


class FakeShell:
    """A kernel's shell: a comm manager, and the magics (which own the kernel's session)
    registered where IPython keeps them."""

    def __init__(self, magics=None) -> None:
        self.kernel = type("Kernel", (), {"comm_manager": FakeManager()})()
        self.magics_manager = type("Manager", (), {"registry": {}})()
        if magics is not None:
            self.magics_manager.registry["DebuggerMagics"] = magics


@pytest.fixture
def magics(tmp_path, monkeypatch):
    from model_debugger.magics import DebuggerMagics

    monkeypatch.chdir(tmp_path)
    magics = DebuggerMagics(None, root=str(tmp_path / ".model_debugger"))
    yield magics
    magics.kernel.close()


@pytest.fixture
def ns(magics):
    return magics.kernel


@pytest.fixture
def shell(magics):
    return FakeShell(magics)


def _full(root, confirmed=True, nan=False) -> DebugSession:
    s = DebugSession.create(str(root), title="notebook")
    s.record_reproduce({"status": "reproduced", "summary": "reproduced 1/1", "steps": 5,
                        "epochs": 1, "error": None, "seconds": 1.0,
                        "problem": "gradient_instability",
                        "runs": {"total": 1, "reproduced": 1,
                                 "categories": ["gradient_instability"]}})
    s.record_classification(Classification("gradient_instability", ("overfitting",), (
        Evidence("first_nonfinite_step", 4, "first non-finite loss"),
        Evidence("loss_final", float("nan") if nan else 917.1, "median of the last steps"))), {})
    s.record_findings([Finding("lr_range", "hyperparameter", confirmed, "lr 3 diverges",
                               {"file": str(root / "cell.py"), "line": 7}, {"safe_lr": 0.05})])
    return s


def _hello(shell) -> FakeComm:
    frontend = FakeComm()
    shell.kernel.comm_manager.targets["model_debugger"](
        frontend, {"content": {"data": {"type": "hello"}}})
    return frontend


def _live_observers(directory: str) -> int:
    from model_debugger import session as session_module

    return len([r for r in session_module._observers.get(directory, []) if r() is not None])


def test_register_is_a_no_op_outside_a_kernel(ns):
    from IPython.core.interactiveshell import InteractiveShell

    assert md_comm.register(None) is False
    assert md_comm.register(InteractiveShell.instance(), ns) is False
    assert md_comm.register(FakeShell()) is False  # a kernel without the magics loaded
    md_comm.unregister(InteractiveShell.instance())  # harmless
    assert ns.sidebar is None


def test_the_sidebar_lives_on_the_kernel_session_of_the_magics(shell, ns):
    assert md_comm.register(shell) is True  # found through the registered magics
    assert ns.sidebar is not None
    assert shell.kernel.comm_manager.targets["model_debugger"] == ns.sidebar.open
    assert not [k for k, v in vars(md_comm).items()
                if not k.startswith("__") and isinstance(v, dict | list) and k != "COMMANDS"]


def test_hello_gets_a_snapshot_valid_against_the_schema(ns, shell):
    assert md_comm.register(shell) is True
    frontend = _hello(shell)
    assert frontend.sent[0]["type"] == "snapshot"
    snap = frontend.sent[0]["snapshot"]
    md_schema.validate(snap)
    assert snap["report"] is None  # no session yet, and none was created by asking
    assert not os.path.exists(ns.root)
    frontend.receive({"type": "hello"})
    assert frontend.sent[-1]["type"] == "snapshot"


def test_changes_are_pushed_as_events_with_the_gates(ns, shell, tmp_path):
    md_comm.register(shell)
    frontend = _hello(shell)
    ns.use(_full(tmp_path / ".model_debugger", confirmed=False, nan=True))
    event = frontend.sent[-1]
    assert event["type"] == "event"
    md_schema.validate(event["snapshot"])
    report = event["snapshot"]["report"]
    assert report["fix_allowed"] is False
    assert report["gates"]["fix"] == "needs a confirmed finding from Isolate"
    assert report["classification"]["evidence"][1]["value"] == "nan"
    assert [p["status"] for p in report["phases"]] == ["done", "done", "current", "blocked",
                                                       "blocked"]
    ns.use(_full(tmp_path / ".model_debugger", confirmed=True))
    report = frontend.sent[-1]["snapshot"]["report"]
    assert report["fix_allowed"] is True and report["gates"]["fix"] is None
    assert report["phase"] == "fix"


def test_an_event_appended_through_any_session_object_is_pushed(ns, shell, tmp_path):
    from model_debugger.phases import plan_fix

    md_comm.register(shell)
    frontend = _hello(shell)
    ns.use(_full(tmp_path / ".model_debugger"))
    ns.session.store.write("artifact.py", "lr = 3.0\n")
    sent = len(frontend.sent)
    ns.session.record_plan(plan_fix(ns.session, "lr = 0.05\n"))  # the kernel's object
    assert len(frontend.sent) == sent + 1
    event = frontend.sent[-1]
    md_schema.validate(event["snapshot"])
    assert event["type"] == "event" and event["snapshot"]["plan"]["finding"] == "lr_range"
    assert "source" not in event["snapshot"]["plan"]
    assert event["snapshot"]["report"]["plan"]["finding"] == "lr_range"

    other = DebugSession.load(ns.session.directory)  # another object, same folder
    other.approve()
    event = frontend.sent[-1]
    assert len(frontend.sent) == sent + 2 and event["type"] == "event"
    report = event["snapshot"]["report"]
    assert report["plan"] is None and report["fix"]["finding"] == "lr_range"
    assert report["phase"] == "verify" and dict(
        (p["phase"], p["status"]) for p in report["phases"])["verify"] == "current"


def test_requests_get_replies_with_their_ids(ns, shell, tmp_path):
    md_comm.register(shell)
    frontend = _hello(shell)
    frontend.receive({"type": "request", "id": "r1", "command": "export"})
    reply = frontend.sent[-1]
    assert reply == {"type": "reply", "id": "r1", "ok": False, "error": reply["error"]}
    assert "no session to export" in reply["error"]
    ns.use(_full(tmp_path / ".model_debugger"))
    frontend.receive({"type": "request", "id": "r2", "command": "export",
                      "args": {"path": "out/record.ipynb"}})
    reply = frontend.sent[-1]
    assert reply["id"] == "r2" and reply["ok"] is True, reply
    assert reply["result"]["relative"] == {"notebook": "out/record.ipynb",
                                           "repro": "out/repro.py"}
    assert os.path.isfile(tmp_path / "out" / "record.ipynb")
    frontend.receive({"type": "request", "id": "r3", "command": "snapshot"})
    assert frontend.sent[-1]["id"] == "r3"
    md_schema.validate(frontend.sent[-1]["result"])
    frontend.receive({"type": "request", "id": "r4", "command": "nope"})
    assert frontend.sent[-1]["ok"] is False and "unknown command" in frontend.sent[-1]["error"]


def test_fix_cell_is_the_current_code_under_the_magic(ns, shell, tmp_path):
    """The sidebar's Fix button asks for the cell to insert: the reproduced cell's code (or the
    last kept fix) under ``%%fix``; a script's session gets the empty template."""
    from model_debugger.records import ArtifactInfo

    md_comm.register(shell)
    frontend = _hello(shell)
    frontend.receive({"type": "request", "id": "f0", "command": "fix_cell"})
    assert frontend.sent[-1]["ok"] is False and "%%reproduce" in frontend.sent[-1]["error"]
    s = ns.session
    code = "import torch\nopt = torch.optim.SGD(params, lr=3.0)\nfor step in range(9):\n    f()\n"
    s.store.write("cell.py", code)
    s.record_artifact(ArtifactInfo("cell", seed=0, copy="cell.py"), code=code, prelude="")
    frontend.receive({"type": "request", "id": "f1", "command": "fix_cell"})
    reply = frontend.sent[-1]
    assert reply["ok"] is True and reply["result"] == {"source": "%%fix\n" + code,
                                                       "prefilled": True}
    ns.use(_full(tmp_path / "script_session"))  # no cell artifact: the template
    frontend.receive({"type": "request", "id": "f2", "command": "fix_cell"})
    result = frontend.sent[-1]["result"]
    assert result["prefilled"] is False and result["source"].startswith("%%fix\n# ")


def test_what_runs_now_is_pushed_with_its_progress_and_cleared_after(ns, shell, tmp_path):
    """A phase's progress bar moves the sidebar's "running" line too; when the phase ends,
    however it ends, the line goes (no stale "running")."""
    md_comm.register(shell)
    frontend = _hello(shell)
    assert frontend.sent[-1]["snapshot"]["running"] is None
    progress = ns.progress("verify", "Verify")
    with pytest.raises(RuntimeError):
        with progress:
            progress.step(2, 6)
            snap = frontend.sent[-1]["snapshot"]
            md_schema.validate(snap)
            assert snap["running"] == {"phase": "verify", "label": "run 2 of 6",
                                       "fraction": pytest.approx(2 / 6)}
            raise RuntimeError("a run failed")
    assert frontend.sent[-1]["snapshot"]["running"] is None and ns.running is None
    ns.tell("reproduce", None, "training: 40 steps (1 run)")
    snap = frontend.sent[-1]["snapshot"]
    md_schema.validate(snap)
    assert snap["running"]["fraction"] is None
    ns.idle()


def test_unregister_closes_comms_and_removes_the_target(ns, shell, tmp_path):
    ns.use(_full(tmp_path / ".model_debugger"))
    md_comm.register(shell)
    md_comm.register(shell)  # twice: one target, one observer
    assert _live_observers(ns.session.directory) == 2  # the kernel session's sync + the sidebar
    frontend = _hello(shell)
    md_comm.unregister(shell)
    assert frontend.closed and ns.sidebar is None
    assert "model_debugger" not in shell.kernel.comm_manager.targets
    assert _live_observers(ns.session.directory) == 1
    ns.session.record_note("nothing listens any more")
    assert frontend.sent[-1]["type"] == "snapshot"


def test_schema_rejects_a_report_without_gates(ns, tmp_path):
    ns.use(_full(tmp_path / ".model_debugger"))
    snap = md_comm.snapshot(ns)
    del snap["report"]["gates"]
    with pytest.raises(jsonschema.ValidationError):
        md_schema.validate(snap)


def _ts_interface(source: str, name: str) -> set[str]:
    body = re.search(r"export interface " + name + r" \{(.*?)\n\}", source, re.S)
    assert body, f"interface {name} not found"
    return set(re.findall(r"^  (?:readonly )?([A-Za-z_]+)\??:", body.group(1), re.M))


def test_typescript_types_match_the_schema():
    """The sidebar's TypeScript types are generated from the schema; the checked-in copy is
    what `jlpm build` regenerates (json-schema-to-typescript), so compare keys here."""
    path = os.path.join(REPO, "labextension", "src", "snapshot.ts")
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    spec = md_schema.load()
    assert _ts_interface(source, "Snapshot") == set(spec["properties"])
    for name in ("Report", "Finding", "Classification", "Evidence", "Gates", "PhaseStatus"):
        assert _ts_interface(source, name) == set(spec["$defs"][name]["properties"]), name


KERNEL_CELL = textwrap.dedent("""
    %%reproduce
    import torch
    torch.manual_seed(0)
    x = torch.randn(64, 4); y = x.sum(1, keepdim=True)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=50.0)
    for step in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
""")


@pytest.mark.slow
def test_real_kernel_comm_round_trip(tmp_path):
    """A real ipykernel: register, open the comm as JupyterLab does, reproduce, get the event."""
    pytest.importorskip("torch")
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        kc.execute_interactive("%load_ext model_debugger\nimport model_debugger.comm\n"
                               "model_debugger.comm.register(get_ipython())", timeout=60)
        msg = kc.session.msg("comm_open", {"comm_id": "c1", "target_name": "model_debugger",
                                           "data": {"type": "hello"}})
        kc.shell_channel.send(msg)
        got: list[dict] = []

        def collect(until, timeout=120.0):
            deadline = time.time() + timeout
            while time.time() < deadline:
                try:
                    m = kc.get_iopub_msg(timeout=1)
                except queue.Empty:
                    continue
                if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == "c1":
                    got.append(m["content"]["data"])
                    if until(got[-1]):
                        return got[-1]
            raise AssertionError(f"no matching comm message; got {got}")

        first = collect(lambda d: d["type"] == "snapshot")
        md_schema.validate(first["snapshot"])
        kc.execute(KERNEL_CELL)
        event = collect(lambda d: d["type"] == "event" and d["snapshot"]["report"]
                        and d["snapshot"]["report"]["classification"])
        md_schema.validate(event["snapshot"])
        report = event["snapshot"]["report"]
        assert report["classification"]["primary"] == "gradient_instability"
        assert report["fix_allowed"] is False
        kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": "c1", "data": {
            "type": "request", "id": "e1", "command": "export"}}))
        reply = collect(lambda d: d["type"] == "reply" and d["id"] == "e1")
        assert reply["ok"] is True, reply
        assert os.path.isfile(reply["result"]["notebook"])
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_location_in_the_sessions_copy_of_the_cell_names_the_cell(ns, shell, tmp_path):
    """The sidebar is told which cell a location is a line of (it shows and reveals that cell,
    not the session's copy); the session's own report is left as recorded."""
    from model_debugger.store import CELL

    md_comm.register(shell)
    frontend = _hello(shell)
    s = _full(tmp_path / ".model_debugger")
    s.store.write(CELL, "x = 1\n")
    copy = s.store.code_beside(s.store.run_record(0))
    s.store.write(s.store.rel(copy), "x = 1\n")
    s.record_findings([Finding("lr_range", "hyperparameter", True, "lr 3 diverges",
                               {"file": copy, "line": 1}, {})])
    ns.use(s)
    snap = frontend.sent[-1]["snapshot"]
    md_schema.validate(snap)
    assert snap["report"]["findings"][0]["location"] == {"file": copy, "line": 1,
                                                         "cell": "reproduce"}
    assert "cell" not in s.report()["findings"][0]["location"]
