"""``%load_ext model_debugger`` in a fresh interpreter imports neither torch nor tensorflow."""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHECK = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "model_debugger")
import model_debugger
session = model_debugger.current_session()
magics = sorted(n for t in ip.magics_manager.magics.values() for n in t
                if n in ("reproduce", "classify", "isolate", "evidence", "fix", "verify",
                         "md_status", "md_export"))
ip.run_line_magic("unload_ext", "model_debugger")
left = sorted(n for t in ip.magics_manager.magics.values() for n in t
              if n in ("reproduce", "evidence", "md_status", "md_export"))
print(json.dumps({"heavy": sorted(m for m in ("torch", "tensorflow", "keras", "jax")
                                  if m in sys.modules),
                  "magics": magics, "left": left,
                  "widgets_at_load": "ipywidgets" in sys.modules}))
"""


def test_load_ext_imports_no_framework(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["heavy"] == []
    # line and cell magics; the cell magics answer on a line too (%reproduce? finds them)
    assert out["magics"] == sorted(["classify", "evidence", "fix", "isolate", "md_export",
                                    "md_status", "reproduce", "verify",
                                    "evidence", "fix", "reproduce"])
    assert out["left"] == []
    assert out["widgets_at_load"] is False  # widgets load when first shown
    assert not (tmp_path / ".model_debugger").exists()  # no session folder until one is used
