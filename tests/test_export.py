"""Export: nbformat v4 notebook of a session, standalone repro.py, redaction of secrets."""

from __future__ import annotations

import base64
import copy
import json
import math
import os
import subprocess
import sys
import textwrap

import nbformat
import pytest

from model_debugger.export import (
    REDACTED,
    build_notebook,
    export,
    export_files,
    export_notebook,
    redact,
    redact_args,
    write_repro,
)
from model_debugger.records import Classification, Evidence, Finding, Run
from model_debugger.session import DebugSession

FAKE_HF = "hf_abcdefghijklmnopqrstuvwxyz012345"
FAKE_ENV_NAME = "MD_EXPORT_TEST_API_TOKEN"
FAKE_ENV_VALUE = "zq9-envsecret-7731-value"
PNG = b"\x89PNG\r\n\x1a\n"

pytest.importorskip("matplotlib")

TINY = textwrap.dedent(f'''
    import os
    import sys

    import torch
    from torch import nn

    steps = int(sys.argv[sys.argv.index("--steps") + 1])
    torch.manual_seed(0)
    X = torch.randn(64, 4)
    y = X.sum(1, keepdim=True)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=3.0)
    for step in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(X), y)
        loss.backward()
        opt.step()
        print(f"step {{step}}: train_loss={{loss.item():.4f}}")
    if os.environ.get("{FAKE_ENV_NAME}"):
        raise RuntimeError("upload refused for token {FAKE_HF} and key "
                           + os.environ["{FAKE_ENV_NAME}"])
''')


def _texts(nb) -> str:
    """All text a reader sees: cell sources and every text output (not the PNGs)."""
    out = []
    for cell in nb.cells:
        out.append(cell.source)
        for o in cell.get("outputs", []):
            out.append(o.get("text", ""))
            out.extend(v for k, v in o.get("data", {}).items() if k.startswith("text/"))
    return "\n".join(out)


def _pngs(nb) -> list[bytes]:
    return [base64.b64decode(o["data"]["image/png"]) for c in nb.cells
            for o in c.get("outputs", []) if "image/png" in o.get("data", {})]


def _headings(nb) -> list[str]:
    return [line for c in nb.cells if c.cell_type == "markdown"
            for line in c.source.splitlines() if line.startswith("## ")]


def _without_export_time(nb) -> dict:
    data = copy.deepcopy(dict(nb))
    data["metadata"]["model_debugger"].pop("exported", None)
    return json.loads(json.dumps(data))


def _valid_png(data: bytes) -> tuple[int, int]:
    """Decode a PNG fully (matplotlib's reader) and return its (height, width)."""
    import io

    from matplotlib.image import imread

    assert data.startswith(PNG)
    arr = imread(io.BytesIO(data), format="png")
    assert arr.ndim == 3 and arr.shape[0] > 100 and arr.shape[1] > 100
    return arr.shape[:2]


# -- a real session: the tiny script diagnosed by the product ----------------------------------
@pytest.fixture(scope="module")
def real(tmp_path_factory):
    pytest.importorskip("torch")
    from model_debugger.diagnose import diagnose_script

    root = tmp_path_factory.mktemp("real")
    script = root / "tiny.py"
    script.write_text(TINY)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(FAKE_ENV_NAME, FAKE_ENV_VALUE)
        with open(os.devnull, "w") as sink:
            session = diagnose_script(str(script), args=["--steps", "12"], runs=1, seed=0,
                                      root=str(root / "sessions"), stdout=sink,
                                      probe_seconds=1.0)
        yield session


def test_real_session_exports_a_valid_notebook_with_its_numbers(real, tmp_path):
    path = export_notebook(real, str(tmp_path / "out" / "session.ipynb"))
    assert path == str(tmp_path / "out" / "session.ipynb")
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.nbformat == 4
    meta = nb.metadata["model_debugger"]
    assert meta["session"] == real.id and meta["schema"] == "model_debugger.report/1"
    assert _headings(nb) == ["## 1. Reproduce", "## 2. Classify", "## 3. Isolate", "## 4. Fix",
                             "## 5. Verify"]
    text = _texts(nb)
    rep = real.report()
    run = Run.load(os.path.join(real.directory, "runs", "0", "record.jsonl"))
    # the command that was run, with its seed and arguments
    script = rep['reproduce']['code']['backward']['file']
    assert f"model_debugger.cli.main(['diagnose', {script!r}, '--runs', '1', '--seed', '0', " \
           "'--', '--steps', '12'])" in text
    assert rep["reproduce"]["summary"] in text
    assert f"steps: {rep['reproduce']['steps']}," in text
    assert f"| 1 | 0 | {len(run.steps)} | {run.series('loss')[0]:.6g} |" in text
    cls = rep["classification"]
    assert f"Primary category: **<code>{cls['primary']}</code>**" in text
    for ev in cls["evidence"]:
        value = ev["value"]
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        assert f"| {ev['signal']} | {shown} |" in text
    for f in rep["findings"]:
        loc = f["location"]
        assert f"| {f['check']} | {f['root_cause']} |" in text
        if loc:
            assert f"{loc['file']}:{loc['line']}" in text
    # phases not reached say so
    assert "**Not reached**" in text.split("## 4. Fix")[1]
    assert "needs an approved fix" in text.split("## 5. Verify")[1]
    pngs = _pngs(nb)
    assert len(pngs) == 2  # loss curve and gradient norms
    for data in pngs:
        _valid_png(data)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))


def test_export_reload_export_gives_the_same_notebook(real, tmp_path):
    first = export_notebook(real, str(tmp_path / "a.ipynb"))
    again = export_notebook(DebugSession.load(real.directory), str(tmp_path / "b.ipynb"))
    a, b = nbformat.read(first, as_version=4), nbformat.read(again, as_version=4)
    nbformat.validate(b)
    assert "exported" in a.metadata["model_debugger"]
    assert _without_export_time(a) == _without_export_time(b)
    assert _pngs(a) == _pngs(b)  # byte-identical plots: no timestamps in the PNGs


def test_secrets_in_captured_error_and_environment_are_redacted(real, tmp_path, monkeypatch):
    monkeypatch.setenv(FAKE_ENV_NAME, FAKE_ENV_VALUE)
    raw = json.dumps(real.report()) + open(os.path.join(real.directory, "runs", "0",
                                                         "record.jsonl")).read()
    assert FAKE_HF not in raw and FAKE_ENV_VALUE not in raw  # redacted when recorded
    assert REDACTED in raw
    out = export(real, str(tmp_path / "nb.ipynb"))
    for path in out.values():
        with open(path, encoding="utf-8") as fh:
            content = fh.read()
        assert FAKE_HF not in content and FAKE_ENV_VALUE not in content, path
        assert REDACTED in content
    text = _texts(nbformat.read(out["notebook"], as_version=4))
    assert f"upload refused for token {REDACTED} and key {REDACTED}" in text


def test_repro_py_reruns_the_reproduction(real, tmp_path):
    path = write_repro(real, str(tmp_path / "repro.py"))
    source = open(path, encoding="utf-8").read()
    assert "model_debugger.capture(record)" in source
    assert "ARGS = ['--steps', '12']" in source and "SEEDS = [0]" in source
    env = {k: v for k, v in os.environ.items() if k != FAKE_ENV_NAME}
    proc = subprocess.run([sys.executable, "repro.py", "--out", "runs"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    primary = real.classification.primary
    assert f"seed 0: {primary} (12 steps" in proc.stdout
    assert f"expected {primary}: 1/1 runs" in proc.stdout
    rerun = Run.load(str(tmp_path / "runs" / "record-0.jsonl"))
    assert len(rerun.steps) == 12 and rerun.first("start") is not None


def test_repro_py_seeds_keras_and_its_backend(tmp_path):
    """A Keras script's repro draws the same TensorFlow random numbers on every run."""
    pytest.importorskip("keras")
    s = _hand_built(tmp_path / "sessions", stop="artifact")
    with open(os.path.join(s.directory, "artifact.py"), "w") as fh:
        fh.write("import keras\nimport tensorflow as tf\n"
                 "print('draw', float(tf.random.uniform(())), "
                 "float(keras.random.uniform((), seed=None)))\n")
    path = write_repro(s, str(tmp_path / "repro.py"))
    draws = []
    for k in range(2):
        proc = subprocess.run([sys.executable, path, "--out", f"runs{k}"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        draws.append([line for line in proc.stdout.splitlines() if line.startswith("draw")])
    assert draws[0] and draws[0] == draws[1]


def test_importing_export_stays_light():
    code = ("import sys, model_debugger, model_debugger.export, model_debugger.figures; "
            "heavy = [m for m in ('torch', 'tensorflow', 'matplotlib', 'nbformat') "
            "if m in sys.modules]; print(heavy); sys.exit(1 if heavy else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- hand-built sessions: every phase, and sessions stopped anywhere ----------------------------
DIFF = """--- reproduced
+++ fixed
@@ -1,3 +1,3 @@
 import torch
-opt = torch.optim.SGD(params, lr=3.0)
+opt = torch.optim.SGD(params, lr=0.05)
 train(opt)
"""


def _j(x: float):
    """A JSON number as the recorder writes it (non-finite values as strings)."""
    return x if math.isfinite(x) else str(x)


def _write_record(path, losses, gns=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"t": "start", "time": 0.0}) + "\n")
        for i, loss in enumerate(losses):
            gn = float(gns[i]) if gns else 1.0 / (i + 1)
            fh.write(json.dumps({"t": "step", "i": i, "ep": 0, "loss": loss, "gn": _j(gn),
                                 "mgn": {"fc1": _j(gn * 0.7), "fc2": _j(gn * 0.3)}}) + "\n")
        fh.write(json.dumps({"t": "end", "status": "ok", "steps": len(losses)}) + "\n")


def _hand_built(root, stop: str = "done") -> DebugSession:
    """A script session built event by event, stopped after ``stop``."""
    s = DebugSession.create(str(root))
    script = os.path.join(str(root), "train.py")
    with open(script, "w") as fh:
        fh.write("print('train')\n")
    with open(os.path.join(s.directory, "artifact.py"), "w") as fh:
        fh.write("print('train')\n")
    s._append("artifact", type="script", script=script, args=[], seed=7, max_seconds=30.0)
    if stop == "artifact":
        return s
    _write_record(os.path.join(s.directory, "runs", "0", "record.jsonl"),
                  [2.5, 3.75, 40.0, 900.0, "nan"], [1.0, 10.0, 100.0, 1e4, "inf"])
    s.record_reproduce({"status": "reproduced", "summary": "reproduced 1/1", "steps": 5,
                        "epochs": 1, "error": None, "error_location": None, "seconds": 1.25,
                        "code": {"step": {"file": script, "line": 3}},
                        "record": "runs/0/record.jsonl", "problem": "gradient_instability",
                        "runs": {"total": 1, "reproduced": 1,
                                 "categories": ["gradient_instability"]}})
    if stop == "reproduce":
        return s
    s.record_classification(Classification("gradient_instability", ("overfitting",), (
        Evidence("first_nonfinite_step", 4, "first non-finite loss"),
        Evidence("loss_final", 917.125, "median of the last steps"))), {})
    if stop == "classify":
        return s
    confirmed = stop != "unconfirmed"
    s.record_findings([Finding("lr_range", "hyperparameter", confirmed,
                               "The learning rate 3 diverges; a safe rate is 0.051.",
                               {"file": script, "line": 42}, {"safe_lr": 0.051, "lr": 3.0})],
                      probe_seconds={"lr_range": 0.5}, live=True)
    if stop in ("isolate", "unconfirmed"):
        return s
    s._append("fix", fix={"finding": "lr_range", "root_cause": "hyperparameter",
                         "location": {"file": script, "line": 42}, "diff": DIFF,
                         "hunks": [{"header": "@@ -1,3 +1,3 @@"}], "touches": ["hyperparameter"],
                         "suggestion": "Set the learning rate to about 0.051 (now 3.0).",
                         "expected": "no non-finite loss or gradient",
                         "overrides": ["architecture change allowed for a hyperparameter cause "
                                       "(explicit override)"],
                         "fixed": os.path.join(str(root), "fixed.py"), "copy": "fixes/1.py",
                         "approved": True})
    if stop == "fix":
        return s
    folder = os.path.join(s.directory, "verify", "1")
    for seed in (7, 8):
        _write_record(os.path.join(folder, f"before-{seed}.jsonl"), [2.5, 30.0, 700.0, "nan"])
        _write_record(os.path.join(folder, f"after-{seed}.jsonl"), [2.5, 2.0, 1.5, 1.25])
    s._append("verify", verification={
        "verdict": "partially_resolved", "category": "gradient_instability",
        "metric": "finite_fraction", "direction": "higher", "scale": "linear",
        "before": {"values": [0.25, 0.375], "mean": 0.3125, "std": 0.0884, "present": "2/2"},
        "after": {"values": [1.0, 0.8125], "mean": 0.90625, "std": 0.1326, "present": "1/2"},
        "noise_band": 0.2652, "improvement": 0.59375,
        "remaining_symptom": "gradient_instability still present in 1/2 seeds",
        "remaining": ["overfitting"], "seeds": [7, 8], "finding": "lr_range"})
    return s


def test_fix_and_verify_sections_show_the_plan_and_the_before_after_table(tmp_path):
    s = _hand_built(tmp_path)
    nb = nbformat.read(export_notebook(s, str(tmp_path / "nb.ipynb")), as_version=4)
    nbformat.validate(nb)
    text = _texts(nb)
    fix = text.split("## 4. Fix")[1].split("## 5. Verify")[0]
    assert "**Finding addressed**: <code>lr_range</code> — root cause **hyperparameter** at " \
           f"<code>{tmp_path.name}/train.py:42</code>" in fix  # relative to the session's folder
    assert "The learning rate 3 diverges; a safe rate is 0.051." in fix
    assert "**Suggestion**: Set the learning rate to about 0.051 (now 3.0)." in fix
    assert "```diff\n" + DIFF.rstrip() + "\n```" in fix
    assert "**Boundary overrides**: architecture change allowed for a hyperparameter cause " \
           "(explicit override)" in fix
    base = os.path.dirname(str(tmp_path))
    assert f"model_debugger.cli.main(['verify', {os.path.relpath(s.directory, base)!r}, " \
           f"'--fixed', {tmp_path.name + '/fixed.py'!r}, '--yes'" in fix
    verify = text.split("## 5. Verify")[1]
    assert "| before | 0.25 | 0.375 | 0.3125 | 0.0884 | 2/2 |" in verify
    assert "| after | 1 | 0.8125 | 0.90625 | 0.1326 | 1/2 |" in verify
    assert "| 0.2652 | 0.59375 | partially_resolved | gradient_instability still present in " \
           "1/2 seeds | overfitting |" in verify
    assert "| seed 7 | seed 8 |" in verify
    assert "**Verdict: partially_resolved**. Back to Isolate" in verify
    assert "**Not reached**" not in text
    # reproduce (loss, grad norms) + verify (per-seed values, loss before/after)
    pngs = _pngs(nb)
    assert len(pngs) == 4
    assert len({p for p in pngs}) == 4
    for data in pngs:
        _valid_png(data)
    # numbers of the hand-written record appear in the per-run table
    assert "| 1 | 7 | 5 | 2.5 | 900 | 2.5 | inf | step 4 | gradient_instability |" in text


@pytest.mark.parametrize("stop, reached", [
    ("artifact", 0), ("reproduce", 1), ("classify", 2), ("isolate", 3), ("unconfirmed", 3),
    ("fix", 4), ("done", 5)])
def test_sessions_stopped_at_any_phase_export(tmp_path, stop, reached):
    s = _hand_built(tmp_path, stop)
    nb = build_notebook(DebugSession.load(s.directory))
    nbformat.validate(nb)
    assert len(_headings(nb)) == 5
    text = _texts(nb)
    sections = text.split("\n## ")[1:]
    assert len(sections) == 5
    for i, section in enumerate(sections):
        assert ("**Not reached**" in section) == (i >= reached), (stop, section[:200])
    if stop == "unconfirmed":
        assert "**No confirmed finding**" in sections[2]
        assert "needs a confirmed finding" in sections[3]
    nbformat.validate(nbformat.reads(nbformat.writes(nb), as_version=4))


def test_log_session_exports_and_its_repro_reclassifies(tmp_path):
    from model_debugger.diagnose import diagnose_log

    log = tmp_path / "train_log.csv"
    rows = ["step,loss"] + [f"{i},{1.0 * 1.9 ** i:.6g}" for i in range(30)]
    log.write_text("\n".join(rows) + "\n")
    s = diagnose_log(str(log), error=f"RuntimeError: request failed: Bearer {FAKE_HF}",
                     root=str(tmp_path / "sessions"))
    out = export(s, str(tmp_path / "export" / "log.ipynb"))
    nb = nbformat.read(out["notebook"], as_version=4)
    nbformat.validate(nb)
    text = _texts(nb)
    assert "model_debugger.cli.main(['diagnose', 'train_log.csv', '--error', " in text
    assert "minimal reproducer" in text
    assert FAKE_HF not in text and f"Bearer {REDACTED}" in text
    assert f"Primary category: **<code>{s.classification.primary}</code>**" in text
    assert len(_pngs(nb)) == 1  # the loss curve; a log has no gradient norms
    _valid_png(_pngs(nb)[0])
    assert FAKE_HF not in open(out["repro"]).read()
    log.unlink()  # the repro embeds the log: it does not need the original
    proc = subprocess.run([sys.executable, out["repro"]], capture_output=True, text=True,
                          timeout=120)
    assert f"classification: {s.classification.primary}" in proc.stdout, proc.stderr
    assert "log train_log.csv: 30 loss points" in proc.stdout
    assert proc.returncode == (0 if s.reproduce["problem"] else 1)


# -- redaction ---------------------------------------------------------------------------------
@pytest.mark.parametrize("secret, text", [
    ("hf_" + "A1b2C3d4E5f6G7h8J9k0", "login with hf_A1b2C3d4E5f6G7h8J9k0 failed"),
    ("sk-proj-abcdefghijklmnop1234", "OPENAI key sk-proj-abcdefghijklmnop1234."),
    ("ghp_" + "x" * 36, "git clone https://ghp_" + "x" * 36 + "@github.com/a/b"),
    ("AKIAIOSFODNN7EXAMPLE", "aws AKIAIOSFODNN7EXAMPLE region"),
    ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.SflKxwRJSMeKKF2QT4",
     "jwt=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.SflKxwRJSMeKKF2QT4"),
    ("s3cr3t-pw", "connecting with password=s3cr3t-pw to db"),
    ("hunter22", "db_password: hunter22"),
    ("abc123def456", "Authorization: Bearer abc123def456"),
    ("pa55word", "postgres://user:pa55word@host:5432/db"),
    ("quotedvalue", 'api_key = "quotedvalue"'),
])
def test_redact_token_patterns(secret, text):
    out = redact(text)
    assert secret not in out and REDACTED in out
    assert redact(out) == out


def test_redact_environment_values(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_SECRET", "value-from-env-1234")
    monkeypatch.setenv("HARMLESS_SETTING", "value-not-secret-5678")
    monkeypatch.setenv("SHORT_KEY", "abc")
    out = redact("a=value-from-env-1234 b=value-not-secret-5678 c=abc")
    assert out == f"a={REDACTED} b=value-not-secret-5678 c=abc"


@pytest.mark.parametrize("text", [
    "epoch 3: train_loss=0.1234 val_acc=0.9",
    "max_tokens=5 num_tokens: 12 tokenizer=bert",
    'token = os.environ["HF_TOKEN"]',
    "password = getpass.getpass()",
    "api_key = args.api_key",
    "key = None",
    "loss.backward()  # at /tmp/train.py:12",
])
def test_redact_keeps_what_is_not_a_secret(text):
    assert redact(text) == text


def test_redact_args_hides_the_value_after_a_secret_flag():
    args = ["--epochs", "3", "--api-key", "plainvalue", "--token=zzzzzz999", "--lr", "0.1"]
    assert redact_args(args) == ["--epochs", "3", "--api-key", REDACTED,
                                 f"--token={REDACTED}", "--lr", "0.1"]


def test_plots_draw_without_pyplot(tmp_path):
    from model_debugger import figures as _plots

    path = tmp_path / "r.jsonl"
    _write_record(str(path), [1.0, 0.5, "nan"], [1.0, 2.0, "inf"])
    run = Run.load(str(path))
    for fig in (_plots.loss_figure(run), _plots.grad_norm_figure(run),
                _plots.before_after_loss_figure({0: run}, {0: run}),
                _plots.verification_figure({"seeds": [0], "before": {"values": [0.5],
                                                                      "mean": 0.5},
                                            "after": {"values": [None], "mean": None},
                                            "noise_band": 0.1})):
        data = _plots.figure_png(fig)
        assert data == _plots.figure_png(fig)
        assert _valid_png(data) == (360, 640)
    # pyplot's global state stays untouched: checked in a fresh process (other tests in this
    # one may import pyplot themselves)
    code = ("import sys\nfrom model_debugger import figures as _plots\nfrom model_debugger.records import Run\n"
            f"run = Run.load({str(path)!r})\n"
            "_plots.figure_png(_plots.loss_figure(run))\n"
            "_plots.figure_png(_plots.grad_norm_figure(run))\n"
            "assert 'matplotlib.pyplot' not in sys.modules\n")
    import subprocess

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_real_fix_and_verify_export(real, tmp_path, monkeypatch):
    """The product's own Fix and Verify (plan_fix, record_fix, verify_script) on a copy."""
    import shutil

    from model_debugger.diagnose import verify_script
    from model_debugger.phases import plan_fix

    monkeypatch.delenv(FAKE_ENV_NAME, raising=False)
    folder = tmp_path / "session"
    shutil.copytree(real.directory, folder)
    s = DebugSession.load(str(folder))
    assert s.queue and s.queue[0].check == "lr_range", [f.to_json() for f in s.findings]
    fixed = tmp_path / "fixed.py"
    fixed.write_text(TINY.replace("lr=3.0", "lr=0.05"))
    s.record_fix(plan_fix(s, fixed.read_text(), fixed_path=str(fixed)), approved=True)
    with open(os.devnull, "w") as sink:
        v = verify_script(s, seeds=[0], stdout=sink)
    nb = nbformat.read(export_notebook(DebugSession.load(str(folder)), str(tmp_path / "n.ipynb")),
                       as_version=4)
    nbformat.validate(nb)
    text = _texts(nb)
    assert "-opt = torch.optim.SGD(model.parameters(), lr=3.0)\n" \
           "+opt = torch.optim.SGD(model.parameters(), lr=0.05)" in text
    assert f"'--fixed', {str(fixed)!r}, '--yes', '--seeds', '1'" in text
    assert f"**Verdict: {v['verdict']}**" in text
    b, a = v["before"], v["after"]
    assert f"| before | {_fmt(b['values'][0])} | {_fmt(b['mean'])} |" in text
    assert f"| after | {_fmt(a['values'][0])} | {_fmt(a['mean'])} |" in text
    assert "**Not reached**" not in text
    assert len(_pngs(nb)) == 4


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.6g}" if isinstance(x, float) else str(x)


def test_two_fix_verify_cycles_are_numbered(tmp_path):
    s = _hand_built(tmp_path)
    s.record_findings([Finding("missing_zero_grad", "training_loop", True, "zero_grad is never "
                               "called", {"file": "train.py", "line": 9}, {})])
    s._append("fix", fix={"finding": "missing_zero_grad", "root_cause": "training_loop",
                         "location": {"file": "train.py", "line": 9}, "diff": "", "hunks": [],
                         "touches": ["training_loop"], "suggestion": "Call zero_grad.",
                         "expected": "", "overrides": [], "fixed": "fixed2.py",
                         "copy": "fixes/2.py", "approved": True})
    s._append("verify", verification={
        "verdict": "resolved", "category": "gradient_instability", "metric": "finite_fraction",
        "direction": "higher", "before": {"values": [0.5], "mean": 0.5, "present": "1/1"},
        "after": {"values": [1.0], "mean": 1.0, "present": "0/1"}, "noise_band": 0.01,
        "improvement": 0.5, "remaining_symptom": None, "remaining": [], "seeds": [7],
        "finding": "missing_zero_grad"})
    text = _texts(build_notebook(s))
    for head in ("### Isolate, round 2", "### Fix 1: <code>lr_range</code>",
                 "### Fix 2: <code>missing_zero_grad</code>", "### Verify 1: <code>lr_range</code>",
                 "### Verify 2: <code>missing_zero_grad</code>"):
        assert head in text
    assert "<code>train.py:9</code> (confirmed: yes)" in text
    assert "| before | 0.5 | 0.5 | — | 1/1 |" in text
    assert "'--fixed', 'fixed2.py', '--yes', '--seeds', '1'" in text


# -- the runs each Verify compared, and notebook (cell) sessions --------------------------------
def test_a_second_verify_plots_the_before_runs_it_reused(tmp_path, monkeypatch):
    """Verify 2 measured the current code on runs it did not write again (here the kept first
    fix's "after" runs under verify/1/): the record names them, and the export reads them."""
    from model_debugger import export as exporting

    s = _hand_built(tmp_path)  # Verify 1: partially resolved, the fix kept
    s.record_findings([Finding("missing_zero_grad", "training_loop", True, "zero_grad is never "
                               "called", {"file": "train.py", "line": 9}, {})])
    s._append("fix", fix={"finding": "missing_zero_grad", "root_cause": "training_loop",
                         "diff": "", "fixed": "fixed2.py", "copy": "fixes/2.py",
                         "approved": True})
    for seed in (7, 8):
        _write_record(os.path.join(s.directory, "verify", "2", f"after-{seed}.jsonl"),
                      [2.5, 1.0, 0.5, 0.25, 0.125, 0.0625])
    s._append("verify", verification={
        "verdict": "resolved", "category": "gradient_instability", "metric": "finite_fraction",
        "direction": "higher", "before": {"values": [1.0, 0.8125], "mean": 0.906, "present": "1/2"},
        "after": {"values": [1.0, 1.0], "mean": 1.0, "present": "0/2"}, "noise_band": 0.01,
        "improvement": 0.094, "remaining_symptom": None, "remaining": [], "seeds": [7, 8],
        "finding": "missing_zero_grad",
        "records": {"before": {"7": "verify/1/after-7.jsonl", "8": "verify/1/after-8.jsonl"},
                    "after": {"7": "verify/2/after-7.jsonl", "8": "verify/2/after-8.jsonl"}}})
    drawn = []

    def spy(before, after):
        drawn.append(({k: len(r.steps) for k, r in before.items()},
                      {k: len(r.steps) for k, r in after.items()}))
        return real(before, after)

    real = exporting._figures.before_after_loss_figure
    monkeypatch.setattr(exporting._figures, "before_after_loss_figure", spy)
    text = _texts(build_notebook(s))
    second = text.split("### Verify 2")[1]
    assert "before seed 7: verify/1/after-7.jsonl (reused, not run again)" in second
    assert "after seed 8: verify/2/after-8.jsonl\n" in second
    assert drawn[1] == ({7: 4, 8: 4}, {7: 6, 8: 6})  # Verify 1's after runs are the before
    assert drawn[0] == ({7: 4, 8: 4}, {7: 4, 8: 4})


PRELUDE = textwrap.dedent("""
    import torch
    from torch import nn
    torch.manual_seed(0)
    X = torch.randn(32, 4)
    y = X.sum(1, keepdim=True)
    model = nn.Linear(4, 1)
    warm = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):  # an earlier cell trains a little: not part of the reproduction
        warm.zero_grad()
        nn.functional.mse_loss(model(X), y).backward()
        warm.step()
""")
CELL = textwrap.dedent("""
    opt = torch.optim.SGD(model.parameters(), lr=3.0)
    for step in range(8):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(X), y)
        loss.backward()
        opt.step()
""").lstrip()


@pytest.fixture(scope="module")
def cell_session(tmp_path_factory):
    """A notebook session reproduced, fixed and verified in this process (the kernel)."""
    pytest.importorskip("torch")
    from model_debugger.artifacts import CellArtifact
    from model_debugger.phases import plan_fix, reproduce, verify

    root = tmp_path_factory.mktemp("kernel")
    namespace = {"__name__": "__main__"}
    exec(PRELUDE, namespace)  # the earlier cells, run by the user
    s = DebugSession.create(str(root / ".model_debugger"), title="notebook")
    artifact = CellArtifact(namespace, CELL, prelude=PRELUDE)
    with open(os.devnull, "w") as sink:
        rep = reproduce(s, artifact, runs=1, seed=0, stdout=sink)
        assert rep.problem == "gradient_instability", rep
        s.record_findings([Finding("lr_range", "hyperparameter", True, "lr 3 diverges",
                                   {"file": s.store.path("runs/0/cell.py"), "line": 1},
                                   {"lr": 3.0, "safe_lr": 0.05})])
        s.record_fix(plan_fix(s, CELL.replace("lr=3.0", "lr=0.05")), approved=True)
        verify(s, artifact, seeds=2, stdout=sink)
    return s


def test_a_cell_session_record_describes_the_kernel_run_and_its_magics(cell_session):
    s = cell_session
    nb = build_notebook(DebugSession.load(s.directory))
    nbformat.validate(nb)
    text = _texts(nb)
    assert "The script" not in text and "child process" not in text and "None" not in text
    assert "model_debugger.cli" not in text  # no command that never ran
    assert "ran under instrumentation **in the kernel** (1 run(s), seed 0)" in text
    assert "<code>model (torch_module)</code>" in text  # the state restored before each run
    assert "for _ in range(3):  # an earlier cell trains a little" in text  # the prelude, shown
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert "%%reproduce --seed 0\n" + CELL.rstrip("\n") in code
    fix = [c for c in code if c.startswith("%%fix --yes\n")]
    assert len(fix) == 1 and "lr=0.05" in fix[0] and "lr=3.0" not in fix[0]
    assert "%verify --seeds 2" in code
    verify = text.split("## 5. Verify")[1]
    assert "before seed 0: runs/0/record.jsonl (reused, not run again)" in verify
    assert "before seed 1: verify/1/before-1.jsonl\n" in verify
    assert "`%md_export`" in text


def test_a_cell_session_repro_runs_the_earlier_cells_and_the_cell_stand_alone(cell_session,
                                                                          tmp_path):
    s = cell_session
    out = export_files(s, str(tmp_path / "export" / "record.ipynb"), overwrite=True)  # %md_export
    assert os.path.isfile(out["repro"]) and out["replaced"] == []
    moved = tmp_path / "elsewhere"  # nothing of the session folder is needed
    proc = subprocess.run([sys.executable, out["repro"], "--runs", "1", "--out", str(moved)],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "seed 0: gradient_instability (8 steps;" in proc.stdout  # the cell's steps only
    mine = Run.load(str(moved / "record-0.jsonl")).series("loss")
    kernel = Run.load(s.store.path("runs/0/record.jsonl")).series("loss")
    assert mine.tolist() == kernel.tolist()  # the same numbers as in the kernel


@pytest.mark.parametrize("which", ["real", "cell_session"])
def test_records_exported_into_a_project_pass_its_lint(which, request, tmp_path):
    """A user exports into the checkout; the project's own ``ruff check`` must still pass."""
    session = request.getfixturevalue(which)
    out = export_files(session, str(tmp_path / "records" / "record.ipynb"), overwrite=True)
    project = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "pyproject.toml")
    lint = [sys.executable, "-m", "ruff", "check", "--no-cache", "--config", project]
    proc = subprocess.run([*lint, str(tmp_path / "records")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    raw = tmp_path / "raw.py"  # the same code without the marker fails the same lint
    raw.write_text("\n".join(line for line in open(out["repro"]).read().splitlines()
                             if not line.startswith("# ruff: noqa")) + "\n")
    assert subprocess.run([*lint, str(raw)], capture_output=True).returncode == 1
