"""Bad input gets one clear line naming the flag and its range, never a traceback or a verdict.

Every bad flag goes through the real CLI (``model_debugger.cli.main`` and a real subprocess),
every bad magic argument through a real IPython ``InteractiveShell``, the API entry points get
the same values; scripts that cannot run (binary, empty, not UTF-8, a syntax error), logs that
cannot be read (non-finite or huge step/epoch, a field over 128 KB, JSON nested thousands deep)
and a ``%%fix`` cell with a syntax error are refused before anything is recorded.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from test_fix import LR_FIX, _edit, _f, _session

from model_debugger import logs, notebook
from model_debugger.cli import main
from model_debugger.diagnose import diagnose_script, verify_script
from model_debugger.logs import load_log
from model_debugger.phases import FixRefused, plan_fix
from model_debugger.phases.verify import seeds_for
from model_debugger.session import DebugSession

SEED = "0 <= seed < 2**32"
RUNS = "from 1 to 100"
SECONDS = "finite number of seconds > 0"
BUDGET = "finite number of seconds >= 0"


def _cli(capsys, *argv) -> tuple[int, str, str]:
    """``main(argv)`` as the console script runs it: (exit code, stdout, stderr)."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse usage errors exit 2
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _one_clear_line(code: int, out: str, err: str, *words: str) -> str:
    assert code == 2, (code, out, err)
    assert not out, "no report on stdout for bad input"
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got {err!r}"
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


@pytest.fixture
def script(tmp_path):
    """A script that would run (and be called healthy) if the flags were not checked."""
    path = tmp_path / "train.py"
    path.write_text("print('loss=1.0')\n")
    return str(path)


# -- CLI flags -------------------------------------------------------------------------------

BAD_DIAGNOSE = [
    (["--seed", "-1"], "--seed", SEED),
    (["--seed", str(2 ** 64)], "--seed", SEED),
    (["--seed", "2**64"], "--seed", SEED),
    (["--seed", "1.5"], "--seed", SEED),
    (["--max-seconds", "-5"], "--max-seconds", SECONDS),
    (["--max-seconds", "0"], "--max-seconds", SECONDS),
    (["--max-seconds", "nan"], "--max-seconds", SECONDS),
    (["--max-seconds", "inf"], "--max-seconds", SECONDS),
    (["--max-seconds", "1e300"], "--max-seconds", SECONDS),
    (["--runs", "-1"], "--runs", RUNS),
    (["--runs", "0"], "--runs", RUNS),
    (["--runs", "100000"], "--runs", RUNS),
    (["--probe-seconds", "-1"], "--probe-seconds", BUDGET),
    (["--probe-seconds", "nan"], "--probe-seconds", BUDGET),
    (["--root", ""], "--root", "non-empty path"),
]


@pytest.mark.parametrize("flags,flag,rule", BAD_DIAGNOSE, ids=lambda v: " ".join(v)
                         if isinstance(v, list) else None)
def test_bad_diagnose_flag_is_one_line_naming_the_range(tmp_path, capsys, script, flags, flag,
                                                        rule):
    root = tmp_path / "sessions"
    argv = ["diagnose", script, "--root", str(root), *flags]
    _one_clear_line(*_cli(capsys, *argv), flag, rule)
    assert not root.exists(), "no session for bad input"


def test_seed_plus_runs_past_the_range_is_refused(tmp_path, capsys, script):
    root = tmp_path / "sessions"
    line = _one_clear_line(*_cli(capsys, "diagnose", script, "--root", str(root), "--seed",
                                 str(2 ** 32 - 1), "--runs", "2"), "seed", SEED)
    assert "4294967296" in line
    assert not root.exists()


@pytest.mark.parametrize("flags,flag,rule", [
    (["--seeds", "0"], "--seeds", RUNS),
    (["--seeds", "-1"], "--seeds", RUNS),
    (["--max-seconds", "nan"], "--max-seconds", SECONDS),
    (["--max-seconds", "-5"], "--max-seconds", SECONDS),
])
def test_bad_verify_flag_is_one_line(tmp_path, capsys, flags, flag, rule):
    s = _session(tmp_path, [_f("lr_range", "hyperparameter")])
    fixed = tmp_path / "fixed.py"
    fixed.write_text(_edit(*LR_FIX))
    events = len(s.events)
    _one_clear_line(*_cli(capsys, "verify", s.directory, "--fixed", str(fixed), "--yes",
                          *flags), flag, rule)
    assert len(DebugSession.load(s.directory).events) == events, "nothing recorded"


def test_bad_isolate_flag_is_one_line(tmp_path, capsys):
    s = _session(tmp_path, [_f("lr_range", "hyperparameter")])
    _one_clear_line(*_cli(capsys, "isolate", s.directory, "--probe-seconds", "-1"),
                    "--probe-seconds", BUDGET)


@pytest.mark.parametrize("flags,words", [
    (["--seed", "-1"], ("--seed", SEED)),
    (["--max-seconds", "nan"], ("--max-seconds", SECONDS)),
])
def test_bad_flags_through_a_real_process(tmp_path, script, flags, words):
    root = tmp_path / "sessions"
    proc = subprocess.run([sys.executable, "-m", "model_debugger.cli", "diagnose", script,
                           "--json", "--root", str(root), *flags],
                          capture_output=True, text=True, timeout=120)
    _one_clear_line(proc.returncode, proc.stdout, proc.stderr, *words)
    assert not root.exists()


# -- scripts that cannot run -----------------------------------------------------------------

BAD_SCRIPTS = [
    ("binary.py", b"\x7fELF\x02\x01\x01\x00\x00\x00", "binary file"),
    ("empty.py", b"", "the script is empty"),
    ("blank.py", b"\n   \n# only a comment\n", "the script is empty"),
    ("latin.py", b"x = 'caf\xe9'\nprint(x)\n", "not utf-8 text (byte 0xe9"),
    ("cookie.py", b"# -*- coding: no-such-codec -*-\nx = 1\n", "bad source encoding"),
    ("typo.py", b"import os\nx = 1\nfor i in range(3)\n    print(i)\n",
     "typo.py: syntax error at line 3: expected ':'"),
]


@pytest.mark.parametrize("name,data,words", BAD_SCRIPTS, ids=[b[0] for b in BAD_SCRIPTS])
def test_a_script_that_cannot_run_is_refused_before_any_session(tmp_path, capsys, name, data,
                                                                 words):
    path = tmp_path / name
    path.write_bytes(data)
    root = tmp_path / "sessions"
    line = _one_clear_line(*_cli(capsys, "diagnose", str(path), "--root", str(root)), words)
    assert line.startswith("model-debugger: error: ")
    assert "healthy" not in line
    assert not root.exists(), "no session (and so no verdict) for a script that cannot run"
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        diagnose_script(str(path), root=str(root))
    assert not root.exists()


def test_a_script_in_a_declared_encoding_still_runs_the_checks(tmp_path):
    from model_debugger._validate import check_script

    path = tmp_path / "l1.py"
    path.write_bytes(b"# coding: latin-1\nx = 'caf\xe9'\n")
    assert "café" in check_script(str(path))


def test_a_fixed_script_that_cannot_run_is_refused(tmp_path, capsys):
    s = _session(tmp_path, [_f("lr_range", "hyperparameter")])
    events = len(s.events)
    fixed = tmp_path / "fixed.py"
    fixed.write_bytes(b"\xff\xfe\x00binary")
    _one_clear_line(*_cli(capsys, "verify", s.directory, "--fixed", str(fixed), "--yes"),
                    "fixed.py: a binary file")
    fixed.write_text(_edit(*LR_FIX).replace("for epoch in range(3):", "for epoch in range(3)"))
    _one_clear_line(*_cli(capsys, "verify", s.directory, "--fixed", str(fixed), "--yes"),
                    "fixed.py: syntax error at line 22:")
    assert len(DebugSession.load(s.directory).events) == events


# -- the Python API --------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,words", [
    ({"runs": -1}, ("runs", RUNS)),
    ({"runs": 0}, ("runs", RUNS)),
    ({"seed": -1}, ("seed", SEED)),
    ({"seed": 2 ** 64}, ("seed", SEED)),
    ({"seed": True}, ("seed", SEED)),
    ({"max_seconds": -5}, ("max_seconds", SECONDS)),
    ({"max_seconds": float("nan")}, ("max_seconds", SECONDS)),
    ({"probe_seconds": -1}, ("probe_seconds", BUDGET)),
    ({"probe_seconds": float("inf")}, ("probe_seconds", BUDGET)),
])
def test_diagnose_script_rejects_out_of_range_values(tmp_path, script, kwargs, words):
    root = tmp_path / "sessions"
    with pytest.raises(ValueError) as info:
        diagnose_script(script, root=str(root), **kwargs)
    for word in words:
        assert word in str(info.value)
    assert not root.exists()


def test_verify_api_rejects_out_of_range_values(tmp_path):
    s = _session(tmp_path, [_f("lr_range", "hyperparameter")])
    with pytest.raises(ValueError, match="seeds must hold 1..100"):
        verify_script(s, seeds=list(range(101)))
    with pytest.raises(ValueError, match=r"each of seeds must be .*0 <= seed < 2\*\*32"):
        verify_script(s, seeds=[0, -1])
    with pytest.raises(ValueError, match="max_seconds must be a finite number of seconds > 0"):
        verify_script(s, seeds=[0], max_seconds=float("nan"))
    with pytest.raises(ValueError, match="seeds must be an integer from 1 to 100"):
        seeds_for(s, -1)


def test_the_phases_reject_out_of_range_values(tmp_path):
    from model_debugger import phases
    from model_debugger.artifacts import CellArtifact

    s = DebugSession.create(str(tmp_path / "sessions"), title="notebook")
    art = CellArtifact({}, "x = 1\n")
    with pytest.raises(ValueError, match="runs must be an integer from 1 to 100"):
        phases.reproduce(s, art, runs=-1)
    with pytest.raises(ValueError, match=r"seed must be an integer with 0 <= seed < 2\*\*32"):
        phases.reproduce(s, art, seed=-1)
    with pytest.raises(ValueError, match="budget must be a finite number of seconds >= 0"):
        phases.isolate(s, art, budget=-1)
    with pytest.raises(ValueError, match="unknown probe id 'nope'"):
        phases.isolate(s, art, ["nope"])
    with pytest.raises(ValueError, match="each of seeds must be an integer with 0 <= seed"):
        phases.verify(s, art, [-1])
    assert s.events == [], "nothing was recorded"


# -- magics in a real shell ------------------------------------------------------------------

@pytest.fixture
def shell(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "model_debugger")
    yield ip
    ip.run_line_magic("unload_ext", "model_debugger")


BAD_MAGICS = [
    ("reproduce", "--runs -1", "x = 1\n", ("--runs", RUNS)),
    ("reproduce", "--runs 0", "x = 1\n", ("--runs", RUNS)),
    ("reproduce", "--seed -1", "x = 1\n", ("--seed", SEED)),
    ("reproduce", f"--seed {2 ** 64}", "x = 1\n", ("--seed", SEED)),
    ("reproduce", f"--seed {2 ** 32 - 1} --runs 3", "x = 1\n", ("seed", SEED)),
    ("reproduce", "", "for i in range(3)\n    pass\n", ("the cell: syntax error at line 1",)),
    ("reproduce", "", "\n\n", ("the cell is empty",)),
    ("isolate", "--budget -1", None, ("--budget", BUDGET)),
    ("isolate", "--budget nan", None, ("--budget", BUDGET)),
    ("isolate", "--probe nope", None, ("unknown probe id 'nope'", "lr_range")),
    ("verify", "--seeds 0", None, ("--seeds", RUNS)),
    ("verify", "--seeds -3", None, ("--seeds", RUNS)),
    ("classify", "--runs 3", None, ("unrecognized arguments",)),
    ("md_status", "extra", None, ("unrecognized arguments",)),
    ("evidence", "--bogus", "x = 1\n", ("unrecognized arguments",)),
]


@pytest.mark.parametrize("name,line,cell,words", BAD_MAGICS,
                         ids=[f"{m[0]} {m[1]}" for m in BAD_MAGICS])
def test_bad_magic_argument_is_a_usage_error_naming_the_range(shell, name, line, cell, words):
    with capture_output():
        with pytest.raises(UsageError) as info:
            if cell is None:
                shell.run_line_magic(name, line)
            else:
                shell.run_cell_magic(name, line, cell)
    message = str(info.value)
    assert "\n" not in message.strip()
    for word in words:
        assert word in message, (word, message)
    assert not notebook.current_session().has_session, "no session for bad input"


def test_a_bad_magic_in_a_cell_shows_one_usage_line_not_a_verdict(shell):
    with capture_output() as cap:
        result = shell.run_cell("%%reproduce --runs -1\nx = 1\n", store_history=True)
    shown = cap.stdout + cap.stderr
    assert isinstance(result.error_in_exec, UsageError)
    assert "UsageError: argument --runs: must be an integer from 1 to 100" in shown
    assert "Traceback" not in shown and "healthy" not in shown and "reproduced" not in shown
    assert not cap.outputs


def test_fix_cell_with_a_syntax_error_is_refused_as_a_syntax_error(shell, tmp_path):
    s = _session(tmp_path, [_f("lr_range", "hyperparameter")])
    broken = _edit(*LR_FIX).replace("        loss.backward()\n", "        loss.backward(\n")
    with pytest.raises(FixRefused) as info:
        plan_fix(s, broken)
    assert info.value.reasons == [
        "the fixed code: syntax error at line 25: '(' was never closed"]
    notebook.current_session()._session = s  # the kernel's session is this one
    with capture_output() as cap:
        shell.run_cell_magic("fix", "--yes", broken)
    shown = cap.stdout + "\n".join(o.data.get("text/plain", "") for o in cap.outputs)
    assert "syntax error at line 25" in shown
    assert "architecture" not in shown
    assert DebugSession.load(s.directory).pending_fix is None
    assert not any(e["kind"] == "fix" for e in DebugSession.load(s.directory).events)


# -- logs ------------------------------------------------------------------------------------

def _csv(path, header, rows) -> str:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


BAD_LOGS = [
    ("inf_step.csv", "step,loss\n0,1.0\ninf,0.5\n", "row 2: the step column 'step' holds 'inf'"),
    ("nan_step.csv", "step,loss\n0,1.0\nnan,0.5\n", "the step column 'step' holds 'nan'"),
    ("huge_step.csv", "step,loss\n0,1.0\n1e300,0.5\n", "0 <= step < 2**53"),
    ("huge_epoch.csv", "step,epoch,loss\n0,0,1.0\n1,1e20,0.5\n", "0 <= epoch < 2**53"),
    ("neg_epoch.csv", "step,epoch,loss\n0,0,1.0\n1,-inf,0.5\n", "epoch column 'epoch'"),
    ("bigint_step.jsonl", '{"step": 1' + "0" * 400 + ', "loss": 1.0}\n', "0 <= step < 2**53"),
    ("field.csv", "step,loss,note\n0,1.0," + "x" * 200_000 + "\n", "a field is over 128 KB"),
    ("deep.json", "[" * 5000 + "]" * 5000, "JSON nested deeper than 64 levels"),
    ("deep.jsonl", '{"loss": 1.0}\n{"loss": ' + "[" * 5000 + "]" * 5000 + "}\n",
     "deep.jsonl:2: JSON nested deeper than 64 levels"),
    ("deep_dict.json", '{"rows": ' + '{"a": ' * 3000 + "1" + "}" * 3001,
     "JSON nested deeper than 64 levels"),
]


@pytest.mark.parametrize("name,text,words", BAD_LOGS, ids=[b[0] for b in BAD_LOGS])
def test_a_bad_log_is_refused_with_a_clear_error(tmp_path, capsys, name, text, words):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_log(str(path))
    assert words in str(info.value) and name in str(info.value)
    root = tmp_path / "sessions"
    _one_clear_line(*_cli(capsys, "diagnose", str(path), "--root", str(root)), words)
    assert not root.exists()


def test_json_nesting_is_counted_outside_strings(tmp_path):
    ok = tmp_path / "ok.jsonl"
    ok.write_text("".join(f'{{"step": {i}, "loss": {1 / (i + 1)}, "note": "{"[" * 200}"}}\n'
                          for i in range(5)))
    assert len(load_log(str(ok)).steps) == 5, "brackets inside strings are not nesting"
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"loss": 1.0, "note": "]]]]"}\n{"loss": ' + "[" * 2000 + "]" * 2000 + "}\n")
    with pytest.raises(ValueError, match="deep.jsonl:2: JSON nested deeper than 64 levels"):
        load_log(str(deep))


class _Column(str):
    """A column name that counts how often it is compared for equality."""

    compared = 0

    def __eq__(self, other):
        _Column.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_csv_columns_are_gathered_in_linear_time():
    """Gathering N columns compares names O(N) times, not O(N^2) (5000 columns took 21 s)."""
    n = 400
    names = [_Column(f"metric_{i}") for i in range(n)]
    rows = [{_Column("step"): str(r), _Column("loss"): str(1 / (r + 1)),
             **{c: str(r * 0.1) for c in names}} for r in range(3)]
    _Column.compared = 0
    run = logs._rows_to_run(rows, None)
    assert len(run.steps) == 3
    assert _Column.compared < 10 * n, f"{_Column.compared} name comparisons for {n} columns"
    assert len({e["name"] for e in run.events if e["t"] == "metric"}) == n


def test_a_wide_csv_reads_every_column_and_a_huge_epoch_is_refused(tmp_path):
    header = ["step", "loss"] + [f"m{i}" for i in range(2000)]
    path = _csv(tmp_path / "wide.csv", header, [[r, 1 / (r + 1)] + [r] * 2000 for r in range(3)])
    run = load_log(path)
    assert len(run.steps) == 3
    assert len({e["name"] for e in run.events if e["t"] == "metric"}) == 2000
    path = _csv(tmp_path / "wide2.csv", ["epoch", *header],
                [[0, 0, 1.0] + [0] * 2000, [2 ** 60, 1, 0.5] + [1] * 2000])
    with pytest.raises(ValueError, match="row 2: the epoch column 'epoch' holds '1152921504"):
        load_log(path)


def test_a_non_utf8_log_is_refused(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes(b"step,loss\n0,1.0\xe9\n")
    with pytest.raises(ValueError, match="not UTF-8 text"):
        load_log(str(path))


def test_the_time_limit_counts_the_script_not_the_set_up(tmp_path, monkeypatch):
    """A child whose start-up is slow (here 11 s) still gets its full time limit."""
    from model_debugger.records import Run
    from model_debugger.runner import run_script

    slow = tmp_path / "site"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text("import time\ntime.sleep(11)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(slow), *filter(None, [os.environ.get("PYTHONPATH")])]))
    path = tmp_path / "quick.py"
    path.write_text("import time\nfor i in range(3):\n    print(f'loss={1 / (i + 1)}')\n"
                    "    time.sleep(0.1)\n")
    record = str(tmp_path / "record.jsonl")
    result = run_script(str(path), [], record, max_seconds=0.5)
    assert not result.timed_out, "the backstop killed the child during its set-up"
    assert result.returncode == 0
    assert Run.load(record).ended


@pytest.mark.parametrize("name,text", [
    ("bom.csv", "step,loss\n10,1.0\n20,0.5\n30,0.25\n"),
    ("bom.jsonl", '{"step": 10, "loss": 1.0}\n{"step": 20, "loss": 0.5}\n'
                  '{"step": 30, "loss": 0.25}\n'),
    ("bom.json", '[{"step": 10, "loss": 1.0}, {"step": 20, "loss": 0.5}, '
                 '{"step": 30, "loss": 0.25}]'),
])
def test_a_log_written_with_a_bom_keeps_its_step_column(tmp_path, name, text):
    """Excel and PowerShell write UTF-8 with a BOM: the header is still ``step``, not ``\\ufeffstep``."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8-sig")
    run = load_log(str(path))
    assert [s["i"] for s in run.steps] == [10, 20, 30]
    assert [s["loss"] for s in run.steps] == [1.0, 0.5, 0.25]
    assert not any("\ufeff" in str(e) for e in run.events)
