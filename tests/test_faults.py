"""Fault injection: records that never lie, against real child processes and real PyTorch.

Each fault is injected into a real run (a hang then SIGKILL, SIGKILL or ``os._exit`` in the
script, training the capture cannot see, Ctrl-C of the CLI, two verifies at once, a resumed
verify, a garbage line in a record) and the report must say what happened: how many steps
reached the disk, ``crashed`` with how and after which step, ``not_observed`` with a reason
(never ``healthy``), ``interrupted`` with a session ``report`` can show, a refused second
verify, a fresh record per run, skipped lines counted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from model_debugger.records import Run
from model_debugger.session import DebugSession, SessionLocked

ENV = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")

TRAIN = """
import os, sys, time
import torch
from torch import nn

torch.manual_seed(0)
SIDE = sys.argv[1]
side = open(SIDE, "w", buffering=1)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
X, y = torch.randn(64, 4), torch.randn(64, 1)


def step(i):
    loss = nn.functional.mse_loss(model(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    side.write(f"{i} {time.time()}\\n")  # the script's own account of its steps
"""


def _script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(TRAIN + textwrap.dedent(body))
    return path


def _child(script: Path, record: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "model_debugger._child", "--record",
                             str(record), str(script), *args], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the child ended early: {proc.stderr.read()[-2000:]}")
        time.sleep(0.02)
    raise AssertionError(f"{text!r} never appeared in {path}")


def _side_steps(side: Path) -> dict[int, float]:
    out = {}
    for line in side.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            out[int(parts[0])] = float(parts[1])
    return out


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "model_debugger.cli", *args],
                          capture_output=True, text=True, timeout=timeout, env=ENV)


def _diagnose(script: Path, root: Path, *extra: str) -> dict:
    proc = _cli("diagnose", str(script), "--json", "--root", str(root), "--probe-seconds", "0",
                *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


# -- 1. a hang, then SIGKILL: at most ~0.5 s of steps lost ---------------------------------

HANGS = {
    # a long data load after a burst of steps: the last steps came < FLUSH_SECONDS ago
    "sleep": "time.sleep(120)",
    # a C call that blocks (a read nobody answers)
    "blocking_read": "r, w = os.pipe()\nos.read(r, 1)",
}


@pytest.mark.parametrize("hang", sorted(HANGS))
def test_a_hang_then_sigkill_loses_no_step_written_half_a_second_before(tmp_path, hang):
    script = _script(tmp_path, f"""
        for i in range(1500):
            step(i)
        time.sleep(0.3)  # a slow batch
        for i in range(1500, 1520):  # a burst: the first is flushed, the other 19 are kept
            step(i)
        side.write("hang\\n")
        {HANGS[hang].replace(chr(10), chr(10) + ' ' * 8)}
    """)
    record, side = tmp_path / "record.jsonl", tmp_path / "side.txt"
    proc = _child(script, record, str(side))
    _wait_for(side, "hang", proc)
    time.sleep(0.6)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    wrote = _side_steps(side)
    recorded = {s["i"] for s in Run.load(str(record)).steps}
    lost = sorted(set(wrote) - recorded)
    assert len(wrote) == 1520
    assert lost == [], f"{len(lost)} steps lost: {lost[:5]}..."


# -- 2. SIGKILL and os._exit in the script: crashed, how, after which step ----------------

@pytest.mark.parametrize("how, expect, code", [
    ("os.kill(os.getpid(), 9)", "SIGKILL", -9),
    ("os._exit(3)", "code 3", 3),
])
def test_a_run_killed_or_exited_without_closing_is_crashed_after_its_last_step(
        tmp_path, how, expect, code):
    script = _script(tmp_path, f"""
        for i in range(40):
            step(i)
        time.sleep(0.6)  # every step is on disk before the end
        {how}
    """)
    report = _diagnose(script, tmp_path / "s", "--", str(tmp_path / "side.txt"))
    rep = report["reproduce"]
    assert rep["status"] == "crashed" and rep["status"] != "healthy"
    assert rep["error"] is not None and expect in rep["error"] and "no end event" in rep["error"]
    assert rep["crash"]["after_step"] == 39 and rep["crash"]["exit_code"] == code
    assert rep["steps"] == 40
    human = _cli("report", report["session_dir"])
    assert human.returncode == 0, human.stderr
    assert expect in human.stdout and "after step 39" in human.stdout


# -- 3. nothing the capture can see: not_observed, never healthy -------------------------

UNSEEN = {
    "python_float_loss": ("""
        import numpy as np
        w = 0.0
        for i in range(50):  # gradient descent by hand, the loss a Python float
            loss = float(np.mean((w * np.arange(5.0) - 1.0) ** 2))
            w -= 0.01 * float(np.mean(2 * (w * np.arange(5.0) - 1.0) * np.arange(5.0)))
            print(f"loss={loss:.4f}")
    """, "no training step seen"),
    "no_backward": ("""
        with torch.no_grad():
            for i in range(20):
                loss = nn.functional.mse_loss(model(X), y)
                print(f"step {i} loss={loss.item():.4f}")
    """, "no training step seen"),
}


@pytest.mark.parametrize("case", sorted(UNSEEN))
def test_a_run_with_no_observed_training_step_is_not_observed(tmp_path, case):
    body, reason = UNSEEN[case]
    script = _script(tmp_path, body)
    report = _diagnose(script, tmp_path / "s", "--", str(tmp_path / "side.txt"))
    rep = report["reproduce"]
    assert rep["status"] == "not_observed", rep
    assert reason in rep["reason"]
    assert report["classification"] is None  # healthy is never presented as a finding
    assert report["fix_allowed"] is False and report["phase"] == "reproduce"
    assert "nothing to isolate" in report["gates"]["isolate"]
    human = _cli("report", report["session_dir"])
    assert human.returncode == 0, human.stderr
    assert "not classified" in human.stdout and "healthy" not in human.stdout
    isolate = _cli("isolate", report["session_dir"])
    assert isolate.returncode == 2 and "nothing to isolate" in isolate.stderr


# -- 4. Ctrl-C of diagnose: one line, the child stopped, a session report can show -------

def test_ctrl_c_of_diagnose_ends_with_one_line_and_a_partial_session(tmp_path):
    script = _script(tmp_path, """
        i = 0
        while True:
            step(i)
            if i == 30:
                side.write("going\\n")
            i += 1
            time.sleep(0.01)
    """)
    side, root = tmp_path / "side.txt", tmp_path / "s"
    # (a suite started in the background, `make test &`, ignores SIGINT, and children inherit
    # that: the CLI gets the default a terminal gives it)
    proc = subprocess.Popen([sys.executable, "-m", "model_debugger.cli", "diagnose", str(script),
                             "--root", str(root), "--", str(side)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for(side, "going", proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "Traceback" not in err and "Traceback" not in out, err
    ours = [ln for ln in err.splitlines() if ln.startswith("model-debugger")]
    assert len(ours) == 1 and ours[0].startswith("model-debugger: interrupted"), err
    written = len(_side_steps(side))
    time.sleep(0.5)
    assert len(_side_steps(side)) == written, "the child kept training after Ctrl-C"
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    report = _cli("report", str(folder), "--json")
    assert report.returncode == 0, report.stderr
    rep = json.loads(report.stdout)["reproduce"]
    assert rep["status"] == "interrupted" and rep["steps"] >= 30
    human = _cli("report", str(folder))
    assert human.returncode == 0 and "interrupted" in human.stdout, human.stderr


# -- 5. the session lock: a second verify is refused, a stale lock taken over -------------

HOLD = """
import sys, time
from model_debugger.session import DebugSession
s = DebugSession.load(sys.argv[1])
with s.lock("verify"):
    print("held", flush=True)
    time.sleep(120)
"""


@pytest.fixture()
def log_session(tmp_path):
    log = tmp_path / "loss.csv"
    log.write_text("step,loss\n" + "".join(f"{i},{2.0 - i * 0.01}\n" for i in range(50)))
    proc = _cli("diagnose", str(log), "--json", "--root", str(tmp_path / "s"))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["session_dir"]


def test_a_second_verify_on_a_locked_session_is_refused_naming_the_holder(log_session,
                                                                           tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, log_session], env=ENV,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        fixed = tmp_path / "fixed.py"
        fixed.write_text("print('fixed')\n")
        second = _cli("verify", log_session, "--fixed", str(fixed), "--yes")
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"locked by pid {holder.pid}" in lines[0], second.stderr
        with pytest.raises(SessionLocked, match=f"pid {holder.pid}"):
            with DebugSession.load(log_session).lock("isolate"):
                pass
    finally:
        holder.kill()
        holder.wait()
    # the holder died (SIGKILL, its lock file still names it): the lock is taken over
    assert str(holder.pid) in Path(log_session, ".lock").read_text()
    with DebugSession.load(log_session).lock("verify") as s:
        assert Path(s.directory, ".lock").read_text().split()[0] == str(os.getpid())


def test_two_concurrent_verifies_one_runs_one_is_refused(tmp_path):
    from model_debugger.diagnose import diagnose_script

    script = tmp_path / "train.py"
    script.write_text(TINY)
    with open(os.devnull, "w") as devnull:
        s = diagnose_script(str(script), seed=0, root=str(tmp_path / "s"), probe_seconds=15,
                            stdout=devnull)
    assert s.phase == "fix", s.report()["findings"]
    fixed = tmp_path / "fixed.py"
    fixed.write_text(TINY.replace("lr=3.0", "lr=0.05"))
    cmd = [sys.executable, "-m", "model_debugger.cli", "verify", s.directory, "--fixed",
           str(fixed), "--yes", "--json", "--seeds", "2"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=ENV)
    lock = Path(s.directory, ".lock")
    deadline = time.monotonic() + 60
    while not (lock.exists() and lock.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    second = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
    assert second.returncode == 2 and f"locked by pid {first.pid}" in second.stderr
    done = DebugSession.load(s.directory)
    verifies = [e for e in done.events if e["kind"] == "verify"]
    fixes = [e for e in done.events if e["kind"] == "fix"]
    assert len(verifies) == 1 and len(fixes) == 1  # nothing lost, nothing doubled
    for path in Path(s.directory, "verify", "1").glob("*.jsonl"):
        assert len(Run.load(str(path)).of("start")) == 1, path


TINY = """
import torch
from torch import nn
torch.manual_seed(0)
X = torch.randn(256, 8)
y = X @ torch.randn(8, 1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=3.0)
for step in range(60):
    idx = torch.randint(0, len(X), (64,))
    loss = nn.functional.mse_loss(model(X[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


# -- 6. each run writes a fresh record ------------------------------------------------------

def test_a_rerun_into_the_same_record_replaces_it(tmp_path):
    from model_debugger.runner import run_script

    script = _script(tmp_path, """
        for i in range(10):
            step(i)
    """)
    record = tmp_path / "verify" / "1" / "before-0.jsonl"
    record.parent.mkdir(parents=True)
    record.write_text('{"t": "start", "pid": 1}\n{"t": "step", "i": 0, "loss": 9.0}\n')
    # a resumed verify runs the same seed into the same file: one fresh run, nothing appended
    for _ in range(2):
        run_script(str(script), [str(tmp_path / "side.txt")], str(record), seed=0,
                   stdout=open(os.devnull, "w"))
        run = Run.load(str(record))
        assert len(run.of("start")) == 1 and len(run.of("end")) == 1
        assert [s["i"] for s in run.steps] == list(range(10))


# -- 7. a garbage line in the middle of a record --------------------------------------------

def test_a_garbage_line_is_skipped_counted_and_reported(tmp_path):
    from model_debugger.cli import _print_human
    from model_debugger.phases.reproduce import _result_of, _verdict

    script = _script(tmp_path, """
        for i in range(30):
            step(i)
    """)
    record = tmp_path / "record.jsonl"
    proc = _child(script, record, str(tmp_path / "side.txt"))
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    lines = record.read_text().splitlines(keepends=True)
    steps = [n for n, ln in enumerate(lines) if '"t": "step"' in ln or '"t":"step"' in ln]
    middle = steps[len(steps) // 2]
    lines[middle:middle] = ["{not json at all\n", "\x00\x00 garbage\n", "[1, 2]\n"]
    record.write_text("".join(lines))
    run = Run.load(str(record))
    assert [s["i"] for s in run.steps] == list(range(30))  # every later step kept
    assert run.bad_lines == 3 and run.ended
    rep = _verdict([_result_of(run, "healthy")], ["run 1"])
    assert rep["bad_lines"] == 3
    import io

    out = io.StringIO()
    _print_human({"reproduce": rep, "classification": None, "findings": [], "gates": {},
                  "phase": "classify", "fix_allowed": False, "session_dir": str(tmp_path)}, out)
    assert "3 unreadable lines skipped" in out.getvalue()
    # a last line cut short by a kill is not a bad line
    record.write_text(record.read_text() + '{"t": "step", "i": 30, "lo')
    cut = Run.load(str(record))
    assert cut.truncated and cut.bad_lines == 3 and len(cut.steps) == 30


# -- 8. the magics follow the same rule ----------------------------------------------------

def test_the_magics_report_a_cell_without_training_as_not_observed(tmp_path, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    monkeypatch.chdir(tmp_path)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "model_debugger")
    try:
        with capture_output() as cap:
            ip.run_cell_magic("reproduce", "", "w = 0.0\nfor i in range(20):\n"
                              "    loss = (w - 1.0) ** 2\n    w -= 0.1 * 2 * (w - 1.0)\n")
            ip.run_line_magic("isolate", "")
        shown = cap.stdout + "\n".join(o.data.get("text/plain", "") for o in cap.outputs)
        assert "not_observed" in shown and "no training step seen" in shown, shown
        assert "healthy" not in shown
        assert "nothing to isolate" in shown + cap.stderr, shown + cap.stderr
        (folder,) = [p for p in (tmp_path / ".model_debugger").iterdir() if p.is_dir()]
        report = DebugSession.load(str(folder)).report()
        assert report["reproduce"]["status"] == "not_observed"
        assert report["classification"] is None and not report["fix_allowed"]
    finally:
        ip.run_line_magic("unload_ext", "model_debugger")


# -- 9. every writer of a session takes its lock ---------------------------------------------

APPEND = """
import sys
from model_debugger.session import DebugSession
s = DebugSession.load(sys.argv[1])
print("loaded", flush=True)
for k in range(int(sys.argv[2])):
    s.record_note(f"child {k}")
"""


def _notes(directory: str) -> list[str]:
    events = DebugSession.load(directory).events
    assert [e["seq"] for e in events] == list(range(len(events)))
    return [e["text"] for e in events if e["kind"] == "note"]


def test_events_appended_by_two_processes_are_all_kept(tmp_path):
    """A kernel's session object (loaded once, then stale) and a CLI process both append:
    neither save overwrites the other's events, in sequence or at the same time."""
    s = DebugSession.create(str(tmp_path / "s"))
    s.record_note("parent 0")
    child = subprocess.run([sys.executable, "-c", APPEND, s.directory, "2"], env=ENV,
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    s.record_note("parent 1")  # s never saw the child's events
    assert _notes(s.directory) == ["parent 0", "child 0", "child 1", "parent 1"]

    proc = subprocess.Popen([sys.executable, "-c", APPEND, s.directory, "40"], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "loaded"
    for k in range(40):
        s.record_note(f"parent {k + 2}")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    notes = _notes(s.directory)
    assert sorted(notes) == sorted(["parent 0", "child 0", "child 1", "parent 1"]
                                   + [f"child {k}" for k in range(40)]
                                   + [f"parent {k + 2}" for k in range(40)])


HOLD_BRIEFLY = """
import sys, time
from model_debugger.session import DebugSession
s = DebugSession.load(sys.argv[1])
with s.lock("isolate"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_an_event_waits_for_a_phase_of_another_process_then_is_refused(tmp_path,
                                                                        monkeypatch):
    from model_debugger import session as session_mod

    s = DebugSession.create(str(tmp_path / "s"))
    brief = subprocess.Popen([sys.executable, "-c", HOLD_BRIEFLY, s.directory, "1"], env=ENV,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert brief.stdout.readline().strip() == "held"
        s.record_note("after the phase")  # waits (APPEND_WAIT) for the holder to end
    finally:
        brief.kill()
        brief.wait()
    assert _notes(s.directory) == ["after the phase"]

    monkeypatch.setattr(session_mod, "APPEND_WAIT", 0.3)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_BRIEFLY, s.directory, "120"],
                              env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SessionLocked, match=f"pid {holder.pid} \\(isolate running\\)"):
            s.record_note("refused")
    finally:
        holder.kill()
        holder.wait()
    assert _notes(s.directory) == ["after the phase"] and len(s.events) == 1
    s.record_note("the holder died")
    assert _notes(s.directory) == ["after the phase", "the holder died"]


# -- 10. a full disk while step rows are written: no row lost, none written twice -------------

def _record_steps(path: Path) -> list[int]:
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return [e["i"] for e in events if e["t"] == "step"]


def test_a_full_disk_under_the_flusher_thread_loses_and_repeats_no_row(tmp_path):
    import errno

    from model_debugger.capture.recorder import Recorder

    path = tmp_path / "record.jsonl"
    with Recorder(str(path)) as rec, open("/dev/full", "wb", buffering=0) as full:
        disk = rec._fh
        with rec._lock:
            rec._fh = full  # every write now fails with ENOSPC
            rec._flushed = time.perf_counter()
        for i in range(5):
            rec.emit("step", i=i)  # queued: the training thread does not flush yet
        deadline = time.monotonic() + 30
        while rec.flush_error is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert isinstance(rec.flush_error, OSError) and rec.flush_error.errno == errno.ENOSPC
        with rec._lock:
            rec._fh = disk  # space again
        for i in range(5, 8):
            rec.emit("step", i=i)
    assert _record_steps(path) == list(range(8))
    assert rec.flush_error is None  # the training thread's last flush wrote everything


def test_a_full_disk_under_the_training_thread_repeats_no_step(tmp_path, monkeypatch):
    """The step event is queued, then its write fails: the row is not kept to be written again."""
    import errno

    import torch
    from torch import nn

    import model_debugger
    from model_debugger.capture import torch_steps

    monkeypatch.setattr(torch_steps, "FLUSH_SECONDS", 0.0)  # rows are written after every step
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    X, y = torch.randn(16, 4), torch.randn(16, 1)

    def train(n):
        for _ in range(n):
            opt.zero_grad()
            nn.functional.mse_loss(model(X), y).backward()
            opt.step()

    path = tmp_path / "record.jsonl"
    with model_debugger.capture(str(path), update_every=0, hist_every=0) as rec, \
            open("/dev/full", "wb", buffering=0) as full:
        train(2)
        disk = rec._fh
        with rec._lock:
            rec._fh = full
        with pytest.raises(OSError) as info:
            train(1)  # the training thread reports the full disk itself
        assert info.value.errno == errno.ENOSPC
        with rec._lock:
            rec._fh = disk
        train(2)
    assert _record_steps(path) == [0, 1, 2, 3, 4]
