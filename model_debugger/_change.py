"""What a code change is: its hunks, which of them belong together, and what they touch.

Two hunks belong to one change when they share a name the change introduces or removes (an
``import`` and its first use, a variable defined in one place and used in another). What a hunk
touches is read from where its lines sit in the code (a ``Module`` subclass, a ``Dataset``'s
``__getitem__``) and from what they do (construct a layer, rescale the arrays a loader is built on).
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass

_NAME = re.compile(r"[A-Za-z_]\w*")
_LAYER = re.compile(r"\b(?:nn|layers|keras\.layers)\.(?!functional\b)([A-Z]\w*)\s*\(")
_MODEL_BASES = ("Module", "Model", "Layer", "Sequential")
_DATA_BASES = ("Dataset", "IterableDataset", "PyDataset", "Sequence")
_DATA_FUNCS = re.compile(r"^(__getitem__|__iter__|__len__|collate\w*|preprocess\w*|transform\w*|"
                         r"normali[sz]e\w*|load_\w*data\w*|make_\w*data\w*)$")
_PREPROCESS = re.compile(r"\btransforms\.|\bNormalize\(|StandardScaler|MinMaxScaler|"
                         r"/\s*255\b")
_MODEL_METHODS = ("__init__", "forward", "build", "call")  # what defines a model's structure
_DATA_CALLS = ("TensorDataset", "DataLoader", "train_test_split", "from_tensor_slices")
_ASSIGN = re.compile(r"^\s*([A-Za-z_][\w\s,\[\]\.:]*?)\s*(?:[-+*/%@]|//)?=(?!=)")


@dataclass(frozen=True)
class Hunk:
    """One contiguous change: lines ``[a0, a1)`` of the original became ``[b0, b1)`` (0-based)."""

    a0: int
    a1: int
    b0: int
    b1: int
    removed: tuple[str, ...]
    added: tuple[str, ...]

    @property
    def header(self) -> str:
        return f"@@ -{self.a0 + 1},{self.a1 - self.a0} +{self.b0 + 1},{self.b1 - self.b0} @@"

    @property
    def summary(self) -> str:
        line = next((s.strip() for s in self.added + self.removed if s.strip()), "")
        return line[:80]

    def names(self, lines: tuple[str, ...]) -> set[str]:
        return {n for s in lines for n in _NAME.findall(s.split("#", 1)[0])}

    def to_json(self) -> dict:
        return {"header": self.header, "removed": list(self.removed), "added": list(self.added)}


def hunks_of(original: str, fixed: str, merge: bool = True) -> list[Hunk]:
    """The changed regions of ``fixed`` against ``original`` (blank-line-only edits ignored).

    With ``merge``, regions a couple of unchanged lines apart count as one place.
    """
    a, b = original.splitlines(), fixed.splitlines()
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        removed, added = tuple(a[i1:i2]), tuple(b[j1:j2])
        if not any(s.strip() for s in removed + added):
            continue
        out.append(Hunk(i1, i2, j1, j2, removed, added))
    return _merge_close(out) if merge else out


def _merge_close(hunks: list[Hunk], gap: int = 2) -> list[Hunk]:
    """Regions at most ``gap`` unchanged lines apart are one place."""
    merged: list[Hunk] = []
    for h in hunks:
        if merged and h.a0 - merged[-1].a1 <= gap and h.b0 - merged[-1].b1 <= gap:
            m = merged[-1]
            merged[-1] = Hunk(m.a0, h.a1, m.b0, h.b1, m.removed + h.removed, m.added + h.added)
        else:
            merged.append(h)
    return merged


def _file_names(source: str) -> set[str]:
    return {n for line in source.splitlines() for n in _NAME.findall(line.split("#", 1)[0])}


def unrelated_groups(hunks: list[Hunk], original: str, fixed: str) -> list[list[int]]:
    """Group hunk indices that belong to one change.

    A hunk "owns" the names it brings into the file or takes out of it; two hunks are one
    change when one touches a name the other owns.
    """
    before, after = _file_names(original), _file_names(fixed)
    new, gone = after - before, before - after
    parent = list(range(len(hunks)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owned = [(h.names(h.added) & new) | (h.names(h.removed) & gone) for h in hunks]
    touched = [h.names(h.added) | h.names(h.removed) for h in hunks]
    for i in range(len(hunks)):
        for j in range(i + 1, len(hunks)):
            if owned[i] & touched[j] or owned[j] & touched[i]:
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(hunks)):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


def framework_of(source: str) -> str | None:
    """``"torch"``, ``"tensorflow"`` or None, from the code's imports."""
    torch = re.search(r"^\s*(?:import|from)\s+torch\b", source, re.M)
    tf = re.search(r"^\s*(?:import|from)\s+(?:tensorflow|keras)\b", source, re.M)
    if bool(torch) == bool(tf):
        return None
    return "torch" if torch else "tensorflow"


def _context(source: str) -> tuple[dict[int, list[str]], set[str]]:
    """Per line (1-based): the enclosing class bases and function names; and the data names."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}, set()
    where: dict[int, list[str]] = {}
    data: set[str] = set()

    def visit(node: ast.AST, stack: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = stack
            if isinstance(child, ast.ClassDef):
                bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                         for b in child.bases]
                inner = stack + [f"class:{b}" for b in bases]
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = stack + [f"def:{child.name}"]
            if isinstance(child, ast.Call):
                fn = child.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                args = child.args if name != "DataLoader" else child.args[:1]
                if name in _DATA_CALLS or name == "fit":
                    for a in args[:2]:
                        while isinstance(a, (ast.Subscript, ast.Starred)):
                            a = a.value
                        if isinstance(a, ast.Name):
                            data.add(a.id)
            if hasattr(child, "lineno") and inner:
                for ln in range(child.lineno, (getattr(child, "end_lineno", None)
                                               or child.lineno) + 1):
                    where[ln] = inner  # pre-order: the innermost context wins
            visit(child, inner)

    visit(tree, [])
    return where, data


def _kind_of(line: str, context: list[str], data_names: set[str]) -> set[str]:
    code = line.split("#", 1)[0]
    kinds = set()
    in_model = any(c.startswith("class:") and c[6:].endswith(_MODEL_BASES) for c in context)
    method = next((c[4:] for c in reversed(context) if c.startswith("def:")), None)
    if (in_model and method in (*_MODEL_METHODS, None)) or \
            any(not m.endswith("Loss") for m in _LAYER.findall(code)):
        kinds.add("architecture")
    if any(c.startswith("class:") and c[6:].endswith(_DATA_BASES) for c in context) or \
            any(c.startswith("def:") and _DATA_FUNCS.match(c[4:]) for c in context) or \
            _PREPROCESS.search(code):
        kinds.add("data_preprocessing")
    m = _ASSIGN.match(code)
    if m and set(_NAME.findall(m.group(1))) & data_names:
        kinds.add("data_preprocessing")
    return kinds


def touches(original: str, fixed: str, hunks: list[Hunk]) -> set[str]:
    """What the change touches: ``architecture``, ``data_preprocessing`` (or neither)."""
    ctx_a, data_a = _context(original)
    ctx_b, data_b = _context(fixed)
    data = data_a | data_b
    kinds: set[str] = set()
    for h in hunks:
        for k, line in enumerate(h.removed):
            kinds |= _kind_of(line, ctx_a.get(h.a0 + k + 1, []), data)
        for k, line in enumerate(h.added):
            kinds |= _kind_of(line, ctx_b.get(h.b0 + k + 1, []), data)
    return kinds
