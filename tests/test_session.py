"""DebugSession: persistence round trip, phase gates, atomic save, unusable files, report schema."""

from __future__ import annotations

import json
import os

import _synthetic as syn
import pytest

from model_debugger import session as session_module
from model_debugger.classify import classify
from model_debugger.records import Classification, Evidence, Finding, RecordError
from model_debugger.session import (
    REPORT_SCHEMA,
    SESSION_FILE,
    DebugSession,
    GateError,
    SessionError,
)
from model_debugger.signals import compute

REPRODUCE = {"status": "reproduced", "problem": "gradient_instability", "steps": 30, "epochs": 1,
             "error": None, "seconds": 1.5, "summary": "reproduced 1/1",
             "runs": {"total": 1, "reproduced": 1, "categories": ["gradient_instability"]}}


def _classification() -> tuple[Classification, dict]:
    loss = syn.decay(30)
    loss[20:] = float("nan")
    run = syn.make_run(syn.steps_events(loss), syn.nonfinite(20, "loss", "fc2"),
                       syn.error("oom", step=30))
    sig = compute(run)
    return classify(sig), sig


def _finding(confirmed: bool, check: str = "gradient_flow") -> Finding:
    return Finding(check=check, root_cause="hyperparameter", confirmed=confirmed,
                   explanation="lr 10.0 makes the update/weight ratio explode",
                   location={"file": "train.py", "line": 12},
                   evidence={"update_ratio": 3.2, "lr": 10.0})


def _full(root) -> DebugSession:
    s = DebugSession.create(str(root), title="train.py")
    s.record_reproduce(REPRODUCE)
    cls, sig = _classification()
    s.record_classification(cls, sig)
    s.record_findings([_finding(False, "lr_range"), _finding(True)])
    return s


def _file(s: DebugSession) -> str:
    return os.path.join(s.directory, SESSION_FILE)


def _read_bytes(s: DebugSession) -> bytes:
    with open(_file(s), "rb") as fh:
        return fh.read()


# -- create / save / reload ------------------------------------------------------------------


def test_create_saves_an_empty_session(tmp_path):
    s = DebugSession.create(str(tmp_path / "sessions"), title="t")
    assert os.path.dirname(s.directory) == str(tmp_path / "sessions")
    with open(_file(s), encoding="utf-8") as fh:
        data = json.load(fh)
    assert data["schema"] == session_module.SCHEMA
    assert data["id"] == s.id == os.path.basename(s.directory)
    assert data["events"] == []
    assert s.phase == "reproduce"
    assert s.fix_allowed is False


def test_two_sessions_get_distinct_folders(tmp_path):
    a = DebugSession.create(str(tmp_path))
    b = DebugSession.create(str(tmp_path))
    assert a.id != b.id and a.directory != b.directory


def test_round_trip_report_identical(tmp_path):
    s = _full(tmp_path)
    before = s.report()
    for path in (s.directory, _file(s)):
        loaded = DebugSession.load(path)
        assert loaded.report() == before
        assert loaded.events == s.events
        assert loaded.id == s.id
    assert before["classification"]["primary"] == "gradient_instability"
    assert before["classification"]["secondary"] == ["memory_issue"]
    assert before["phase"] == "fix"


def test_round_trip_with_relative_root(tmp_path, monkeypatch):
    """The default root is relative (``.model_debugger``); a reload must give the same report."""
    monkeypatch.chdir(tmp_path)
    s = _full(".model_debugger")
    loaded = DebugSession.load(s.directory)
    assert loaded.report() == s.report()


def test_round_trip_preserves_classification_and_findings(tmp_path):
    s = _full(tmp_path)
    loaded = DebugSession.load(s.directory)
    assert loaded.classification == s.classification
    assert loaded.findings == s.findings
    assert [f.confirmed for f in loaded.findings] == [True, False]  # confirmed first
    assert loaded.reproduce == REPRODUCE


def test_reload_then_continue_appends_after_saved_events(tmp_path):
    s = DebugSession.create(str(tmp_path))
    s.record_reproduce(REPRODUCE)
    loaded = DebugSession.load(s.directory)
    cls, sig = _classification()
    loaded.record_classification(cls, sig)
    again = DebugSession.load(s.directory)
    assert [e["kind"] for e in again.events] == ["reproduce", "classify"]
    assert [e["seq"] for e in again.events] == [0, 1]


def test_events_property_is_a_copy(tmp_path):
    s = DebugSession.create(str(tmp_path))
    s.record_reproduce(REPRODUCE)
    s.events[0]["kind"] = "tampered"
    s.events.clear()
    assert [e["kind"] for e in s.events] == ["reproduce"]


# -- gates -----------------------------------------------------------------------------------


def test_classify_before_reproduce_is_refused_and_changes_nothing(tmp_path):
    s = DebugSession.create(str(tmp_path))
    events, on_disk = s.events, _read_bytes(s)
    cls, sig = _classification()
    with pytest.raises(GateError, match="classify refused.*reproduce"):
        s.record_classification(cls, sig)
    assert s.events == events
    assert _read_bytes(s) == on_disk
    assert s.phase == "reproduce"
    assert s.classification is None


def test_isolate_before_classify_is_refused_and_changes_nothing(tmp_path):
    s = DebugSession.create(str(tmp_path))
    s.record_reproduce(REPRODUCE)
    events, on_disk = s.events, _read_bytes(s)
    with pytest.raises(GateError, match="isolate refused.*classification"):
        s.record_findings([_finding(True)])
    assert s.events == events
    assert _read_bytes(s) == on_disk
    assert s.findings == []
    assert s.fix_allowed is False
    assert s.phase == "classify"


def test_gate_error_is_a_session_error():
    assert issubclass(GateError, SessionError)


def test_fix_allowed_only_after_a_confirmed_finding(tmp_path):
    s = DebugSession.create(str(tmp_path))
    assert s.fix_allowed is False
    assert s.gates()["fix"] is not None
    s.record_reproduce(REPRODUCE)
    assert s.fix_allowed is False and s.phase == "classify"
    cls, sig = _classification()
    s.record_classification(cls, sig)
    assert s.fix_allowed is False and s.phase == "isolate"
    s.record_findings([])
    assert s.fix_allowed is False
    s.record_findings([_finding(False), _finding(False, "lr_range")])
    assert s.fix_allowed is False
    assert s.phase == "isolate"
    assert s.gates()["fix"] is not None
    assert s.report()["fix_allowed"] is False
    s.record_findings([_finding(False, "lr_range"), _finding(True)])
    assert s.fix_allowed is True
    assert s.phase == "fix"
    assert s.gates()["fix"] is None
    assert s.gates()["verify"] is not None
    assert s.report()["fix_allowed"] is True
    assert DebugSession.load(s.directory).fix_allowed is True


def test_latest_isolate_record_decides_the_fix_gate(tmp_path):
    s = _full(tmp_path)
    assert s.fix_allowed is True
    s.record_findings([_finding(False)])  # a later Isolate run refuted the hypothesis
    assert s.fix_allowed is False
    assert s.phase == "isolate"


def test_gates_match_phase(tmp_path):
    s = DebugSession.create(str(tmp_path))
    assert s.gates() == {"reproduce": None, "classify": "needs a reproduce record",
                         "isolate": "needs a classification",
                         "fix": "needs a confirmed finding from Isolate",
                         "verify": "needs an approved fix"}
    s.record_reproduce(REPRODUCE)
    assert s.gates()["classify"] is None


def test_phase_and_gate_agree_for_any_reproduce_record(tmp_path):
    """Once a reproduce record exists the phase is ``classify``; its gate must then be open."""
    s = DebugSession.create(str(tmp_path))
    with pytest.raises(RecordError, match="status"):
        s.record_reproduce({})  # typed: a record without a status is refused, nothing saved
    assert s.events == []
    s.record_reproduce({"status": "reproduced"})
    assert s.phase == "classify"
    assert s.gates()["classify"] is None
    cls, sig = _classification()
    s.record_classification(cls, sig)
    assert s.phase == "isolate"


# -- atomic save -----------------------------------------------------------------------------


def _leftovers(directory: str) -> list[str]:
    return [n for n in os.listdir(directory) if n not in (SESSION_FILE, "runs", ".lock")]  # the lock stays


def test_save_leaves_no_temp_files(tmp_path):
    s = _full(tmp_path)
    for k in range(5):
        s.record_note(f"note {k}")
    s.run_dir(0)
    assert _leftovers(s.directory) == []
    assert sorted(os.listdir(tmp_path)) == [s.id]


def test_failed_save_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch):
    s = DebugSession.create(str(tmp_path))
    s.record_reproduce(REPRODUCE)
    on_disk = _read_bytes(s)

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(session_module.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        s.record_note("lost")
    monkeypatch.undo()
    assert _leftovers(s.directory) == []
    assert _read_bytes(s) == on_disk
    assert [e["kind"] for e in DebugSession.load(s.directory).events] == ["reproduce"]


def test_failed_serialization_keeps_the_old_file_and_no_temp(tmp_path):
    s = DebugSession.create(str(tmp_path))
    on_disk = _read_bytes(s)

    class Unjsonable:
        def __str__(self):
            raise RuntimeError("cannot serialize")

    with pytest.raises(RuntimeError, match="cannot serialize"):
        s._append("note", value=Unjsonable())
    assert _leftovers(s.directory) == []
    assert _read_bytes(s) == on_disk


# -- unusable files --------------------------------------------------------------------------


def _expect_session_error(path, *fragments):
    with pytest.raises(SessionError) as info:
        DebugSession.load(str(path))
    assert not isinstance(info.value, GateError)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_corrupt_json_raises_session_error(tmp_path):
    s = DebugSession.create(str(tmp_path))
    with open(_file(s), "w", encoding="utf-8") as fh:
        fh.write('{"schema": "model_debugger.session/1", "events": [')  # truncated
    _expect_session_error(s.directory, "corrupt", "not valid JSON", SESSION_FILE)


def test_binary_garbage_raises_session_error(tmp_path):
    path = tmp_path / SESSION_FILE
    path.write_bytes(b"\xff\xfe\x00garbage")
    _expect_session_error(path, "corrupt")


@pytest.mark.parametrize("document", [
    {"schema": "jupyter.notebook/4", "cells": []},
    {"cells": [], "nbformat": 4},
    [1, 2, 3],
    "a string",
])
def test_foreign_json_raises_session_error(tmp_path, document):
    path = tmp_path / "other.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    message = _expect_session_error(path, "not a model_debugger session",
                                    session_module.SCHEMA)
    if isinstance(document, dict) and "schema" in document:
        assert document["schema"] in message


def test_right_schema_without_events_raises_session_error(tmp_path):
    path = tmp_path / SESSION_FILE
    path.write_text(json.dumps({"schema": session_module.SCHEMA, "id": "x"}), encoding="utf-8")
    _expect_session_error(path, "corrupt", "events")


def test_missing_file_raises_session_error(tmp_path):
    _expect_session_error(tmp_path / "nowhere" / SESSION_FILE, "no model_debugger session")


def test_folder_without_session_file_raises_session_error(tmp_path):
    _expect_session_error(tmp_path, "no model_debugger session", SESSION_FILE)


# -- report schema ---------------------------------------------------------------------------

REPORT_KEYS = {"schema", "phase", "fix_allowed", "reproduce", "classification", "findings", "fix",
               "verification"}


def test_report_of_a_new_session(tmp_path):
    rep = DebugSession.create(str(tmp_path)).report()
    assert REPORT_KEYS <= set(rep)
    assert rep["schema"] == REPORT_SCHEMA == "model_debugger.report/1"
    assert rep["phase"] == "reproduce"
    assert rep["fix_allowed"] is False
    assert rep["reproduce"] is None
    assert rep["classification"] is None
    assert rep["findings"] == []
    assert rep["fix"] is None
    assert rep["verification"] is None


def test_report_schema_after_isolate(tmp_path):
    rep = _full(tmp_path).report()
    assert REPORT_KEYS <= set(rep)
    assert rep["phase"] in session_module.PHASES
    assert isinstance(rep["fix_allowed"], bool)
    assert rep["reproduce"] == REPRODUCE
    cls = rep["classification"]
    assert set(cls) == {"primary", "secondary", "evidence"}
    assert isinstance(cls["primary"], str) and isinstance(cls["secondary"], list)
    assert cls["evidence"], "a problem classification cites evidence"
    for ev in cls["evidence"]:
        assert set(ev) == {"signal", "value", "detail"}
        assert isinstance(ev["signal"], str) and isinstance(ev["detail"], str)
        assert isinstance(ev["value"], (int, float, str))
    assert [f["check"] for f in rep["findings"]] == ["gradient_flow", "lr_range"]
    assert set(rep["findings"][0]) == {"check", "root_cause", "confirmed", "explanation",
                                       "location", "evidence"}
    json.dumps(rep, allow_nan=False)


def test_report_evidence_nonfinite_values_are_strings(tmp_path):
    s = DebugSession.create(str(tmp_path))
    s.record_reproduce(REPRODUCE)
    cls = Classification("gradient_instability", (),
                         (Evidence("loss_max", float("inf"), "a spike"),
                          Evidence("loss_final", float("nan"), "non-finite")))
    s.record_classification(cls, {})
    rep = DebugSession.load(s.directory).report()
    assert [e["value"] for e in rep["classification"]["evidence"]] == ["inf", "nan"]
    json.dumps(rep, allow_nan=False)
