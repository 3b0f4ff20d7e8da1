"""The Jupyter server extension: authenticated REST handlers under ``/model-debugger/``.

Enabled by ``jupyter-config/server-config/model_debugger.json`` (installed into
``etc/jupyter/jupyter_server_config.d``). It serves what must outlive a kernel: the saved
sessions under the server's root directory, their reports, and exports. See
:mod:`model_debugger.server.handlers`.
"""

from __future__ import annotations


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "model_debugger.server"}]


def _load_jupyter_server_extension(server_app) -> None:
    from .handlers import setup_handlers

    setup_handlers(server_app.web_app)
    server_app.log.info("model_debugger: REST handlers at /model-debugger/")


# the name jupyter_server 1.x looked for
load_jupyter_server_extension = _load_jupyter_server_extension
