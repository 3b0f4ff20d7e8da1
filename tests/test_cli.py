"""The CLI end to end: verdicts over several runs, time limits, script arguments, usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from scenario_suite import SCENARIOS, diagnose

from model_debugger.session import DebugSession


def test_runs_reports_recurrence_and_tried(tmp_path):
    report, _ = diagnose(SCENARIOS / "gi_lr_too_high.py", tmp_path, "--runs", "3", "--seed", "0")
    rep = report["reproduce"]
    assert rep["status"] == "reproduced"
    assert rep["summary"] == "reproduced 3/3"
    assert rep["runs"] == {"total": 3, "reproduced": 3,
                           "categories": ["gradient_instability"] * 3}
    session = DebugSession.load(report["session_dir"])
    assert session.report() == report
    assert (tmp_path / report["session"] / "runs" / "2" / "record.jsonl").exists()


def test_healthy_runs_are_not_reproduced_with_what_was_tried(tmp_path):
    report, _ = diagnose(SCENARIOS / "healthy_mlp_adam.py", tmp_path, "--runs", "2",
                         "--seed", "7")
    rep = report["reproduce"]
    assert rep["status"] == "not_reproduced" and rep["summary"] == "not reproduced 0/2"
    assert len(rep["tried"]) == 2 and "seed=7" in rep["tried"][0] and "seed=8" in rep["tried"][1]


def test_max_seconds_classifies_the_partial_record(tmp_path):
    script = tmp_path / "endless.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        model = nn.Sequential(nn.Linear(128, 4096), nn.ReLU(), nn.Linear(4096, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        kept = []
        while True:  # runs until stopped; every step keeps a graph alive
            x = torch.randn(256, 128)
            loss = nn.functional.cross_entropy(model(x), torch.randint(0, 10, (256,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            kept.append(model(x))
    """))
    report, _ = diagnose(script, tmp_path / "s", "--max-seconds", "20")
    rep = report["reproduce"]
    assert rep["error"] is None, "a planned stop at the time limit is not a crash"
    assert rep["stopped_at_time_limit"] and rep["timed_out"]
    assert rep["status"] == "reproduced"
    assert rep["steps"] >= 20
    assert report["classification"]["primary"] == "memory_issue"


def test_script_arguments_after_double_dash(tmp_path):
    script = tmp_path / "args.py"
    script.write_text("import sys\nprint(f'nargs={len(sys.argv) - 1}')\n"
                      "assert sys.argv[1:] == ['--epochs', '3', 'x y'], sys.argv\n")
    report, stderr = diagnose(script, tmp_path / "s", "--", "--epochs", "3", "x y")
    assert report["reproduce"]["error"] is None, stderr
    # no training step ran: not observed (never healthy), and nothing is classified
    assert report["reproduce"]["status"] == "not_observed"
    assert report["classification"] is None


def test_crashing_script_is_data_not_a_cli_failure(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("import torch\nx = torch.ones(3)\nraise ValueError('shapes do not match')\n")
    report, _ = diagnose(script, tmp_path / "s")
    rep = report["reproduce"]
    # it crashed before any training step: not observed, the error and the reason kept
    assert rep["status"] == "not_observed" and "crashed during set-up" in rep["reason"]
    assert rep["error"] == "ValueError: shapes do not match"
    assert rep["error_location"] == {"file": str(script), "line": 3}


def test_syntax_error_is_located_in_the_script(tmp_path):
    """A script that does not compile is refused before any run (no session, no verdict)."""
    script = tmp_path / "typo.py"
    script.write_text("import torch\nx = (\n")
    proc = _cli("diagnose", str(script), "--json", "--root", str(tmp_path / "s"))
    assert proc.returncode == 2 and not proc.stdout
    assert proc.stderr.strip() == ("model-debugger: error: typo.py: syntax error at line 2: "
                                   "'(' was never closed")
    assert not (tmp_path / "s").exists()


def test_syntax_error_in_an_imported_module_is_located(tmp_path):
    (tmp_path / "helper.py").write_text("def f(:\n    pass\n")
    script = tmp_path / "train.py"
    script.write_text("import helper\n")
    report, stderr = diagnose(script, tmp_path / "s")
    rep = report["reproduce"]
    assert rep["status"] in ("crashed", "not_observed"), rep  # never a healthy verdict
    assert rep["error"].startswith("SyntaxError")
    assert rep["error_location"]["file"] in (str(script), str(tmp_path / "helper.py"))
    assert "I/O operation on closed file" not in stderr


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "model_debugger.cli", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def test_usage_errors_exit_nonzero_with_a_message(tmp_path):
    missing = _cli("diagnose", str(tmp_path / "nope.py"), "--json")
    assert missing.returncode == 2 and "no such file" in missing.stderr and not missing.stdout
    runs = _cli("diagnose", str(SCENARIOS / "healthy_mlp_adam.py"), "--runs", "0")
    assert runs.returncode == 2 and "--runs" in runs.stderr
    bad = _cli("frobnicate")
    assert bad.returncode == 2
    folder = _cli("diagnose", str(tmp_path), "--json", "--root", str(tmp_path / "s"))
    assert folder.returncode == 2 and "folder" in folder.stderr and not folder.stdout
    assert not (tmp_path / "s").exists(), "no session is created for bad input"


def test_human_output_and_report_command(tmp_path):
    proc = _cli("diagnose", str(SCENARIOS / "lnd_lr_too_low.py"), "--root", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "Classification: loss_not_decreasing (secondary: " in proc.stdout
    assert "Session saved: " in proc.stdout
    saved = proc.stdout.split("Session saved: ")[1].splitlines()[0].strip()
    last = proc.stdout.strip().splitlines()[-1]  # the exact command of the next phase
    assert last.startswith("Next: ") and "model-debugger " in last and saved in last
    again = _cli("report", saved, "--json")
    assert json.loads(again.stdout)["classification"]["primary"] == "loss_not_decreasing"
    corrupt = tmp_path / "broken"
    corrupt.mkdir()
    (corrupt / "session.json").write_text("{not json")
    bad = _cli("report", str(corrupt))
    assert bad.returncode == 2 and "corrupt" in bad.stderr
    data = json.loads((tmp_path / saved.rsplit("/", 1)[1] / "session.json").read_text())
    data["events"].append({"kind": "classify", "classification": {}})
    (corrupt / "session.json").write_text(json.dumps(data))
    broken = _cli("report", str(corrupt))
    assert broken.returncode == 2 and "corrupt" in broken.stderr, broken.stderr
