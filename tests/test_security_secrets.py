"""Secrets: redacted at record time by every writer of a session folder; private files.

Secrets are planted in a real training script diagnosed by the ``model-debugger`` CLI (in the
source, printed, in the exception, in an argument, in the environment of the run only); then
every file under the sessions root, every file the export writes and ``report --json`` are
searched for each of them. Unit tests cover each form :func:`redact` knows and code it must leave
alone.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from model_debugger.redact import (
    REDACTED,
    is_secret_name,
    redact,
    redact_args,
    redact_code,
    redact_value,
    remember_environment,
)
from model_debugger.session import DebugSession

pytest_plugins = ["pytest_jupyter.jupyter_server"]

# -- the planted secrets (fake, but in the real formats) ----------------------------------------
AWS_ID = "AKIAQ7RZ3XKD5WPLMN2B"
AWS_SECRET = "Zx9/Kq2Lm8Np4Rt6Vw1Yb3Cd5Ef7Gh0Jk2Mn4Pq6"
FREE_PASSWORD = "hunter2-Free77"
DB_PASS = "Tr0ub4dor-db-9921"
ENV_NAME = "MDSEC_TEST_API_TOKEN"
ENV_TOKEN = "envtok-5d1c-88af-unset-later"
BEARER = "bearer-9f8e7d6c5b4a3210zz"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhbGljZS0xMjM0NTYifQ"
       ".dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk")
KEY_BODY = "MIIEowIBAAKCAQEAq7BFUpkGp3+LQmlQYhl5N0xX2s9pXvKz"
URL_PW = "urlPw-44x-Secret"
ARG_KEY = "argkey-71c3-value-from-cli"
PLANTED = {"aws access key id": AWS_ID, "aws secret access key": AWS_SECRET,
           "password in free text": FREE_PASSWORD, "db_pass literal": DB_PASS,
           "environment token": ENV_TOKEN, "bearer token": BEARER, "jwt": JWT,
           "private key block": KEY_BODY, "password in a url": URL_PW,
           "--api-key argument": ARG_KEY}

SCRIPT = textwrap.dedent(f'''
    import os
    import sys

    import torch
    from torch import nn

    AWS_ACCESS_KEY_ID = "{AWS_ID}"
    aws_secret_access_key = "{AWS_SECRET}"
    db_pass = "{DB_PASS}"
    DSN = "postgres://alice:{URL_PW}@db.example.com:5432/train"
    SESSION_JWT = "{JWT}"
    PRIVATE_KEY = """-----BEGIN RSA PRIVATE KEY-----
    {KEY_BODY}
    -----END RSA PRIVATE KEY-----"""
    HEADERS = {{"Authorization": "Bearer {BEARER}"}}
    # the admin password is {FREE_PASSWORD} (do not commit)

    steps = int(sys.argv[sys.argv.index("--steps") + 1])
    api_key = sys.argv[sys.argv.index("--api-key") + 1]
    token = os.environ["{ENV_NAME}"]
    print(f"connecting to {{DSN}} with Authorization: Bearer {BEARER}")
    print(f"password: {FREE_PASSWORD} api_key={{api_key}} token={{token}}")
    print(PRIVATE_KEY)
    torch.manual_seed(0)
    X = torch.randn(32, 4)
    y = X.sum(1, keepdim=True)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(X), y)
        loss.backward()
        opt.step()
        print(f"step {{step}}: train_loss={{loss.item():.4f}}")
    raise RuntimeError(
        f"upload to s3 refused: AWS {{AWS_ACCESS_KEY_ID}} {{aws_secret_access_key}}, the "
        f"password is {FREE_PASSWORD}, token {{token}}, key {{api_key}}, jwt {{SESSION_JWT}}, "
        f"db_pass={{db_pass}}, login {{db_pass}} failed, dsn {{DSN}}\\n{{PRIVATE_KEY}}")
''')


def _cli(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "model_debugger.cli", *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def _found(text: str) -> list[str]:
    return [what for what, secret in PLANTED.items() if secret in text]


def _files(root) -> list[str]:
    return [os.path.join(path, f) for path, _, files in os.walk(root) for f in files]


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory):
    """The script diagnosed by the CLI with the token in the run's environment only."""
    pytest.importorskip("torch")
    base = tmp_path_factory.mktemp("secrets")
    script = base / "train_with_secrets.py"
    script.write_text(SCRIPT)
    root = base / ".model_debugger"
    env = {k: v for k, v in os.environ.items() if k != ENV_NAME}
    proc = _cli("diagnose", str(script), "--json", "--runs", "1", "--seed", "0",
                "--max-seconds", "60", "--probe-seconds", "2", "--root", str(root),
                "--", "--steps", "6", "--api-key", ARG_KEY, env={**env, ENV_NAME: ENV_TOKEN},
                cwd=str(base))
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    # the run really saw every secret: it printed them (to the terminal) and raised with them
    assert ARG_KEY in proc.stderr and ENV_TOKEN in proc.stderr and FREE_PASSWORD in proc.stderr
    assert report["reproduce"]["error"].startswith("RuntimeError: upload to s3 refused")
    return {"base": base, "root": root, "session": report["session_dir"], "env": env,
            "stdout": proc.stdout}


def test_no_planted_secret_in_any_file_of_the_session_folder(diagnosed):
    files = _files(diagnosed["root"])
    names = {os.path.relpath(f, diagnosed["session"]) for f in files}
    assert {"artifact.py", "session.json", os.path.join("runs", "0", "record.jsonl")} <= names
    leaks = {}
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as fh:
            found = _found(fh.read())
        if found:
            leaks[path] = found
    assert leaks == {}, leaks
    assert _found(diagnosed["stdout"]) == []  # diagnose --json
    record = open(os.path.join(diagnosed["session"], "runs", "0", "record.jsonl")).read()
    assert REDACTED in record  # the start argv and the error were recorded, redacted
    artifact = open(os.path.join(diagnosed["session"], "artifact.py")).read()
    compile(artifact, "artifact.py", "exec")  # still a script that runs
    assert f'db_pass = "{REDACTED}"' in artifact
    assert 'token = os.environ["MDSEC_TEST_API_TOKEN"]' in artifact  # code that reads a secret


def test_export_and_report_json_hold_no_secret_without_the_environment(diagnosed, tmp_path):
    env = diagnosed["env"]  # the token is not set any more: export cannot look it up
    assert ENV_NAME not in env
    out = tmp_path / "export"
    proc = _cli("export", diagnosed["session"], "-o", str(out / "record.ipynb"), "--json",
                env=env, cwd=str(diagnosed["base"]))
    assert proc.returncode == 0, proc.stderr
    written = _files(out) + [p for p in json.loads(proc.stdout).values()
                             if isinstance(p, str) and os.path.isfile(p)]
    assert any(p.endswith(".ipynb") for p in written)
    for path in written:
        with open(path, encoding="utf-8", errors="replace") as fh:
            assert _found(fh.read()) == [], path
    report = _cli("report", diagnosed["session"], "--json", env=env)
    assert report.returncode == 0, report.stderr
    assert _found(report.stdout) == []
    assert REDACTED in report.stdout
    human = _cli("report", diagnosed["session"], env=env)
    assert human.returncode == 0 and _found(human.stdout) == []


def test_session_folder_is_private_and_ignored_by_git(diagnosed):
    root, session = diagnosed["root"], diagnosed["session"]
    with open(root / ".gitignore", encoding="utf-8") as fh:
        assert fh.read().strip() == "*"
    for path, _dirs, files in os.walk(session):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path
        for f in files:
            mode = stat.S_IMODE(os.lstat(os.path.join(path, f)).st_mode)
            assert mode == 0o600, (os.path.join(path, f), oct(mode))


def test_private_whatever_the_umask_and_a_users_gitignore_is_kept(tmp_path):
    old = os.umask(0o000)
    try:
        root = tmp_path / "sessions"
        s = DebugSession.create(str(root))
        s.record_note("x")
        assert stat.S_IMODE(os.stat(s.directory).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(os.path.join(s.directory, "session.json")).st_mode) == 0o600
        assert (root / ".gitignore").read_text().strip() == "*"  # a root this call created
        mine = tmp_path / "project"
        mine.mkdir()
        (mine / ".gitignore").write_text("build/\n")
        DebugSession.create(str(mine))  # an existing folder of the user's: left as it is
        assert (mine / ".gitignore").read_text() == "build/\n"
        (tmp_path / "target").write_text("keep")
        dot = tmp_path / "other" / ".model_debugger"
        dot.mkdir(parents=True)
        os.symlink(tmp_path / "target", dot / ".gitignore")
        DebugSession.create(str(dot))  # a planted symlink is not followed
        assert (tmp_path / "target").read_text() == "keep"
    finally:
        os.umask(old)


def test_session_events_are_redacted_before_saving(tmp_path, monkeypatch):
    monkeypatch.setenv("MDSEC_EVENT_SECRET", "evt-secret-0042-zz")
    s = DebugSession.create(str(tmp_path))
    s._append("artifact", type="script", script="t.py", args=["--api-key", ARG_KEY, "--lr", "1"],
             nested={"deep": [{"message": f"the password is {FREE_PASSWORD}"}], "n": 3},
             code=f'db_pass = "{DB_PASS}"\nx = os.environ["TOKEN"]\n',
             error="failed with evt-secret-0042-zz")
    raw = open(os.path.join(s.directory, "session.json"), encoding="utf-8").read()
    assert _found(raw) == [] and "evt-secret-0042-zz" not in raw
    art = DebugSession.load(s.directory).events[0]
    assert art["args"] == ["--api-key", REDACTED, "--lr", "1"]
    assert art["nested"]["n"] == 3
    assert art["code"] == f'db_pass = "{REDACTED}"\nx = os.environ["TOKEN"]\n'


def test_fix_copy_and_plan_are_redacted_and_a_secret_is_not_a_change(tmp_path):
    from model_debugger.phases import plan_fix
    from model_debugger.records import Finding
    from model_debugger.redact import write_private

    original = f'db_pass = "{DB_PASS}"\nlr = 10.0\nprint(lr)\n'
    s = DebugSession.create(str(tmp_path))
    write_private(os.path.join(s.directory, "artifact.py"), original)
    s._append("artifact", type="script", script=str(tmp_path / "t.py"), args=[])
    s.record_reproduce({"status": "reproduced", "problem": "gradient_instability", "steps": 3,
                        "epochs": 1, "error": None, "seconds": 1.0, "summary": "reproduced 1/1",
                        "runs": {"total": 1, "reproduced": 1,
                                 "categories": ["gradient_instability"]}})
    from model_debugger.records import Classification

    s.record_classification(Classification(primary="gradient_instability"), signals={})
    s.record_findings([Finding(check="lr_range", root_cause="hyperparameter", confirmed=True,
                               explanation="lr 10 diverges", location={"file": "t.py",
                                                                      "line": 2})])
    fixed = original.replace("lr = 10.0", "lr = 0.1")  # the user's file still has the secret
    plan = plan_fix(s, fixed)  # one change: the redacted copy is not read as a second one
    assert len(plan["hunks"]) == 1 and DB_PASS not in plan["diff"]
    s.record_fix(plan, approved=True)
    copy = open(os.path.join(s.directory, "fixes", "1.py"), encoding="utf-8").read()
    assert copy == f'db_pass = "{REDACTED}"\nlr = 0.1\nprint(lr)\n'
    assert DB_PASS not in open(os.path.join(s.directory, "session.json")).read()


# -- redact: each form ------------------------------------------------------------------------
@pytest.mark.parametrize("secret, text", [
    (AWS_SECRET, f"aws_secret_access_key = {AWS_SECRET}"),
    (AWS_SECRET, f'AWS_SECRET_ACCESS_KEY="{AWS_SECRET}"'),
    (AWS_SECRET, f"RuntimeError: aws_secret_access_key={AWS_SECRET}"),  # a key after a key
    (DB_PASS, f"note: db_password={DB_PASS}, key: token: {DB_PASS}"),
    (AWS_SECRET, f"s3 upload with AWS creds {AWS_ID} {AWS_SECRET}"),
    (AWS_ID, f"aws_access_key_id={AWS_ID}"),
    (FREE_PASSWORD, f"password: {FREE_PASSWORD}"),
    (FREE_PASSWORD, f"the admin password is {FREE_PASSWORD}."),
    (FREE_PASSWORD, f"Password was '{FREE_PASSWORD}'"),
    (DB_PASS, f'db_pass = "{DB_PASS}"'),
    (DB_PASS, f"DB_PASS={DB_PASS}"),
    (DB_PASS, f"user_pwd: {DB_PASS}"),
    (DB_PASS, f'{{"dbPassword": "{DB_PASS}"}}'),
    (DB_PASS, f"client_secret={DB_PASS}"),
    (DB_PASS, f"--password={DB_PASS}"),
    (BEARER, f"Authorization: Bearer {BEARER}"),
    (BEARER, f"curl -H 'Authorization: Token {BEARER}'"),
    (JWT, f"session cookie {JWT}"),
    (KEY_BODY, f"-----BEGIN RSA PRIVATE KEY-----\n{KEY_BODY}\n-----END RSA PRIVATE KEY-----"),
    (KEY_BODY, f"-----BEGIN OPENSSH PRIVATE KEY-----\\n{KEY_BODY}\\n-----END OPENSSH PRIVATE KEY"
               "-----"),
    (KEY_BODY, f"-----BEGIN PRIVATE KEY-----\n{KEY_BODY}"),  # cut short
    (KEY_BODY, f"{KEY_BODY}\n{KEY_BODY}\n-----END EC PRIVATE KEY-----"),  # start cut off
    (KEY_BODY, f"-----BEGIN PGP PRIVATE KEY BLOCK-----\n{KEY_BODY}\n"
               "-----END PGP PRIVATE KEY BLOCK-----"),
    (URL_PW, f"https://alice:{URL_PW}@host.example.com/repo.git"),
    ("hf_" + "A1b2C3d4E5f6G7h8J9k0", "login with hf_A1b2C3d4E5f6G7h8J9k0 failed"),
    ("ghp_" + "x" * 36, "git clone https://ghp_" + "x" * 36 + "@github.com/a/b"),
    # review item 5: forms that used to get through
    ("hunter2secret", "redis://:hunter2secret@cache.example.com:6379/0"),  # empty user
    ("ssw0rd", "postgres://user:p@ssw0rd@db.example.com/train"),  # @ inside the password
    ("hunter2!", "my password hunter2!"),
    ("hunter2!", "password hunter2!"),
    ("hunter2!", "the password is: hunter2!"),
    ("abc123", "pw=abc123"),
    ("abc123def456", "Cookie: session=abc123def456"),
    ("abc123def456", "Cookie: theme=dark; session=abc123def456"),
    ("sid9f8e7d6c", "Set-Cookie: sid=sid9f8e7d6c; Path=/; HttpOnly"),
    ("sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "stripe key sk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    ("rk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "rk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    ("AIza" + "SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY", "maps AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"),
])
def test_redact_each_form(secret, text):
    out = redact(text)
    assert secret not in out and REDACTED in out, out
    assert redact(out) == out  # idempotent


def test_environment_values_stay_redacted_after_the_variable_is_unset(monkeypatch):
    monkeypatch.setenv("MDSEC_DB_PASS", "env-remembered-6620")
    monkeypatch.setenv("MDSEC_HARMLESS", "not-a-secret-value-1")
    assert redact("x env-remembered-6620 y") == f"x {REDACTED} y"
    remember_environment()  # what the recorder and DebugSession.create do when a run starts
    monkeypatch.delenv("MDSEC_DB_PASS")
    assert redact("x env-remembered-6620 y") == f"x {REDACTED} y"
    assert redact("not-a-secret-value-1") == "not-a-secret-value-1"


def test_redact_args_hides_the_value_after_a_secret_flag():
    args = ["--epochs", "3", "--api-key", ARG_KEY, "--token=zzzzzz999", "--db-pass", DB_PASS,
            "--max-tokens", "128", "--num-keys", "4", "--lr", "0.1"]
    assert redact_args(args) == ["--epochs", "3", "--api-key", REDACTED, f"--token={REDACTED}",
                                 "--db-pass", REDACTED, "--max-tokens", "128", "--num-keys", "4",
                                 "--lr", "0.1"]


# -- false positives: ordinary code and text are kept ------------------------------------------
FALSE_POSITIVES = [
    "api_key = args.token",
    "token = args.token",
    'token = os.environ["TOKEN"]',
    "password = os.environ.get('DB_PASSWORD')",
    "password = getpass.getpass()",
    "tokenizer = AutoTokenizer.from_pretrained('bert-base-uncased')",
    "max_tokens=128",
    "generate(prompt, max_tokens=128, num_tokens: 12)",
    "num_keys = 5",
    "keyboard = 'us'",
    'key = "loss"',
    "key = None",
    "token_count: 4096",
    "connect(password=password, user=user)",
    "the token is expired",
    "Token validation failed",
    "Basic authentication failed for user",
    "secret_name = 'prod-db'",
    "epoch 3: train_loss=0.1234 val_acc=0.9",
    "loss.backward()  # at /tmp/train.py:12",
    "commit 0123456789abcdef0123456789abcdef01234567",
    "https://example.com/path?page=2",
    "passes = 3; bypass=1; compass: north",
    # templates and vocabulary tokens (review item 2): no secret in them
    "token: %s", "pwd=%s", "pass: %d", "password: %(pw)-10s", "token={}", "password is {pw!r}",
    "Authorization: Bearer {}", "Authorization: Bearer %s", "postgres://{user}:{pw}@db/x",
    "Cookie: %s", "pad_token=[PAD] bos_token: <|endoftext|> eos_token='</s>'",
    "the token is <|endoftext|>", "token <mask>", "cookie = resp.cookies",
    "Token indices sequence length is longer than the maximum (1024 > 512)",
    "pwd /home/alice/project", "eos token 50256", "secret sauce", "password reset sent",
]


@pytest.mark.parametrize("text", FALSE_POSITIVES)
def test_redact_keeps_what_is_not_a_secret(text):
    assert redact(text) == text


@pytest.mark.parametrize("name, secret", [
    ("db_pass", True), ("DB_PASSWORD", True), ("apiKey", True), ("api-key", True),
    ("aws_secret_access_key", True), ("auth_token", True), ("client_secret", True),
    ("pwd", True), ("HFTOKEN", True), ("tokenizer", False), ("max_tokens", False),
    ("num_keys", False), ("keyboard", False), ("key", False), ("token_count", False),
    ("passes", False), ("bypass", False),
    ("pw", True), ("Cookie", True), ("pad_token", False), ("eos_token", False),
    ("maskToken", False), ("decoder_start_token", False), ("session_token", True),
])
def test_secret_names(name, secret):
    assert is_secret_name(name) is secret


def test_environment_names(monkeypatch):
    assert is_secret_name("GITHUB_TOKEN", environment=True)
    assert is_secret_name("GPG_KEY", environment=True)
    assert not is_secret_name("PWD", environment=True)
    assert not is_secret_name("SSH_AUTH_SOCK", environment=True)
    assert not is_secret_name("KEYBOARD_LAYOUT", environment=True)
    monkeypatch.setenv("API_VERSION", "python311")  # not a secret name: "python311" stays
    assert redact("python311") == "python311"


def test_literals_assigned_to_secret_names_are_redacted_where_they_show_later():
    redact_code('db_pass = "lit-remembered-3371"\nname = "password"\npassword = "password"\n')
    assert redact("connect failed: lit-remembered-3371") == f"connect failed: {REDACTED}"
    assert redact("enter a password") == "enter a password"  # words are not remembered


def test_redact_code_keeps_the_script_runnable():
    src = textwrap.dedent(f'''
        import os
        db_pass = "{DB_PASS}"  # password={DB_PASS}
        token = os.environ.get("TOKEN", "")
        cfg = {{"api_key": "{ARG_KEY}", "lr": "0.1", "key": "loss"}}
        cfg["password"] = '{FREE_PASSWORD}'
        tok = token
        dsn = f"postgres://u:{URL_PW}@h/{{tok}}"
        def connect(password=None, host=None):
            return password
        connect(password="{DB_PASS}", host="h")
        tokenizer = str.split
        max_tokens = 128
    ''')
    out = redact_code(src)
    assert _found(out) == []
    ns: dict = {}
    exec(compile(out, "<redacted>", "exec"), ns)  # noqa: S102 - our own test source
    assert ns["cfg"] == {"api_key": REDACTED, "lr": "0.1", "key": "loss",
                         "password": REDACTED}
    assert ns["max_tokens"] == 128 and ns["tok"] == ns["token"]
    assert "token = os.environ.get(\"TOKEN\", \"\")" in out and "tok = token" in out
    assert redact_code(out) == out


def test_redact_value_keeps_numbers_and_structure():
    value = {"steps": [1, 2.5, None, True], "msg": f"password: {FREE_PASSWORD}",
             "args": ("--api-key", ARG_KEY)}
    out = redact_value(value)
    assert out["steps"] == [1, 2.5, None, True]
    assert out["msg"] == f"password: {REDACTED}" and out["args"] == ["--api-key", REDACTED]


def test_notebook_cell_copies_are_redacted_but_the_cell_ran_as_written(tmp_path, monkeypatch):
    """``%%reproduce`` in a real InteractiveShell: the session's copies hold no secret."""
    pytest.importorskip("torch")
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    import model_debugger

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV_NAME, ENV_TOKEN)
    cell = textwrap.dedent(f'''
        import os
        import torch
        from torch import nn
        db_pass = "{DB_PASS}"
        token = os.environ["{ENV_NAME}"]
        torch.manual_seed(0)
        X, Y = torch.randn(32, 4), torch.randn(32, 1)
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(5):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(X), Y)
            loss.backward()
            opt.step()
        raise RuntimeError(f"the password is {FREE_PASSWORD}; token {{token}}; {{db_pass}}")
    ''')
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "model_debugger")
    try:
        with capture_output():
            ip.run_cell_magic("reproduce", "--seed 0", cell)
        assert ip.user_ns["db_pass"] == DB_PASS  # the cell itself ran unredacted
        session = model_debugger.current_session().session
        monkeypatch.delenv(ENV_NAME)
        files = _files(tmp_path / ".model_debugger")
        assert any(f.endswith(os.path.join("runs", "0", "cell.py")) for f in files)
        for path in files:
            with open(path, encoding="utf-8", errors="replace") as fh:
                assert _found(fh.read()) == [], path
        assert "RuntimeError" in (session.reproduce["error"] or "")
        assert (tmp_path / ".model_debugger" / ".gitignore").read_text().strip() == "*"
        for path in files:
            assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600, path
    finally:
        ip.run_line_magic("unload_ext", "model_debugger")
        for name in ("db_pass", "token", "X", "Y", "model", "opt", "loss"):
            ip.user_ns.pop(name, None)


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"model_debugger.server": True}}}


async def test_rest_get_of_the_diagnosed_session_holds_no_secret(diagnosed, jp_fetch,
                                                                  jp_root_dir, monkeypatch):
    """``GET /model-debugger/sessions/...`` on a token server, the real session copied in."""
    import shutil

    monkeypatch.delenv(ENV_NAME, raising=False)
    sid = os.path.basename(diagnosed["session"])
    shutil.copytree(diagnosed["session"], jp_root_dir / ".model_debugger" / sid)
    listing = await jp_fetch("model-debugger", "sessions")
    one = await jp_fetch("model-debugger", "sessions", ".model_debugger", sid)
    for response in (listing, one):
        body = response.body.decode("utf-8")
        assert _found(body) == [], body[:2000]
    assert "upload to s3 refused" in json.loads(one.body)["report"]["reproduce"]["error"]


def test_log_session_keeps_no_secret_of_the_log_or_the_error(tmp_path):
    """A minimal reproducer: a JSON-lines log and a CSV log holding secrets, plus ``--error``."""
    jsonl = tmp_path / "train_log.jsonl"
    jsonl.write_text("".join(
        json.dumps({"step": i, "loss": 1.0 / (i + 1), "db_pass": DB_PASS,
                    "note": f"the password is {FREE_PASSWORD}", "url": f"https://u:{URL_PW}@h"})
        + "\n" for i in range(30)))
    csv_log = tmp_path / "train_log.csv"
    csv_log.write_text("step,loss,api_key,msg\n" + "".join(
        f"{i},{1.0 / (i + 1)},{ARG_KEY},Authorization: Bearer {BEARER}\n" for i in range(30)))
    root = tmp_path / "sessions"
    for log in (jsonl, csv_log):
        proc = _cli("diagnose", str(log), "--json", "--root", str(root),
                    "--error", f"RuntimeError: aws_secret_access_key={AWS_SECRET} {JWT}")
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert report["reproduce"]["steps"] == 30  # the numbers still parse from the copy
        assert _found(proc.stdout) == []
        out = tmp_path / f"export-{log.suffix[1:]}"
        exported = _cli("export", report["session_dir"], "-o", str(out / "nb.ipynb"))
        assert exported.returncode == 0, exported.stderr
        shown = _cli("report", report["session_dir"], "--json")
        assert _found(shown.stdout) == []
    files = _files(root) + _files(tmp_path / "export-jsonl") + _files(tmp_path / "export-csv")
    assert any(os.path.basename(f).startswith("log.") for f in files)
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as fh:
            assert _found(fh.read()) == [], path


def test_printed_secret_numbers_are_not_recorded_as_metrics(tmp_path):
    from model_debugger import capture

    record = tmp_path / "record.jsonl"
    with capture(str(record)):
        print("db_password: 73519246 api_token=88412093 val_loss=0.5")
    text = record.read_text()
    assert "73519246" not in text and "88412093" not in text
    metrics = [json.loads(line) for line in text.splitlines() if '"t": "metric"' in line]
    assert [m["name"] for m in metrics] == ["val_loss"]
    assert stat.S_IMODE(os.stat(record).st_mode) == 0o600


# -- redact_code never changes what a script without a secret does (review item 2) ----------
NLP_SCRIPT = textwrap.dedent('''
    """A tiny character-level language model with a tokenizer's special tokens."""
    import sys

    import torch
    from torch import nn

    pad_token = "[PAD]"
    unk_token = "[UNK]"
    cls_token, sep_token = "[CLS]", "[SEP]"
    bos_token="<|endoftext|>"
    special = {"mask_token": "<mask>", "eos_token": "</s>", "additional_special_tokens": ["<s>"]}
    config = dict(bos_token="<|endoftext|>", eos_token="</s>", auth="none", password_env="DB_PW")
    auth = "none"
    token = "<|endoftext|>"
    password = "Enter the password:"
    vocab = [pad_token, unk_token, cls_token, sep_token, bos_token, special["mask_token"],
             special["eos_token"]] + list("abcdefgh ")
    ids = {t: i for i, t in enumerate(vocab)}
    steps = int(sys.argv[sys.argv.index("--steps") + 1])
    print("token: %s" % token)
    print("pwd=%s" % config["password_env"], "pass: %d" % steps)
    print("token={} auth={}".format(bos_token, auth), f"password is {password!r}")
    print("Authorization: Bearer %s" % "<anonymous>", "postgres://{}:{}@db/x".format("u", "p"))
    print(f"vocab {len(vocab)}: pad={ids[pad_token]} mask={ids['<mask>']} eos={ids['</s>']}")
    text = "<|endoftext|>abc defg habc" * 4
    seq = [ids[bos_token]] + [ids.get(c, ids[unk_token]) for c in text[13:]] + [ids["</s>"]]
    x = torch.tensor(seq[:-1]).unsqueeze(0)
    y = torch.tensor(seq[1:]).unsqueeze(0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(len(vocab), 8), nn.Linear(8, len(vocab)))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x).view(-1, len(vocab)), y.view(-1),
                                           ignore_index=ids[pad_token])
        loss.backward()
        opt.step()
        print(f"step {step}: train_loss={loss.item():.6f} token={token} pad={pad_token}")
''')
SK_KEY = "sk-proj-Qm7Zt2Lw9Xc4Vb8Nn1Rr5Tt0Yy3Uu6Ii"


def _run_script(path, cwd):
    proc = subprocess.run([sys.executable, str(path), "--steps", "4"], capture_output=True,
                          text=True, cwd=str(cwd), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("secret", [False, True], ids=["no-secret", "hard-coded-api-key"])
def test_the_redacted_copy_runs_exactly_like_the_original(tmp_path, secret):
    """Isolate and Verify re-run the session's copy: it must behave as the script the user ran.

    Format strings with secret words (``"token: %s" % token``), tokenizer special tokens
    (``pad_token = "[PAD]"``, ``bos_token="<|endoftext|>"``), ``auth = "none"`` are no secret:
    the copy keeps them, prints the same lines and the same losses. A hard-coded API key is
    still redacted in every file the session writes.
    """
    pytest.importorskip("torch")
    source = NLP_SCRIPT + (f'api_key = "{SK_KEY}"\nheaders = {{"x-api-key": api_key}}\n'
                           if secret else "")
    script = tmp_path / "train_lm.py"
    script.write_text(source)
    root = tmp_path / ".model_debugger"
    proc = _cli("diagnose", str(script), "--json", "--runs", "1", "--seed", "0",
                "--max-seconds", "60", "--probe-seconds", "2", "--root", str(root),
                "--", "--steps", "4", cwd=str(tmp_path))
    assert proc.returncode in (0, 1), proc.stderr
    session = json.loads(proc.stdout)["session_dir"]
    copy = os.path.join(session, "artifact.py")
    copied = open(copy, encoding="utf-8").read()
    if secret:
        assert copied == source.replace(SK_KEY, REDACTED)  # the key only, nothing else
        leaks = [f for f in _files(root) if SK_KEY in open(f, errors="replace").read()]
        assert leaks == [] and SK_KEY not in proc.stdout
    else:
        assert copied == source  # nothing in it is a secret: the copy is the script
    original = _run_script(script, tmp_path)
    assert "step 3: train_loss=" in original and "token: <|endoftext|>" in original
    assert _run_script(copy, tmp_path) == original  # same lines, same loss values
    # no special token was remembered as a secret: the loss lines are recorded as printed
    redact_code(source)  # what the recorder does with the script when a run starts
    lines = [line for line in original.splitlines() if line.startswith(("step ", "token: "))]
    assert len(lines) == 5 and [redact(line) for line in lines] == lines


def test_redact_code_keeps_templates_special_tokens_and_setting_words():
    src = textwrap.dedent('''
        user, word = "alice", "w0rd"
        a = "token: %s" % user
        b = "pwd=%s" % word
        c = "pass: %d" % 3
        password = "%s-%s" % (user, word)
        secret = "{}:{}".format(user, word)
        pad_token = "[PAD]"
        d = dict(bos_token="<|endoftext|>", eos_token="</s>", auth="none")
        e = {"mask_token": "<mask>", "token": "<|im_start|>", "auth": "Bearer"}
        auth = "none"
        client_secret = "cs-9d8c7b6a5f4e3d2c1b"
    ''')
    out = redact_code(src)
    assert out == src.replace("cs-9d8c7b6a5f4e3d2c1b", REDACTED)
    ns: dict = {}
    exec(compile(out, "<redacted>", "exec"), ns)  # noqa: S102 - our own test source
    assert ns["a"] == "token: alice" and ns["b"] == "pwd=w0rd" and ns["c"] == "pass: 3"
    assert ns["password"] == "alice-w0rd" and ns["secret"] == "alice:w0rd"
    # none of the kept values is remembered: they stay in every later output
    assert redact("generated <|endoftext|> </s> <mask> [PAD] auth none") == (
        "generated <|endoftext|> </s> <mask> [PAD] auth none")
    assert redact("login cs-9d8c7b6a5f4e3d2c1b") == f"login {REDACTED}"  # the real one is
