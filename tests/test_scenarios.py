"""Every scenario script, diagnosed through the CLI, gets the category it was written to show,
and Isolate names the root cause it was written with, at the right line."""

from __future__ import annotations

import pytest
from scenario_suite import diagnose_all, expectations, scenario_paths

from model_debugger.records import CATEGORIES, HEALTHY

PATHS = scenario_paths()


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return diagnose_all(PATHS, tmp_path_factory.mktemp("sessions"))


def test_suite_covers_every_category_twice():
    expected = [expectations(p)["category"] for p in PATHS]
    for category in (*CATEGORIES, HEALTHY):
        assert expected.count(category) >= 2, f"need two scenarios for {category}"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_scenario_category(path, reports):
    report, stderr = reports[path.name]
    want = expectations(path)["category"]
    cls = report["classification"]
    assert cls["primary"] == want, (cls, report["reproduce"], stderr[-2000:])
    assert want not in cls["secondary"]
    if "secondary" in expectations(path):
        assert expectations(path)["secondary"] in cls["secondary"], cls
    assert cls["evidence"], "a classification must cite numbers"
    for ev in cls["evidence"]:
        assert set(ev) == {"signal", "value", "detail"}
    if "evidence" in expectations(path):  # "expect-evidence: <signal> <words of its detail>"
        signal, _, words = expectations(path)["evidence"].partition(" ")
        details = [ev["detail"] for ev in cls["evidence"] if ev["signal"] == signal]
        assert details and words in details[0], (signal, cls["evidence"])
    rep = report["reproduce"]
    if want == HEALTHY:
        assert rep["status"] == "not_reproduced" and rep["tried"]
    elif "revealed" in expectations(path):  # healthy signals; a probe measured the problem
        assert rep["status"] == "not_reproduced"
        assert cls["evidence"][0]["signal"] == f"{expectations(path)['revealed']}_confirmed"
    else:
        assert rep["status"] == "reproduced" and rep["summary"] == "reproduced 1/1"
    assert rep["steps"] > 0
    # the loop's backward() line points into the scenario script itself
    assert rep["code"]["backward"]["file"] == str(path)
    line = path.read_text().splitlines()[rep["code"]["backward"]["line"] - 1]
    assert expectations(path).get("backward", "backward(") in line  # Keras: fit / tape.gradient


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_scenario_root_cause(path, reports):
    report, _ = reports[path.name]
    want = expectations(path)
    confirmed = [f for f in report["findings"] if f["confirmed"]]
    if want["category"] == HEALTHY:
        assert not confirmed and not report["fix_allowed"] and report["phase"] == "isolate"
        if "hypothesis" not in want:
            assert report["findings"] == []
            return
        # healthy signals over a latent pitfall: reported, never confirmed, at the made line
        assert {f["check"] for f in report["findings"]} <= set(want["hypothesis"].split("|"))
        lines = path.read_text().splitlines()
        assert any(f["location"] and f["location"]["file"] == str(path)
                   and want["line"] in lines[f["location"]["line"] - 1]
                   for f in report["findings"]), report["findings"]
        return
    assert confirmed, f"no confirmed finding: {report['findings']}"
    root = confirmed[0]
    assert root["check"] in want["check"].split("|"), [
        (f["check"], f["root_cause"], f["evidence"].get("strength")) for f in confirmed]
    assert root["root_cause"] == want["root-cause"]
    assert root["location"]["file"] == str(path)
    line = path.read_text().splitlines()[root["location"]["line"] - 1]
    assert any(w in line for w in want["line"].split("|")), (root["location"], line)
    assert root["explanation"] and root["evidence"]
    if root["root_cause"] == "hardware":  # escalated, never fixed in code
        assert report["fix_allowed"] is False and report["escalations"][0]["check"] == root["check"]
        assert "escalate" in report["gates"]["fix"]
    else:
        assert report["fix_allowed"] is True and report["phase"] == "fix"
    # findings are ordered: confirmed first
    flags = [f["confirmed"] for f in report["findings"]]
    assert flags == sorted(flags, reverse=True)


def test_report_schema(reports):
    report, _ = next(iter(reports.values()))
    assert report["schema"] == "model_debugger.report/1"
    assert set(report) >= {"schema", "phase", "fix_allowed", "reproduce", "classification",
                           "findings", "fix", "verification"}
    assert set(report["reproduce"]) >= {"status", "steps", "epochs", "error", "seconds"}
    assert report["fix"] is None and report["verification"] is None
    for f in report["findings"]:
        assert set(f) == {"check", "root_cause", "confirmed", "location", "explanation",
                          "evidence"}
