"""The server extension's REST handlers, against a real Jupyter server (pytest-jupyter)."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("jupyter_server")
pytest.importorskip("pytest_jupyter")

from tornado.httpclient import HTTPClientError  # noqa: E402

from model_debugger.records import Classification, Evidence, Finding  # noqa: E402
from model_debugger.session import DebugSession  # noqa: E402

pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"model_debugger.server": True}}}


def _session(root, title: str = "train.py", confirmed: bool = True) -> DebugSession:
    s = DebugSession.create(str(root), title=title)
    s.record_reproduce({"status": "reproduced", "summary": "reproduced 1/1", "steps": 5,
                        "epochs": 1, "error": None, "seconds": 1.0,
                        "problem": "gradient_instability",
                        "runs": {"total": 1, "reproduced": 1,
                                 "categories": ["gradient_instability"]}})
    s.record_classification(Classification("gradient_instability", (), (
        Evidence("first_nonfinite_step", 4, "first non-finite loss"),)), {})
    s.record_findings([Finding("lr_range", "hyperparameter", confirmed,
                               "The learning rate 3 diverges; a safe rate is 0.051.",
                               {"file": "train.py", "line": 42}, {"safe_lr": 0.051})])
    return s


async def _json(response) -> dict:
    assert response.headers["Content-Type"].startswith("application/json")
    return json.loads(response.body)


async def _error(jp_fetch, *parts, **kwargs) -> tuple[int, dict]:
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch(*parts, **kwargs)
    response = info.value.response
    return info.value.code, json.loads(response.body)


async def test_lists_sessions_under_the_root(jp_fetch, jp_root_dir):
    top = _session(jp_root_dir / ".model_debugger")
    nested = _session(jp_root_dir / "project" / "nb" / ".model_debugger", confirmed=False)
    _session(jp_root_dir / "a" / "b" / "c" / ".model_debugger")  # too deep: not listed
    _session(jp_root_dir / ".hidden" / ".model_debugger")  # hidden folder: not scanned
    broken = jp_root_dir / ".model_debugger" / "broken"
    broken.mkdir()
    (broken / "session.json").write_text("{not json")

    data = await _json(await jp_fetch("model-debugger", "sessions"))
    by_path = {s["path"]: s for s in data["sessions"]}
    assert set(by_path) == {f".model_debugger/{top.id}", f"project/nb/.model_debugger/{nested.id}",
                            ".model_debugger/broken"}
    assert by_path[f".model_debugger/{top.id}"]["phase"] == "fix"
    assert by_path[f".model_debugger/{top.id}"]["fix_allowed"] is True
    assert by_path[f".model_debugger/{top.id}"]["primary"] == "gradient_instability"
    assert by_path[f"project/nb/.model_debugger/{nested.id}"]["fix_allowed"] is False
    assert by_path[f".model_debugger/{top.id}"]["title"] == "train.py"
    assert by_path[f".model_debugger/{top.id}"]["created"] == top.created
    assert "corrupt" in by_path[".model_debugger/broken"]["error"]


async def test_reads_one_session_report(jp_fetch, jp_root_dir):
    s = _session(jp_root_dir / "nb" / ".model_debugger")
    data = await _json(await jp_fetch("model-debugger", "sessions", "nb", ".model_debugger", s.id))
    assert data["path"] == f"nb/.model_debugger/{s.id}"
    report = data["report"]
    assert report["session"] == s.id
    assert report["gates"]["fix"] is None and report["fix_allowed"] is True
    assert report["findings"][0]["location"] == {"file": "train.py", "line": 42}


async def test_missing_session_is_a_json_404(jp_fetch, jp_root_dir):
    code, body = await _error(jp_fetch, "model-debugger", "sessions", ".model_debugger", "nope")
    assert code == 404
    assert "no model_debugger session" in body["message"]


async def test_export_writes_notebook_and_repro_inside_the_root(jp_fetch, jp_root_dir):
    s = _session(jp_root_dir / ".model_debugger")
    rel = f".model_debugger/{s.id}"
    data = await _json(await jp_fetch("model-debugger", "export", method="POST",
                                      body=json.dumps({"session": rel,
                                                       "path": "out/record.ipynb"})))
    assert data["notebook"] == "out/record.ipynb"
    assert data["repro"] == "out/repro.py"
    import nbformat

    nb = nbformat.read(str(jp_root_dir / "out" / "record.ipynb"), as_version=4)
    nbformat.validate(nb)
    # default path: inside the session folder
    data = await _json(await jp_fetch("model-debugger", "export", method="POST",
                                      body=json.dumps({"session": rel})))
    assert data["notebook"] == f"{rel}/{s.id}.ipynb"
    assert os.path.isfile(jp_root_dir / data["notebook"])


@pytest.mark.parametrize("parts", [
    ("model-debugger", "sessions", "..", "..", "etc"),
    ("model-debugger", "sessions", "../outside/.model_debugger/x"),
    ("model-debugger", "sessions", "%2e%2e/%2e%2e/etc"),
    ("model-debugger", "sessions", "/etc"),
])
async def test_read_outside_the_root_is_refused(jp_fetch, jp_root_dir, tmp_path, parts):
    outside = _session(tmp_path / "outside" / ".model_debugger")
    assert outside.directory.startswith(str(tmp_path))
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch(*parts)
    assert info.value.code in (403, 404)
    if info.value.code == 403:
        assert "outside" in json.loads(info.value.response.body)["message"] or \
            "inside" in json.loads(info.value.response.body)["message"]


@pytest.mark.parametrize("body", [
    {"session": "../outside/.model_debugger/SID"},
    {"session": "SELF", "path": "../escaped.ipynb"},
    {"session": "SELF", "path": "/tmp/escaped.ipynb"},
])
async def test_export_outside_the_root_is_refused(jp_fetch, jp_root_dir, tmp_path, body):
    outside = _session(tmp_path / "outside" / ".model_debugger")
    inside = _session(jp_root_dir / ".model_debugger")
    body = {k: v.replace("SID", outside.id).replace("SELF", f".model_debugger/{inside.id}")
            for k, v in body.items()}
    code, data = await _error(jp_fetch, "model-debugger", "export", method="POST",
                              body=json.dumps(body))
    assert code == 403, data
    assert data["status"] == 403
    assert not (tmp_path / "escaped.ipynb").exists()
    assert not os.path.exists("/tmp/escaped.ipynb")


async def test_symlink_escaping_the_root_is_refused(jp_fetch, jp_root_dir, tmp_path):
    outside = _session(tmp_path / "outside" / ".model_debugger")
    os.symlink(os.path.dirname(outside.directory), jp_root_dir / "link")
    code, data = await _error(jp_fetch, "model-debugger", "sessions", "link", outside.id)
    assert code == 403
    assert "outside the server root" in data["message"]


async def test_bad_export_body_is_a_json_400(jp_fetch):
    code, data = await _error(jp_fetch, "model-debugger", "export", method="POST",
                              body="not json")
    assert code == 400 and "not JSON" in data["message"]
    code, data = await _error(jp_fetch, "model-debugger", "export", method="POST",
                              body=json.dumps({}))
    assert code == 400


@pytest.mark.parametrize("method, parts, body", [
    ("GET", ("model-debugger", "sessions"), None),
    ("GET", ("model-debugger", "sessions", ".model_debugger", "x"), None),
    ("POST", ("model-debugger", "export"), json.dumps({"session": ".model_debugger/x"})),
])
async def test_unauthenticated_requests_are_refused(jp_fetch, jp_root_dir, method, parts, body):
    _session(jp_root_dir / ".model_debugger")
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch(*parts, method=method, body=body,
                       headers={"Authorization": "token wrong"}, follow_redirects=False)
    assert info.value.code in (401, 403)
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch(*parts, method=method, body=body, headers={"Authorization": ""},
                       follow_redirects=False)
    assert info.value.code in (401, 403)
    assert not list((jp_root_dir / ".model_debugger").glob("*/*.ipynb"))


def test_extension_points_and_config():
    import model_debugger.server as server

    assert server._jupyter_server_extension_points() == [{"module": "model_debugger.server"}]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(here, "jupyter-config", "server-config", "model_debugger.json")) as fh:
        config = json.load(fh)
    assert config["ServerApp"]["jpserver_extensions"] == {"model_debugger.server": True}


def test_handlers_translate_only():
    """The handlers use the store for paths and the session's public API (no ``_data``)."""
    import inspect

    from model_debugger.server import handlers

    source = inspect.getsource(handlers)
    assert "._data" not in source and "SESSION_FILE" not in source
    assert '".model_debugger"' not in source and "'.model_debugger'" not in source
