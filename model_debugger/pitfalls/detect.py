"""Which framework a piece of training code is written for, from its imports alone.

Pure text/``ast``: no framework is imported. Used to pick the static lint
(:mod:`.torch_lint` or :mod:`.keras_lint`) for a script or a notebook's cells.
"""

from __future__ import annotations

import ast
import re

_KERAS = {"keras", "tensorflow", "tf_keras"}
_TORCH = {"torch"}
# fallback for sources that do not parse (notebook magics, a half-written cell)
_IMPORT_LINE = re.compile(r"^\s*(?:import|from)\s+([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)


def _imported_roots(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set(_IMPORT_LINE.findall(source))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def framework_of_source(source: str) -> str:
    """The framework the code imports.

    Parameters
    ----------
    source : str
        Python source (a script or notebook cells joined together).

    Returns
    -------
    str
        ``"torch"`` when it imports torch (whatever else it imports), ``"keras"`` when it
        imports keras or tensorflow and not torch, ``"none"`` otherwise.
    """
    roots = _imported_roots(source)
    if roots & _TORCH:
        return "torch"
    if roots & _KERAS:
        return "keras"
    return "none"
