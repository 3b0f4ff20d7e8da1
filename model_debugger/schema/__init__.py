"""The JSON Schema of the sidebar snapshot (``snapshot.schema.json``).

One file, two users: Python validates snapshots against it (tests, :func:`validate`), and the
JupyterLab extension generates its TypeScript types from it at build time
(``labextension/src/snapshot.ts``, via json-schema-to-typescript).
"""

from __future__ import annotations

import json
import os

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "snapshot.schema.json")


def load() -> dict:
    """The schema as a dict."""
    with open(PATH, encoding="utf-8") as fh:
        return json.load(fh)


def validate(snapshot: dict) -> None:
    """Raise ``jsonschema.ValidationError`` when ``snapshot`` does not follow the schema."""
    import jsonschema

    jsonschema.validate(snapshot, load())
