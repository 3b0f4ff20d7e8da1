"""Cell dependencies: the earlier notebook cells a cell needs, kept with it as one script.

A ``%%reproduce`` cell rarely stands alone: it uses the data, the model and the imports of earlier
cells. :func:`prelude` walks the kernel's input history (``In``) backwards and keeps every earlier
cell that defines a name the cell uses, transitively (imports are definitions too), so the
artifact script reruns outside the kernel. IPython syntax (``%magic``, ``!shell``) arrives in
``In`` already turned into ``get_ipython()`` calls; those statements are dropped, and the body of a
cell magic that runs Python (``%%reproduce``, ``%%evidence``, ``%%time`` ...) is analysed as code.
"""

from __future__ import annotations

import ast
import builtins

PYTHON_CELL_MAGICS = {"reproduce", "evidence", "fix", "time", "timeit", "capture", "prun"}
_BUILTINS = set(dir(builtins))


def _magic_call(node: ast.stmt) -> tuple[str, str, str] | None:
    """``(kind, name, body)`` when ``node`` is a ``get_ipython().run_*magic(...)`` statement."""
    value = getattr(node, "value", None)
    if isinstance(node, ast.Assign):
        value = node.value
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Attribute):
        return None
    owner = value.func.value
    if not (isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name)
            and owner.func.id == "get_ipython"):
        return None
    args = [a.value if isinstance(a, ast.Constant) else "" for a in value.args]
    args += [""] * 3
    return value.func.attr, str(args[0]), str(args[2])


def clean_cell(code: str) -> str:
    """The plain Python of one history cell: IPython calls dropped, a code cell magic unwrapped.

    Returns an empty string for a cell that is not Python (or only magics).
    """
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return ""
    if len(tree.body) == 1:
        call = _magic_call(tree.body[0])
        if call and call[0] == "run_cell_magic":
            return clean_cell(call[2]) if call[1] in PYTHON_CELL_MAGICS else ""
    lines = code.splitlines(True)
    keep: list[str] = []
    for node in tree.body:
        if _magic_call(node):
            continue
        start = node.lineno - 1
        if getattr(node, "decorator_list", None):
            start = min(d.lineno for d in node.decorator_list) - 1
        keep.append("".join(lines[start:node.end_lineno]))
    return "\n".join(k.rstrip("\n") for k in keep) + ("\n" if keep else "")


def _targets(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)
            and isinstance(n.ctx, (ast.Store, ast.Del))}


def _defines(stmt: ast.stmt) -> set[str]:
    """Names a top-level statement binds in the namespace."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*"}
    out: set[str] = set()
    for child in ast.iter_child_nodes(stmt):
        if isinstance(child, ast.stmt):
            out |= _defines(child)
        elif isinstance(child, (ast.expr, ast.withitem, ast.excepthandler, ast.comprehension)):
            if not isinstance(child, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                                      ast.GeneratorExp)):
                out |= _targets(child)
    if isinstance(stmt, ast.Try):
        out |= {h.name for h in stmt.handlers if h.name}
    return out


def _loads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


_HEADERS = {ast.For: ("target", "iter"), ast.AsyncFor: ("target", "iter"), ast.While: ("test",),
            ast.If: ("test",), ast.With: ("items",), ast.AsyncWith: ("items",)}


def _scan(stmts: list[ast.stmt], defined: set[str], free: set[str]) -> None:
    """Walk statements in order: what each reads before anything bound it is free."""
    for stmt in stmts:
        fields = _HEADERS.get(type(stmt))
        if fields is not None or isinstance(stmt, ast.Try):
            for name in fields or ():
                part = getattr(stmt, name)
                for node in part if isinstance(part, list) else [part]:
                    free |= _loads(node) - defined
                    defined |= _targets(node)
            for block in ("body", "orelse", "finalbody"):
                _scan(getattr(stmt, block, []) or [], defined, free)
            for handler in getattr(stmt, "handlers", []):
                if handler.type is not None:
                    free |= _loads(handler.type) - defined
                if handler.name:
                    defined.add(handler.name)
                _scan(handler.body, defined, free)
            continue
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            local = {a.arg for a in ast.walk(stmt.args) if isinstance(a, ast.arg)}
            local |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)
                      and isinstance(n.ctx, ast.Store)}
            free |= _loads(stmt) - defined - local
        else:
            free |= _loads(stmt) - defined
        defined |= _defines(stmt)


def analyse(code: str) -> tuple[set[str], set[str]]:
    """``(defined, free)``: names the code binds, and names it reads before binding them."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set(), set()
    defined: set[str] = set()
    free: set[str] = set()
    _scan(tree.body, defined, free)
    return defined, free - _BUILTINS


def earlier_cells(history: list[str], code: str) -> list[str]:
    """The cells of ``In`` before the one running ``code`` (which IPython already stored)."""
    cells = [c for c in list(history)[1:] if isinstance(c, str)]
    if cells:
        call = None
        try:
            tree = ast.parse(cells[-1])
            call = _magic_call(tree.body[0]) if len(tree.body) == 1 else None
        except SyntaxError:
            pass
        if call and call[0] == "run_cell_magic" and call[2].strip() == code.strip():
            cells.pop()
    return cells


def prelude(history: list[str], code: str) -> str:
    """The earlier cells ``code`` depends on, oldest first, as one script.

    Parameters
    ----------
    history : list of str
        Earlier cells' code in execution order (``In[1:n]``), as IPython stored it.
    code : str
        The cell being reproduced.

    Returns
    -------
    str
        The needed cells joined by blank lines ("" when the cell stands alone).
    """
    _, needed = analyse(code)
    keep: list[str] = []
    for raw in reversed(history):
        cell = clean_cell(raw or "")
        if not cell.strip():
            continue
        defined, free = analyse(cell)
        if defined & needed:
            keep.append(cell)
            needed = (needed - defined) | free
    return "\n".join(c.rstrip("\n") + "\n" for c in reversed(keep))
