"""Where the training data was made: a def-use trace back from where the capture saw it used.

The capture sees data where it is *used*: the loss call (``criterion(pred, yb)``), the ``fit``
line. A data fault (scaled inputs, shuffled labels, a filtered split) is usually *made* earlier:
the line that built the arrays or the dataset. :func:`data_origin` reads the user's file (never
runs it), takes the data arguments of the call at the use line, and follows each name back to
the assignment that bound it, through loop targets (``for xb, yb in loader``) and pure wrappers
(``DataLoader(train_set)``, ``TensorDataset(X, y)``, ``ds.shuffle(...).batch(...)``), stopping
at the first line that computes something: that line made the data the model trained on.
"""

from __future__ import annotations

import ast
import contextvars
import copy
import functools
import os
import re

# functions that only wrap data made elsewhere: the trace follows their first argument (the
# pairing ones: every argument, inputs first, targets last)
_DATA_FUNCS = {"DataLoader", "iter", "enumerate", "tqdm", "list", "tuple", "as_tensor", "tensor",
               "Tensor", "asarray", "array", "Dataset", "DataFrame", "from_numpy",
               "convert_to_tensor", "constant", "FloatTensor", "LongTensor"}
_PAIRING = {"TensorDataset", "from_tensor_slices", "from_tensors", "zip"}
# random row splits: with a role, the trace follows the inputs (first) or the targets (last)
_SPLITS = {"train_test_split"}
ROWS = "rows"  # a role: which rows the inputs hold (a split or slice made them), not their values
VALIDATION = "validation"  # a role: the validation inputs a ``fit`` call is given
VALIDATION_TARGETS = "validation_targets"  # ... and its validation targets
# methods that only re-wrap their receiver: the trace follows the receiver, not the arguments
# (``xb.to(device)``, ``ds.shuffle(BUF).batch(BATCH)``)
_DATA_METHODS = {"batch", "shuffle", "prefetch", "repeat", "cache", "to", "cuda", "cpu", "astype",
                 "to_numpy", "numpy", "reshape", "view", "squeeze", "unsqueeze", "copy", "clone",
                 "float", "long", "double", "int", "values", "detach", "contiguous"}
_MAX_HOPS = 12
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_FIT_CALLS = {"fit", "train_on_batch", "fit_generator"}
# names of this file's own functions (and lambdas) that only wrap their first argument
# (``to_t = lambda a, dt: torch.tensor(a, dtype=dt)``): set while a trace runs
_WRAPPERS: contextvars.ContextVar[frozenset] = contextvars.ContextVar("wrappers",
                                                                      default=frozenset())


@functools.lru_cache(maxsize=32)
def _parse(path: str, mtime: float) -> ast.Module | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return ast.parse(fh.read(), path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, RecursionError, MemoryError):
        return None


def _tree_of(location: dict | None) -> ast.Module | None:
    """The parsed file of ``{"file", "line"}`` (None: no such location, file or parse)."""
    if not location or not isinstance(location.get("line"), int) or not location.get("file"):
        return None
    path = location["file"]
    try:
        return _parse(path, os.path.getmtime(path))
    except OSError:
        return None


def data_origin(location: dict | None, role: str | None = None) -> dict | None:
    """The location that made the data used at ``location``, or ``location`` unchanged.

    Parameters
    ----------
    location : dict or None
        ``{"file", "line"}`` where the capture saw the data used (a loss call, a ``fit`` call).
    role : {"inputs", "targets", ROWS, VALIDATION, VALIDATION_TARGETS}, optional
        Which half of the data the finding is about: where a wrapper or a ``fit`` call takes
        inputs and targets together (``TensorDataset(X, y)``), the trace follows the first
        for inputs and the last for targets; without a role it follows each and keeps the
        most recent line. :data:`ROWS`: the inputs' rows (a split); :data:`VALIDATION`: the
        inputs of a ``fit`` call's ``validation_data`` (elsewhere, the inputs);
        :data:`VALIDATION_TARGETS`: its targets (elsewhere, the targets).

    Returns
    -------
    dict or None
        ``{"file", "line", "used_at"}`` when a definition earlier in the same file made the data
        (``used_at`` keeps the use line); else the location given.
    """
    tree = _tree_of(location)
    if tree is None:
        return location
    token = _WRAPPERS.set(_local_wrappers(tree))
    try:
        line = _origin_line(tree, location["line"], role)
    except Exception:  # noqa: BLE001 - a trace that fails keeps the use line, never the finding
        return location
    finally:
        _WRAPPERS.reset(token)
    if line is None or line == location["line"]:
        return location
    return {**location, "line": line, "used_at": location["line"]}


_SCALING = {"fit_transform", "transform", "normalize", "scale", "minmax_scale", "robust_scale",
            "maxabs_scale", "standardize", "normalise", "standardise"}


def discarded_scaling(location: dict | None) -> dict | None:
    """A scaling call before ``location`` whose result is thrown away, or None.

    ``scaler.fit_transform(X_train)`` written as a statement of its own: the scaled copy is
    computed and dropped, the raw array trains. Such a line is where unscaled data was made
    (the scaling that was meant to happen there did not), so a finding about the data's scale
    belongs on it. The last such statement before the use line (``used_at`` when traced).
    """
    tree = _tree_of(location)
    if tree is None:
        return None
    before = location.get("used_at") or location["line"]
    found = []  # (fitted here, line): a fit_transform is where the training data was meant
    for node in ast.walk(tree):  # to be scaled; a transform may be the test split's
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                node.lineno < before:
            func = node.value.func
            name = func.attr if isinstance(func, ast.Attribute) else \
                func.id if isinstance(func, ast.Name) else None
            if name in _SCALING and node.value.args:
                found.append((name == "fit_transform", node.lineno))
    if not found:
        return None
    return {**location, "line": max(found)[1], "used_at": before}


def scaled_copy_unused(location: dict | None) -> dict | None:
    """The use line, when a scaled copy of the array used there was made and not used, or None.

    ``X_train_s = scaler.transform(X_train)`` and then ``model.fit(X_train, ...)``: the
    scaling happened, under another name, and the raw array trains. The fix is the argument
    at the use line (``used_at``), not the line that made the raw array. When the use line
    reads batches made earlier (``train_ds = from_tensor_slices((X_s, y_train))``, then a
    loss on the batches), a copy never read anywhere locates the first statement after it,
    up to the use, that reads the raw array instead.
    """
    tree = _tree_of(location)
    used = (location or {}).get("used_at")
    if tree is None or not isinstance(used, int):
        return None
    def reads(stmt) -> set[str]:
        return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and
                isinstance(n.ctx, ast.Load)}

    read = set().union(*map(reads, _statements_at(tree, used)))
    loaded = {}  # name -> the lines reading it
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            loaded.setdefault(n.id, set()).add(n.lineno)
    later = []  # a statement between the copy and the use that reads the raw array instead
    for node in ast.walk(tree):
        call = _scaling_call(node.value) if isinstance(node, ast.Assign) else None
        if call is None or node.lineno >= used:
            continue
        name, source = call.func.attr if isinstance(call.func, ast.Attribute) else \
            getattr(call.func, "id", None), call.args[0]
        made = {t.id for t in node.targets if isinstance(t, ast.Name)}
        if name not in _SCALING or not isinstance(source, ast.Name) or not made or \
                source.id in made:
            continue
        if source.id in read and not made & read:
            return {**location, "line": used}
        if not any(loaded.get(m, set()) - {node.lineno} for m in made):  # the copy: never read
            # (``train_ds = from_tensor_slices((X_s, y_raw))`` between the copy and the loss
            # line that used the batches)
            later += [st.lineno for st in _simple_statements(tree)
                      if node.end_lineno < st.lineno <= used and source.id in reads(st)
                      and reaches(tree, st, used)]
    return {**location, "line": min(later)} if later else None


_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.AsyncFor,
             ast.While, ast.With, ast.AsyncWith, ast.If, ast.Try)


def _simple_statements(tree: ast.Module) -> list[ast.stmt]:
    """Every statement that is not a compound one, in line order."""
    return sorted((n for n in ast.walk(tree) if isinstance(n, ast.stmt) and
                   not isinstance(n, _COMPOUND)), key=lambda n: (n.lineno, n.col_offset))


def _bound(node: ast.AST) -> set[str]:
    """The names a statement (or a ``for`` header) binds."""
    targets = node.targets if isinstance(node, ast.Assign) else \
        [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For)) else []
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def reaches(tree: ast.Module, stmt: ast.stmt, used: int) -> bool:
    """Whether what ``stmt`` binds flows, assignment by assignment, into the line ``used``.

    ``ds = TensorDataset(X, y)``, ``loader = DataLoader(ds)``, ``for xb, yb in loader:``,
    then ``loss = crit(model(xb), yb)`` at ``used``: one linear pass over the statements and
    ``for`` headers after it, in line order.
    """
    names = _bound(stmt)
    if stmt.lineno <= used <= (stmt.end_lineno or stmt.lineno):
        return True
    steps = sorted((n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.AsyncFor)) or
                    isinstance(n, ast.stmt) and not isinstance(n, _COMPOUND)),
                   key=lambda n: (n.lineno, n.col_offset))
    for node in steps:
        if node.lineno <= stmt.lineno or not names:
            continue
        read = {n.id for n in ast.walk(node.iter if isinstance(node, (ast.For, ast.AsyncFor))
                                       else node)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        loop = isinstance(node, (ast.For, ast.AsyncFor))
        if node.lineno == used if loop else node.lineno <= used <= (node.end_lineno or
                                                                    node.lineno):
            return bool(read & names)
        if node.lineno > used:
            break
        if read & names:
            names |= _bound(node)
    return False


def _scaling_call(value) -> ast.Call | None:
    """The call with arguments under a chain of methods, or None for a value that is no call.

    ``scaler.fit_transform(y).astype("float32")`` gives the ``fit_transform`` call.
    """
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and \
            value.func.attr not in _SCALING and isinstance(value.func.value, ast.Call):
        value = value.func.value
    return value if isinstance(value, ast.Call) and value.args else None


def scaling_pipeline(location: dict | None) -> dict | None:
    """The preprocessing object that made the data at ``location``, when it left it unscaled.

    ``X_train = preprocess.fit_transform(X_train)`` with ``preprocess = Pipeline([...])`` built
    in this file: the data is what that object's steps made, so a finding about its scale
    belongs on the object (a pipeline without a scaler), not on the call that applied it.
    None when the line applies no object of this file.
    """
    tree = _tree_of(location)
    if tree is None:
        return None
    for stmt in _statements_at(tree, location["line"]):
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
        if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Attribute) or \
                value.func.attr not in ("fit_transform", "transform") or \
                not isinstance(value.func.value, ast.Name):
            continue
        scope = _scope_of(tree, stmt)
        for body in scope:
            found = _bindings(body, value.func.value.id, stmt.lineno)
            if found:
                line, node, made = max(found, key=lambda b: b[0])
                if isinstance(node, ast.Assign) and isinstance(made, ast.Call):
                    return {**location, "line": line, "used_at": location.get("used_at",
                                                                              location["line"])}
                break
    return None


def selects_rows(location: dict | None) -> bool:
    """Whether the statement at ``location`` chooses rows: a split call or a row slice.

    ``train_test_split(X, y, train_size=0.04)``, ``X[:200]``: where the number of training
    rows was set (the origin :func:`data_origin` finds for :data:`ROWS`).
    """
    return any(isinstance(node, ast.Call) and _call_name(node) in _SPLITS or
               isinstance(node, ast.Subscript) and _is_split(node.slice)
               for node in _nodes_at(location))


_REORDER_CALLS = {"permutation", "shuffle", "sample", "roll", "shift", "argsort", "flip",
                  "sort_values", "reindex", "sort", "sorted"}
_ROW_SKIPS = {"skiprows", "skipfooter", "skip_header", "skip_footer"}


def reorders_rows(location: dict | None) -> bool:
    """Whether the statement at ``location`` moves rows out of their order, or skips some.

    An index array (``y[np.random.permutation(len(y))]``, ``X[order]``), a shuffle, sort,
    shift or roll, a file read told to skip rows (``np.loadtxt(f, skiprows=1)``): where one
    half of paired data can lose its partner. A contiguous slice (``X[:n]``) keeps the order.
    """
    return any(isinstance(node, ast.Call) and (
                   _call_name(node) in _REORDER_CALLS or
                   any(k.arg in _ROW_SKIPS for k in node.keywords)) or
               isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and
               (isinstance(node.slice, (ast.Call, ast.Attribute)) or
                isinstance(node.slice, ast.Name) and not node.slice.id.isupper())
               for node in _nodes_at(location))


def _moves(node: ast.AST, orders: set[str]) -> bool:
    """Whether the expression reorders rows.

    A shuffle-like call, or an index that is one (``X[torch.randperm(n)]``) or a name bound to
    one (``perm``, in ``orders``); a column selection (``df[features]``) is none.
    """
    return any(isinstance(n, ast.Call) and _call_name(n) in _REORDER_CALLS or
               isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) and (
                   isinstance(n.slice, ast.Call) and _call_name(n.slice) in _REORDER_CALLS | {
                       "randperm", "choice"} or
                   isinstance(n.slice, ast.Name) and n.slice.id in orders)
               for n in ast.walk(node))


def one_side_moved(location: dict | None) -> dict | None:
    """The statement before ``location`` that pairs data of which only one half was reordered.

    ``Dataset.zip((features.shuffle(n), labels))``, ``TensorDataset(X[perm], y)``,
    ``from_tensor_slices((X, y.sample(frac=1)))``: each input meets another's label there. The
    last such pairing at or before the use line (``used_at`` when traced); None without one.
    """
    tree = _tree_of(location)
    if tree is None:
        return None
    before = location.get("used_at") or location["line"]
    orders = {name for st in ast.walk(tree) if isinstance(st, ast.Assign) and
              isinstance(st.value, ast.Call) and _call_name(st.value) in
              _REORDER_CALLS | {"randperm", "choice"} for name in _bound(st)}
    found = []
    for stmt in _simple_statements(tree):
        if stmt.lineno > before:
            break
        for node in ast.walk(stmt):
            if not (isinstance(node, ast.Call) and _call_name(node) in _PAIRING):
                continue
            halves = list(node.args)
            if len(halves) == 1 and isinstance(halves[0], (ast.Tuple, ast.List)):
                halves = list(halves[0].elts)
            moved = [_moves(h, orders) for h in halves]
            if len(halves) >= 2 and any(moved) and not all(moved) and \
                    reaches(tree, stmt, before):  # (on the way to the use, not another split)
                found.append(stmt.lineno)
    return {**location, "line": max(found)} if found else None


def dict_setting(location: dict | None, key: str, value: object,
                 beside: str | None = None) -> dict | None:
    """Where a dict literal of ``location``'s file sets ``"key": value``, or None.

    Lightning's ``{"scheduler": sched, "interval": "step"}`` from ``configure_optimizers``:
    the entry that tells the trainer to step an epoch-sized schedule after every batch. With
    ``beside``, only a dict that also holds a ``beside`` entry whose value names the
    ``location`` line's variable (``"scheduler": sched`` for ``sched = StepLR(...)``).
    """
    tree = _tree_of(location)
    if tree is None:
        return None
    pair = None
    if beside is not None:  # the names the location's statement binds (``sched = ...``)
        bound = {n for st in _statements_at(tree, location["line"]) if isinstance(st, ast.Assign)
                 for t in st.targets for n in _target_names(t)}
        if not bound:
            return None
        pair = (beside, bound)
    for line, node in _dict_entries(tree, key, pair):
        if isinstance(node, ast.Constant) and node.value == value:
            return {"file": location["file"], "line": line}
    return None


def mapped_function(location: dict | None) -> dict | None:
    """Where the per-element work of a data pipeline built at ``location`` is written.

    ``tf.data.Dataset...map(augment, ...)`` (or ``.filter``, ``.flat_map``): the ``def`` of
    the file's function it maps, else the ``map`` call itself (a lambda, a library function).
    None without such a call on that statement.
    """
    tree = _tree_of(location)
    if tree is None:
        return None
    for stmt in _statements_at(tree, location["line"]):
        for call in ast.walk(stmt):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and
                    call.func.attr in ("map", "filter", "flat_map", "interleave") and call.args):
                continue
            fn = call.args[0]
            name = fn.id if isinstance(fn, ast.Name) else None
            defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef,
                                                                ast.AsyncFunctionDef))
                    and n.name == name]
            line = defs[-1].lineno if name and defs else call.func.end_lineno or call.lineno
            return {"file": location["file"], "line": line}
    return None


_DATA_BASES = re.compile(r"(Dataset|Sequence|DataModule|DataLoader|Sampler)$")
_DATA_HANDS = ("collate_fn", "transform", "target_transform", "worker_init_fn")


def in_data_pipeline(location: dict | None) -> bool:
    """Whether ``location`` lies in the code that makes the batches, not in the loop.

    A method of a class that is a dataset (a base named ``...Dataset``, ``...Sequence``,
    ``...DataModule``, a sampler or loader, or a ``__getitem__`` of its own); or a function of
    the file handed to the data (``collate_fn=``, ``transform=``) or mapped over a
    ``tf.data`` pipeline (``.map(fn)``).
    """
    tree = _tree_of(location)
    if tree is None:
        return False
    line = location["line"]

    def inside(node) -> bool:
        return node.lineno <= line <= (node.end_lineno or node.lineno)

    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and inside(n)):
        bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                 for b in cls.bases]
        if any(_DATA_BASES.search(b or "") for b in bases) or any(
                isinstance(f, ast.FunctionDef) and f.name == "__getitem__" for f in cls.body):
            return True
    funcs = {n.name for n in ast.walk(tree)
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and inside(n)}
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        handed = [k.value for k in call.keywords if k.arg in _DATA_HANDS]
        if isinstance(call.func, ast.Attribute) and call.func.attr in (
                "map", "filter", "flat_map") and call.args:
            handed.append(call.args[0])
        if any(isinstance(h, ast.Name) and h.id in funcs for h in handed):
            return True
    return False


def item_origin(location: dict | None, keyword: str = "labels") -> dict | None:
    """Where a dataset item makes the value passed as ``keyword=`` at ``location``, or None.

    ``model(input_ids=batch["input_ids"], labels=batch["labels"])`` over a loader's batches:
    the ``__getitem__`` of the file's dataset class that returns a dict with that key
    (``return {"input_ids": s[:-1], "labels": s[1:]}``), one such return only.
    """
    tree = _tree_of(location)
    if tree is None:
        return None
    key = None
    for node in _nodes_at(location):
        if isinstance(node, ast.keyword) and node.arg == keyword and \
                isinstance(node.value, ast.Subscript) and \
                isinstance(node.value.slice, ast.Constant) and \
                isinstance(node.value.slice.value, str):
            key = node.value.slice.value
    if key is None:
        return None
    returns = [r for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
               and f.name == "__getitem__" for r in ast.walk(f)
               if isinstance(r, ast.Return) and isinstance(r.value, ast.Dict)
               and any(isinstance(k, ast.Constant) and k.value == key for k in r.value.keys)]
    if len(returns) != 1:
        return None
    value = next(v for k, v in zip(returns[0].value.keys, returns[0].value.values, strict=True)
                 if isinstance(k, ast.Constant) and k.value == key)
    return {"file": location["file"], "line": value.lineno}


def fit_call_at(location: dict | None) -> bool:
    """Whether the statement at ``location`` calls a ``fit`` (``model.fit(X[:24], y[:24])``)."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
               n.func.attr in _FIT_CALLS for n in _nodes_at(location))


def _is_mask(node: ast.AST) -> bool:
    """A boolean expression: a comparison, ``&``/``|``/``^``, ``~``/``not``, ``and``/``or``."""
    return isinstance(node, (ast.Compare, ast.BoolOp)) or \
        isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr, ast.BitXor)) \
        or isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Invert, ast.Not))


def filters_rows(location: dict | None) -> bool:
    """Whether the statement at ``location`` keeps only the rows a boolean mask selects.

    ``X, y = X[keep], y[keep]`` with ``keep = (y == 0) | ...`` bound before it, or
    ``y[y != 3]``: rows dropped by a condition (which can change what the labels hold). An
    index array or a permutation (``X[perm]``) moves rows without dropping any.
    """
    tree = _tree_of(location)
    if tree is None:
        return False
    for stmt in _statements_at(tree, location["line"]):
        for node in ast.walk(stmt):
            if not (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)):
                continue
            index = node.slice
            if _is_mask(index):
                return True
            if isinstance(index, ast.Name):
                for scope in _scope_of(tree, stmt):
                    found = _bindings(scope, index.id, stmt.lineno)
                    if found:
                        if _is_mask(max(found, key=lambda b: b[0])[2]):
                            return True
                        break
    return False


def reorder_within(location: dict | None, last: bool) -> dict | None:
    """The row-moving line inside the user's function called at ``location``, or None.

    ``X, y = shuffle_in_unison(X, y)``: the statement that moves rows is in the helper: the
    one that moves the name the function returns last (labels, ``last``) or first (inputs),
    by assignment (``y = y[perm]``) or in place (``rng.shuffle(y)``); None when none does.
    """
    tree = _tree_of(location)
    if tree is None:
        return None
    calls = [n for stmt in _statements_at(tree, location["line"]) for n in ast.walk(stmt)
             if isinstance(n, ast.Call)]
    for call in calls:
        for func in _functions(tree, _call_name(call)):
            moving = [stmt for stmt in ast.walk(func) if isinstance(stmt, (ast.Assign, ast.Expr))
                      and reorders_rows({"file": location["file"], "line": stmt.lineno})]
            returned = [r.value.elts for r in _returns(func) if isinstance(r.value, ast.Tuple)]
            name = _root(returned[0][-1 if last else 0]) if returned else None
            best = next((stmt for stmt in moving if name is not None and (
                name in {_root(t) for t in stmt.targets} if isinstance(stmt, ast.Assign) else
                name in {_root(a) for c in ast.walk(stmt) if isinstance(c, ast.Call)
                         for a in c.args})), None)  # ``y = y[perm]``, ``rng.shuffle(y)``
            if best is not None:
                return {"file": location["file"], "line": best.lineno}
    return None


def loop_exit(location: dict | None) -> dict | None:
    """The statement that leaves the loop at ``location`` before its iterable runs out.

    ``location`` is the ``for`` line where a loader was iterated; a ``break`` in that loop's
    own body or a ``return`` anywhere in it (not in a function nested in it) cut the pass
    short: one guarded by the loop's counter first (``if i == 2: break``), then unguarded
    ones, then one on a bad value (``if not isfinite(loss): break``). None when the loop has
    none (an ``islice`` or ``zip`` cut it) or the file cannot be read.
    """
    tree = _tree_of(location)
    if tree is None:
        return None
    loop = next((n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.AsyncFor))
                 and n.lineno <= location["line"] <= n.iter.end_lineno), None)
    if loop is None:
        return None
    counters = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)} | {
        n.target.id for n in ast.walk(loop) if isinstance(n, ast.AugAssign)
        and isinstance(n.target, ast.Name)}
    stack, exits = [(n, None, False) for n in loop.body], []
    while stack:
        node, guard, nested = stack.pop()
        if isinstance(node, ast.Return) or isinstance(node, ast.Break) and not nested:
            reads = {n.id for n in ast.walk(guard) if isinstance(n, ast.Name)} if guard else set()
            text = ast.unparse(guard) if guard is not None else ""
            # an exit on the batch count (``if i == 2: break``) before one on a bad value
            # (``if not torch.isfinite(loss): break``), before any other
            rank = 0 if reads & counters else 2 if "nan" in text or "finite" in text else 1
            exits.append((rank, node.lineno))
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                   ast.ClassDef)):
            inner = nested or isinstance(node, (ast.For, ast.AsyncFor, ast.While))
            test = node.test if isinstance(node, ast.If) else guard
            stack.extend((c, test, inner) for c in ast.iter_child_nodes(node))
    return {"file": location["file"], "line": min(exits)[1]} if exits else None


_LOSS_CLASS = re.compile(r"(?i)loss|criterion|objective|metric")


def in_layer(frames: list[dict]) -> dict | None:
    """The innermost of ``frames`` that runs in a layer's ``forward``/``call``, or None.

    ``frames`` are user frames, outermost first (``{"file", "line", "func"}``). A method of a
    class named like a loss (``TripletLoss.forward``, a ``criterion``) is the loss's code, not
    a layer's.
    """
    for frame in reversed(frames):
        if frame.get("func") not in ("forward", "call", "__call__"):
            continue
        tree = _tree_of(frame)
        if tree is None:
            continue
        owner = max((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                     and n.lineno <= frame["line"] <= (n.end_lineno or n.lineno)),
                    key=lambda n: n.lineno, default=None)
        if owner is not None and not _LOSS_CLASS.search(owner.name):
            return frame
    return None


def enclosing_loop(location: dict | None) -> dict | None:
    """The header of the innermost ``for`` / ``while`` loop holding ``location``'s line.

    None when the line is in no loop (of its own function) or the file cannot be read: a
    setting the loop's steps need (``model.train()``) goes just before that header.
    """
    tree = _tree_of(location)
    if tree is None:
        return None
    line = location["line"]
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             and n.lineno <= line <= (n.end_lineno or n.lineno)]
    inner = max(funcs, key=lambda n: n.lineno, default=None)
    loops = [n for n in ast.walk(inner or tree)
             if isinstance(n, (ast.For, ast.AsyncFor, ast.While))
             and n.lineno < line <= (n.end_lineno or n.lineno)
             and not any(f is not inner and f.lineno > n.lineno for f in funcs)]
    if not loops:
        return None
    return {"file": location["file"], "line": max(n.lineno for n in loops)}


def sibling_step(location: dict | None) -> dict | None:
    """Another ``x.step()`` call in the innermost loop holding the optimizer step at ``location``.

    ``optimizer.step()`` then ``scheduler.step()`` in the same batch loop: the schedule is
    stepped once per batch. None when there is none (it is stepped per epoch, or elsewhere).
    """
    tree = _tree_of(location)
    head = enclosing_loop(location)
    if tree is None or head is None:
        return None
    loop = next((n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.AsyncFor, ast.While))
                 and n.lineno == head["line"]), None)
    if loop is None:
        return None
    inner = [n for n in ast.walk(loop) if isinstance(n, (ast.For, ast.AsyncFor, ast.While))
             and n is not loop]
    for node in ast.walk(loop):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "step" and not node.args and node.lineno != location["line"] \
                and not any(i.lineno <= node.lineno <= (i.end_lineno or i.lineno) for i in inner):
            return {"file": location["file"], "line": node.lineno}
    return None


def _nodes_at(location: dict | None):
    """Every AST node of the statements at ``location`` (none when its file cannot be read)."""
    tree = _tree_of(location)
    if tree is None:
        return
    for stmt in _statements_at(tree, location["line"]):
        yield from ast.walk(stmt)


def callee_made(location: dict | None) -> dict | None:
    """The line that built the callable a call at ``location`` calls, else ``location``.

    ``loss = criterion(out, yb)`` with ``criterion = nn.BCEWithLogitsLoss()`` earlier in the
    same scope (or ``self.criterion = ...`` in any method) is located at that construction:
    a setting the loss lacks (``pos_weight=``, ``weight=``) is added where it was made. Only
    the statement's outermost call counts (not ``model(x)`` in its arguments); a callable that
    is a parameter, bound otherwise than by a call, or a function called directly
    (``F.cross_entropy(...)``) keeps the call's line.
    """
    tree = _tree_of(location)
    if tree is None:
        return location
    for stmt in _statements_at(tree, location["line"]):
        call = next((n for n in ast.walk(stmt) if isinstance(n, ast.Call)), None)
        if call is None:
            continue
        func = call.func
        found: list = []
        if isinstance(func, ast.Name):
            for scope in _scope_of(tree, stmt):
                if _is_parameter(scope, func.id):
                    break
                found = _bindings(scope, func.id, stmt.lineno)
                if found:
                    break
            found = [(line, value) for line, _, value in found]
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                func.value.id == "self":
            found = [(line, value) for line, _, value in _attribute_bindings(tree, func.attr)]
        made = [line for line, value in found if isinstance(value, ast.Call)]
        return {**location, "line": max(made)} if made else location
    return location


def rebound_between(made: dict | None, used: dict | None, name: str | None) -> dict | None:
    """Where ``name`` was bound again after ``made`` and before ``used``, or None.

    ``optimizer = Adam(model.parameters())`` then ``model = Net().apply(init)``: the optimizer
    holds the first model's parameters, the loop trains the second. Both locations in one
    file; the latest such binding in the scopes enclosing ``used``.
    """
    tree = _tree_of(used)
    if tree is None or not name or made is None or made.get("file") != used.get("file"):
        return None
    for stmt in _statements_at(tree, used["line"])[:1]:
        for scope in _scope_of(tree, stmt):
            lines = [line for line, _, value in _bindings(scope, name, stmt.lineno)
                     if line > made["line"] and name not in _refs(value)]
            if lines:  # (``model = model.to(dev)``, ``torch.compile(model)``: the same one)
                return {"file": used["file"], "line": max(lines)}
    return None


def receiver_made(location: dict | None) -> dict | None:
    """Where the object a method is called on at ``location`` was last bound, else ``location``.

    ``loss.backward()`` after ``loss = ((pred - y) ** 2).mean()``: that assignment (the latest
    in the innermost scope that binds it, a branch's included).
    """
    tree = _tree_of(location)
    if tree is None:
        return location
    for stmt in _statements_at(tree, location["line"]):
        call = next((n for n in ast.walk(stmt) if isinstance(n, ast.Call)), None)
        if call is None or not isinstance(call.func, ast.Attribute) or \
                not isinstance(call.func.value, ast.Name):
            continue
        for scope in _scope_of(tree, stmt):
            found = _bindings(scope, call.func.value.id, stmt.lineno)
            if found:
                return {**location, "line": max(line for line, _, _ in found)}
    return location


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


def setting_origin(location: dict | None, keyword: str) -> dict | None:
    """The line that set the value a call at ``location`` passes as ``keyword=``.

    A setting is often passed through a name or a config (``DataLoader(ds,
    batch_size=cfg["batch_size"])``, ``SGD(..., lr=args.lr)``): the value was made where the
    name was bound, the dict entry was written (``{"batch_size": 1}``) or the argument declared
    (``add_argument("--lr", default=...)``). A literal at the call keeps its own line: the
    call's, or in a call written over several lines the keyword's.

    Returns
    -------
    dict or None
        ``{"file", "line", "used_at"}`` when the value was set on another line of the same
        file (an earlier one, or the keyword's own line in the call); else ``location``
        unchanged.
    """
    if not location or not isinstance(location.get("line"), int) or not location.get("file"):
        return location
    try:
        tree = _parse(location["file"], os.path.getmtime(location["file"]))
        line = _setting_line(tree, location["line"], keyword) if tree is not None else None
    except Exception:  # noqa: BLE001 - a trace that fails keeps the call's line
        return location
    if line is None or line == location["line"]:
        return location
    return {**location, "line": line, "used_at": location["line"]}


_OPTIMIZERS = {"SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam",
               "RAdam", "Nadam", "Adafactor", "Lion"}
# where a setting sits when it is passed positionally: (keyword, the calls) -> position
_POSITIONAL = {("max_norm", frozenset({"clip_grad_norm_"})): 1,
               ("clip_value", frozenset({"clip_grad_value_"})): 1,
               ("batch_size", frozenset({"DataLoader"})): 1,
               ("p", frozenset({"Dropout", "Dropout1d", "Dropout2d", "Dropout3d",
                                "AlphaDropout"})): 0,
               ("rate", frozenset({"Dropout", "SpatialDropout1D", "SpatialDropout2D",
                                   "GaussianDropout"})): 0}
# an optimizer's positions: PyTorch takes the parameters first, Keras the rate
_TORCH_OPTIMIZER = {"lr": 1, "momentum": 2}
_KERAS_OPTIMIZER = {"lr": 0, "learning_rate": 0, "momentum": 1}


def _passed(call: ast.Call, keyword: str) -> ast.AST | None:
    """The value ``call`` passes for ``keyword``: by name, or at the setting's usual position."""
    for k in call.keywords:
        if k.arg == keyword:
            return k.value
    name = _call_name(call)
    position = next((p for (kw, calls), p in _POSITIONAL.items()
                     if kw == keyword and name in calls), None)
    if name in _OPTIMIZERS and call.args:
        position = (_TORCH_OPTIMIZER if _torch_optimizer(call) else _KERAS_OPTIMIZER).get(keyword)
        if name != "SGD" and keyword == "momentum":
            position = None
    if position is None or len(call.args) <= position or \
            any(isinstance(a, ast.Starred) for a in call.args[:position + 1]):
        return None
    return call.args[position]


def _torch_optimizer(call: ast.Call) -> bool:
    """Whether an optimizer call takes PyTorch's layout (parameters first) or Keras' (rate first).

    Read from the dotted name (``torch.optim.SGD``, ``optim.Adam`` vs ``keras.optimizers.SGD``),
    else from the first argument: parameters (``model.parameters()``, a list, ``param_groups``,
    ``params``) or a rate (a number, ``LR``).
    """
    func = ast.unparse(call.func)
    if "optimizers" in func or "keras" in func:
        return False
    if "optim" in func:
        return True
    first = call.args[0]
    return isinstance(first, (ast.Call, ast.List, ast.ListComp, ast.GeneratorExp)) or \
        any(w in ast.unparse(first).lower() for w in ("param", "group"))


def _setting_line(tree: ast.Module, line: int, keyword: str) -> int | None:
    stmt, call, value = next(((st, n, v) for st in _statements_at(tree, line)
                              for n in ast.walk(st) if isinstance(n, ast.Call)
                              for v in [_passed(n, keyword)] if v is not None),
                             (None, None, None))
    if call is None:
        return None
    positional = not any(k.value is value for k in call.keywords)
    if not positional and _literal(value):
        return value.lineno  # written at the call: its own line of a call over several lines
    scope, before = _scope_of(tree, stmt), stmt.lineno
    for _ in range(_MAX_HOPS):
        if isinstance(value, ast.Name):
            bound = None
            for body in scope:  # the innermost scope that binds it; a parameter ends it
                bound = _bindings(body, value.id, before)
                if bound:
                    break
                if _is_parameter(body, value.id):  # its default, unless a caller passes it
                    return _parameter_setting(tree, body, value.id)
            if not bound:
                return None
            before, node, value = max(bound, key=lambda b: b[0])
            if not isinstance(node, ast.Assign):
                return None  # a loop variable, a change in place: no single setting
            if positional and isinstance(value, ast.Call):
                return None  # computed (``clip = hyper.pop("clip")``): a guess at best
            if not isinstance(value, (ast.Name, ast.Subscript, ast.Attribute)):
                return _returned_line(tree, value) or before
        elif isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant) and \
                isinstance(value.slice.value, str):
            entry = _dict_entry(tree, value.slice.value, before,
                                _handed_config(tree, scope, _root(value.value)))
            if entry is None:
                return None
            before, value = entry
            if not isinstance(value, (ast.Attribute, ast.Subscript)):
                return before  # written in the dict ({"lr": 0.5}): the setting
            # ({"lr": args.lr}): where the argument is declared
        elif isinstance(value, ast.Attribute):
            return _declared(tree, value.attr, before)
        else:
            return None
    return None


_TENSOR_WRAPPERS = {"tensor", "as_tensor", "from_numpy", "array", "asarray", "constant",
                    "convert_to_tensor", "FloatTensor", "Tensor"}


def _returned_line(tree: ast.Module, value: ast.AST) -> int | None:
    """Where a function of this file made what it returns, for ``value = that_function(...)``.

    ``w = class_weights(y)`` computes ``w`` inside ``class_weights``: the line there that made
    the returned name (``w = counts / counts.sum()`` for ``return torch.tensor(w)``: wrappers
    of one value are looked through), else its ``return`` line. None for any other value.
    """
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Name):
        return None
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and
               n.name == value.func.id), None)
    own = list(own_walk(fn)) if fn is not None else []
    returns = [n for n in own if isinstance(n, ast.Return) and n.value is not None]
    if len(returns) != 1:
        return None  # (several exits: which one made it is the run's business)
    out = returns[0].value
    while isinstance(out, ast.Call):
        if _call_name(out) in _TENSOR_WRAPPERS and out.args:
            out = out.args[0]
        elif isinstance(out.func, ast.Attribute) and out.func.attr in _DATA_METHODS:
            out = out.func.value  # (``w.float()``, ``torch.tensor(w).to("cpu")``)
        else:
            break
    if isinstance(out, ast.Attribute) and out.attr in _DATA_METHODS:
        out = out.value
    if isinstance(out, ast.Name):
        made = [n.lineno for n in own if isinstance(n, ast.Assign) and
                n.lineno < returns[0].lineno and any(
                    isinstance(t, ast.Name) and t.id == out.id for t in n.targets)]
        if made:
            return max(made)
    return returns[0].lineno


def own_walk(fn: ast.AST):
    """The nodes of function ``fn`` outside the functions and classes nested in it."""
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def _literal(node: ast.AST) -> bool:
    """A value written out: a constant, a negative one, or a list or tuple of them."""
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    if isinstance(node, (ast.List, ast.Tuple)):
        return all(_literal(e) for e in node.elts)
    return isinstance(node, ast.Constant)


def _parameter_setting(tree: ast.Module, func: ast.AST, name: str) -> int | None:
    """The line that sets parameter ``name`` of ``func``: its default, or the one call passing it.

    ``def __init__(self, init="zeros")`` with ``WineNet()`` built without it: the default in
    the signature. One call of the file passing a literal (``WineNet(init="zeros")``): that
    call. Anything else (several callers, a value computed by the caller): None.
    """
    a = func.args
    params = [*a.posonlyargs, *a.args]
    callee = func.name
    if callee == "__init__":  # built by its class's name
        owner = next((c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and func in c.body),
                     None)
        callee = owner.name if owner is not None else callee
    skip = 1 if params and params[0].arg in ("self", "cls") else 0
    index = next((i - skip for i, p in enumerate(params) if p.arg == name), None)
    passed = []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and _call_name(call) == callee):
            continue
        if any(k.arg is None for k in call.keywords) or \
                any(isinstance(a, ast.Starred) for a in call.args):
            return None  # ``Net(**cfg)``, ``block(*dims)``: the value is not on the call
        given = next((k.value for k in call.keywords if k.arg == name), None)
        if given is None and index is not None and 0 <= index < len(call.args):
            given = call.args[index]
        if given is not None:
            passed.append(given)
    if passed:
        only = passed[0]
        return only.lineno if len(passed) == 1 and isinstance(only, ast.Constant) else None
    defaults = dict(zip([p.arg for p in params][len(params) - len(a.defaults):], a.defaults))
    defaults.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
    value = defaults.get(name)
    return value.lineno if isinstance(value, ast.Constant) else None


def _dict_entry(tree: ast.Module, key: str, before: int,
                handed: ast.AST | None = None) -> tuple[int, ast.AST] | None:
    """``(line, value)`` of the ``"key": value`` entry of a dict literal that set it.

    The last one before line ``before``; else the one in ``handed``, the dict literal that
    the function reading it is given (a config built in ``main()``, below the
    ``train(config)`` that reads it).
    """
    found = list(_dict_entries(tree, key))
    earlier = [e for e in found if e[0] < before]
    if earlier:
        return max(earlier, key=lambda e: e[0])
    if handed is None:
        return None
    return next((e for e in _dict_entries(handed, key)), None)


def _handed_config(tree: ast.Module, scope: list, name: str | None) -> ast.AST | None:
    """The dict literal a function's single caller passes for its parameter ``name``, or None.

    ``config = {...}; train(config)``: the literal bound to the argument before the call.
    """
    func = scope[0] if scope else None
    if name is None or not _is_parameter(func, name):
        return None
    params = [p.arg for p in (*func.args.posonlyargs, *func.args.args)]
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and
             isinstance(n.func, ast.Name) and n.func.id == func.name]
    if len(calls) != 1:
        return None
    call = calls[0]
    arg = next((k.value for k in call.keywords if k.arg == name), None)
    if arg is None and params.index(name) < len(call.args):
        arg = call.args[params.index(name)]
    if isinstance(arg, ast.Dict):
        return arg
    if not isinstance(arg, ast.Name):
        return None
    bound = [n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) and
             isinstance(n.value, ast.Dict) and n.lineno < call.lineno and
             any(isinstance(t, ast.Name) and t.id == arg.id for t in n.targets)]
    return bound[-1] if bound else None


def _dict_entries(tree: ast.Module, key: str, beside: tuple[str, set] | None = None):
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            entries = {k.value: v for k, v in zip(node.keys, node.values)
                       if isinstance(k, ast.Constant)}
            if beside is not None and not (beside[0] in entries and
                                           set(_names(entries[beside[0]])) & beside[1]):
                continue
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == key:
                    yield v.lineno, v
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "dict":
            for k in node.keywords:
                if k.arg == key:
                    yield k.value.lineno, k.value


def _declared(tree: ast.Module, attr: str, before: int) -> int | None:
    """Where ``args.attr`` / ``config.attr`` gets its value, on the last line before ``before``.

    An ``add_argument`` default, a class attribute (a dataclass field), or ``x.attr = ...``.
    """
    found = [line for line in _declarations(tree, attr) if line < before]
    return max(found) if found else None


def _declarations(tree: ast.Module, attr: str):
    flag = attr.replace("_", "-")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant)]
            dest = next((k.value.value for k in node.keywords if k.arg == "dest"
                         and isinstance(k.value, ast.Constant)), None)
            if dest == attr or any(str(n).lstrip("-") in (attr, flag) for n in names):
                default = next((k.value for k in node.keywords if k.arg == "default"), None)
                yield (default or node).lineno
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                target = item.target if isinstance(item, ast.AnnAssign) else \
                    item.targets[0] if isinstance(item, ast.Assign) and \
                    len(item.targets) == 1 else None
                if isinstance(target, ast.Name) and target.id == attr and \
                        getattr(item, "value", None) is not None:
                    yield item.lineno
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == attr for t in node.targets):
            yield node.lineno


def batches_origin(location: dict | None) -> dict | None:
    """The line that made what a custom loop draws its batches from, or ``location`` unchanged.

    From the use line (``loss = train_step(xb, yb)``), the inputs' loop target
    (``for xb, yb in train_ds``) and the binding of that iterable (``train_ds = ...batch(64)``):
    where the batch size and the rows of each epoch are set. Unlike :func:`data_origin`, the
    trace stops at the iterable and does not go on to the arrays inside it.
    """
    if not location or not isinstance(location.get("line"), int) or not location.get("file"):
        return location
    try:
        tree = _parse(location["file"], os.path.getmtime(location["file"]))
        line = None
        for stmt in _statements_at(tree, location["line"]) if tree is not None else ():
            scope = _scope_of(tree, stmt)
            _, inputs, targets = _data_arguments(stmt, scope)
            line = _iterable_line(tree, scope, next((n for n in inputs + targets if n), ""),
                                  stmt.lineno)
            if line is not None:
                break
    except Exception:  # noqa: BLE001 - a trace that fails keeps the use line
        return location
    if line is None or line == location["line"]:
        return location
    return {**location, "line": line, "used_at": location["line"]}


def _iterable_line(tree: ast.Module, scope: list[ast.AST], name: str, before: int,
                   hops: int = 0) -> int | None:
    """The binding line of the iterable whose loop bound ``name`` (a plain rebinding followed)."""
    if not name or hops > _MAX_HOPS:
        return None
    found = next((b for body in scope for b in [_bindings(body, name, before)] if b), None)
    if not found:
        return None
    line, node, value = max(found, key=lambda b: b[0])
    if isinstance(node, ast.For):
        it = node.iter
        while isinstance(it, ast.Call) and getattr(it.func, "id", None) in _DATA_FUNCS and \
                it.args:  # enumerate(loader), tqdm(loader), iter(ds)
            it = it.args[0]
        root = _root(it) if isinstance(it, (ast.Name, ast.Attribute)) else None
        if root is None:
            return line  # built inline: ``for xb, yb in DataLoader(...)``
        made = next((b for body in _scope_of(tree, node) for b in [_bindings(body, root, line)]
                     if b), None)
        return max(made, key=lambda b: b[0])[0] if made else line
    if isinstance(value, (ast.Name, ast.Subscript, ast.Attribute)):
        return _iterable_line(tree, _scope_of(tree, node), _root(value) or "", line, hops + 1)
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "next":
        return line  # drawn here by hand: ``xb, yb = next(iter(train_ds))``
    return None


def _origin_line(tree: ast.Module, line: int, role: str | None) -> int | None:
    for stmt in _statements_at(tree, line):  # ``opt.zero_grad(); loss = crit(model(x), y)``
        origin = _statement_origin(tree, stmt, line, role)
        if origin is not None:
            return origin
    return None


def _statement_origin(tree: ast.Module, stmt: ast.stmt, line: int,
                      role: str | None) -> int | None:
    scope = _scope_of(tree, stmt)
    if role in (VALIDATION, VALIDATION_TARGETS):  # ``fit(..., validation_data=(X_val,
        # y_val))``: X_val's (y_val's) origin; elsewhere (an evaluation) the inputs' (targets')
        half = "inputs" if role == VALIDATION else "targets"
        held = _validation_inputs(stmt, half)
        if held:
            found = [o for o in (_trace(tree, scope, n, stmt.lineno, half)[0]
                                 for n in dict.fromkeys(held)) if o is not None]
            return max(found) if found else None
        role = half
    fit, inputs, targets = _data_arguments(stmt, scope)
    if fit and "" in (inputs + targets if role is None else
                      inputs if role in ("inputs", ROWS) else targets):
        return line  # computed on the fit line
    seeds = inputs if role in ("inputs", ROWS) else targets if role == "targets" else \
        inputs + targets
    best: tuple[int, int] | None = None  # (went through a loop over data, line)
    for name in dict.fromkeys(n for n in seeds if n):
        origin, looped = _trace(tree, scope, name, stmt.lineno, role)
        if origin is None:
            continue
        key = (int(looped), origin)
        if best is None or key > best:
            best = key
    return best[1] if best is not None else None


def validation_binding(location: dict | None) -> dict | None:
    """Where the name given as ``validation_data=`` at ``location`` was last bound, or None.

    The first hop only (``val_ds = tf.data.Dataset...`` for ``fit(train_ds,
    validation_data=val_ds)``): the validation pipeline itself, where a step it lacks goes.
    """
    tree = _tree_of(location)
    if tree is None:
        return None
    for stmt in _statements_at(tree, location["line"]):
        names = _validation_inputs(stmt)
        if len(names) != 1:
            continue
        bound = [n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
                 and n.lineno < stmt.lineno and any(
                     isinstance(t, ast.Name) and t.id == names[0]
                     for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
        if bound:
            return {**location, "line": max(bound), "used_at": location["line"]}
    return None


def _validation_inputs(stmt: ast.stmt, half: str = "inputs") -> list[str]:
    """The names of the inputs (or targets) in a ``fit`` call's ``validation_data=``.

    ``(X_val, y_val)`` gives ``X_val`` (``y_val`` for the targets); a dict of named inputs
    gives each; one name (a dataset carrying inputs and targets) gives that name. None
    without such a call.
    """
    for call in ast.walk(stmt):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and
                call.func.attr in _FIT_CALLS):
            continue
        held = next((k.value for k in call.keywords if k.arg == "validation_data"), None)
        if isinstance(held, (ast.Tuple, ast.List)) and held.elts:
            held = held.elts[0] if half == "inputs" or len(held.elts) < 2 else held.elts[1]
        parts = held.values if isinstance(held, ast.Dict) else \
            held.elts if isinstance(held, (ast.Tuple, ast.List)) else [held]
        return [r for r in (_root(p) for p in parts if p is not None) if r]
    return []


def _prediction_call(scope: list[ast.AST], name: str, before: int) -> ast.Call | None:
    """The model call whose output ``name`` holds (the prediction is not the data), or None.

    That is a name bound to a call of an object that a call made (``out = model(xb)`` after
    ``model = Net()``), or of an attribute of ``self`` that is no method of the file's classes
    (``pred = self.model(xb).squeeze(-1)``: the model a trainer object holds), a method of the
    output (``.squeeze(-1)``) kept.
    """
    value = _latest_value(scope, name, before)
    base = _called(value) if isinstance(value, ast.Call) else None
    if base is None:
        return None
    if isinstance(base.func, ast.Attribute):  # self.model(x)
        methods = {f.name for c in ast.walk(scope[-1]) if isinstance(c, ast.ClassDef)
                   for f in c.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        return base if base.func.attr not in methods else None
    return base if isinstance(_latest_value(scope, base.func.id, before), ast.Call) else None


def _latest_value(scope: list[ast.AST], name: str, before: int) -> ast.AST | None:
    for body in scope:
        found = [b for b in _bindings(body, name, before) if isinstance(b[1], ast.Assign)]
        if found:
            return max(found, key=lambda b: b[0])[2]
    return None


def _data_arguments(stmt: ast.stmt, scope: list[ast.AST]) -> tuple[bool, list[str], list[str]]:
    """``(is a fit call, input names, target names)`` at a use line.

    A ``fit`` call's first and second arguments (``""`` for one computed on that line). Else the
    loss call's arguments: a model called inline (``criterion(model(xb), yb)``), or a name that
    holds a model's output, gives the inputs; the other names are the targets. A step function
    of the file called with data (``train_step(xb, yb)``) takes the inputs first. A line with one
    call of one or more arguments and no loss (``out = model(xb)``, an evaluation forward) gives
    the inputs. A call given ``labels=`` (a Hugging Face model computing its own loss) gives
    those as the targets, its ``input_ids=`` (or first argument) as the inputs.
    """
    calls = [n for n in ast.walk(stmt) if isinstance(n, ast.Call)]
    for call in calls:
        loader = _trainer_data(call, scope, stmt.lineno)
        if loader is not None:  # the loader / dataset carries inputs and targets together
            return (True, [""], [""]) if loader == "" else (False, [loader], [loader])
        if isinstance(call.func, ast.Attribute) and call.func.attr in _FIT_CALLS:
            args = [*call.args[:2]] + [k.value for k in call.keywords if k.arg in ("x", "y")]
            names = [_fit_names(a) for a in args[:2]]
            if len(names) == 1:  # fit(train_ds): one dataset carries inputs and targets
                return True, names[0], names[0]
            return True, names[0] if names else [], names[1] if len(names) > 1 else []
    inputs: list[str] = []
    targets: list[str] = []
    for call in calls:  # a model that computes its own loss: model(input_ids=..., labels=...)
        labels = [k.value for k in call.keywords if k.arg == "labels"]
        if labels:
            given = [k.value for k in call.keywords if k.arg in ("input_ids", "inputs_embeds",
                                                                 "pixel_values", "x")]
            return False, [r for r in map(_root, [*call.args[:1], *given]) if r], \
                [r for r in map(_root, labels) if r]
    loss_call = next((c for c in calls if len(c.args) >= 2), None)  # outermost: the loss
    for a in loss_call.args if loss_call is not None else ():
        while isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute) and \
                a.func.attr in _DATA_METHODS:  # targets.reshape(-1), model(x).view(-1, V)
            a = a.func.value
        inline = _called(a)
        if inline is not None:  # the model called inline: its argument is the input
            inputs += [r for r in map(_root, inline.args) if r]
            continue
        root = _root(a) if isinstance(a, (ast.Name, ast.Subscript, ast.Attribute)) else None
        if root is None:
            continue
        pred = _prediction_call(scope, root, stmt.lineno)
        if pred is not None:
            inputs += [r for r in map(_root, pred.args) if r]
        else:
            targets.append(root)  # X[i:i + 32]: X, not the index
    if not inputs and len(targets) >= 2 and _user_function(loss_call, scope):
        inputs = targets[:1]  # train_step(x, y): a step function of this file takes (x, y)
        targets = targets[1:]
    if loss_call is None and len(calls) == 1 and calls[0].args:
        inputs = [r for r in map(_root, calls[0].args) if r]  # a forward: ``out = model(xb)``
    return False, inputs, [t for t in targets if t not in inputs]


def _fit_names(arg: ast.AST) -> list[str]:
    """The names a ``fit`` argument hands over; ``[""]`` when it is computed on that line.

    ``X``, or the values of a dict or list of named inputs (``{"numeric": X_num, "region":
    X_cat}``, ``[X_a, X_b]``).
    """
    if isinstance(arg, ast.Name):
        return [arg.id]
    parts = arg.values if isinstance(arg, ast.Dict) else \
        arg.elts if isinstance(arg, (ast.Tuple, ast.List)) else None
    if parts and all(isinstance(p, ast.Name) for p in parts):
        return [p.id for p in parts]
    return [""]


def _user_function(call: ast.Call | None, scope: list[ast.AST]) -> bool:
    """Whether ``call`` calls, by its plain name, a function defined in this file (a step)."""
    if call is None or not isinstance(call.func, ast.Name) or not scope:
        return False
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == call.func.id
               for n in ast.walk(scope[-1]))


_TRAINER_DATA = ("train_dataloaders", "train_dataset", "datamodule")


def _trainer_data(call: ast.Call, scope: list[ast.AST], before: int) -> str | None:
    """The training data handed to a trainer by this call: a name, ``""`` (made inline), None.

    Lightning's ``trainer.fit(model, train_loader, ...)`` (the receiver built by a
    ``...Trainer(...)`` call) takes the model first and the data second; HF's
    ``Trainer(..., train_dataset=ds)`` and Lightning's ``train_dataloaders=`` /
    ``datamodule=`` name it by keyword.
    """
    for kw in call.keywords:
        if kw.arg in _TRAINER_DATA:
            return kw.value.id if isinstance(kw.value, ast.Name) else ""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "fit" and len(call.args) >= 2):
        return None
    receiver = func.value
    if isinstance(receiver, ast.Name):
        receiver = _latest_value(scope, receiver.id, before)
    made_by = receiver.func if isinstance(receiver, ast.Call) else None
    name = made_by.attr if isinstance(made_by, ast.Attribute) else \
        made_by.id if isinstance(made_by, ast.Name) else ""
    if not name.endswith("Trainer"):
        return None
    data = call.args[1]
    return data.id if isinstance(data, ast.Name) else ""


def _called(node: ast.AST) -> ast.Call | None:
    """The call of a plain name (or ``self.name``) at the base of ``model(x)``, ...."""
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) or (  # model(x), or self.model(x)
                    isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "self"):
                return node
            node = node.func
        else:
            node = node.value
    return None


def _statements_at(tree: ast.Module, line: int) -> list[ast.stmt]:
    """The simple statements spanning ``line``, in source order (``a; b; c`` gives three)."""
    found = [node for node in ast.walk(tree)
             if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno)
             and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                       ast.For, ast.While, ast.With, ast.If, ast.Try))]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _root(node: ast.AST) -> str | None:
    """The variable at the root of ``x``, ``x[i]``, ``x.attr``, ``x.reshape(...)[:, 0]``."""
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, (ast.Subscript, ast.Attribute, ast.Starred)):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        else:
            return None


def _names(node: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]


def _scope_of(tree: ast.Module, stmt: ast.stmt) -> list[ast.AST]:
    """The enclosing function bodies of ``stmt``, innermost first, then the module."""
    chain: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.lineno <= stmt.lineno <= (node.end_lineno or node.lineno):
            chain.append(node)
    chain.sort(key=lambda n: -n.lineno)
    return [*chain, tree]


def _bindings(scope: ast.AST, name: str, before: int) -> list[tuple[int, ast.AST, ast.AST]]:
    """``(line, binding statement, bound value)`` for ``name`` in ``scope`` before ``before``.

    Nested functions and classes are not looked into.
    """
    out = []
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, _COMPREHENSIONS) and \
                node.lineno <= before <= (node.end_lineno or node.lineno):
            # a use inside a comprehension (``[step(xb, yb) for xb, yb in ds]``): its
            # generators bind their targets for it
            out += [(node.lineno, node, gen.iter) for gen in node.generators
                    if name in _target_names(gen.target)]
        if getattr(node, "lineno", before) >= before:
            continue
        if isinstance(node, ast.Assign):
            for target in node.targets:
                value = _value_for(target, node.value, name)
                if value is not None:
                    out.append((node.lineno, node, value))
                elif isinstance(target, (ast.Subscript, ast.Attribute)) and \
                        _root(target) == name:  # X[:, 0] = ...: changed in place, here
                    out.append((node.lineno, node, node.value))
        elif isinstance(node, ast.AugAssign) and not isinstance(node.target, ast.Name) and \
                _root(node.target) == name:
            out.append((node.lineno, node, node.value))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                _mutates(node.value, name):
            out.append((node.lineno, node, node.value))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None and \
                isinstance(node.target, ast.Name) and node.target.id == name:
            out.append((node.lineno, node, node.value))
        elif isinstance(node, ast.For) and name in _target_names(node.target):
            out.append((node.lineno, node, node.iter))  # comprehension variables stay local
    return out


def _mutates(call: ast.Call, name: str) -> bool:
    """A bare call that changes ``name`` in place: ``rng.shuffle(y)``, ``y.sort()``, ``X.mul_(k)``."""
    func = call.func
    fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if fname in ("shuffle", "sort", "fill", "put", "resize") or \
            (fname.endswith("_") and not fname.startswith("_")):
        if isinstance(func, ast.Attribute) and _root(func.value) == name and fname != "shuffle":
            return True
        return any(_root(a) == name for a in call.args[:1])
    return False


def _target_names(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _value_for(target: ast.AST, value: ast.AST, name: str) -> ast.AST | None:
    """The part of ``value`` bound to ``name`` by ``target`` (tuple unpacking pairs them)."""
    if isinstance(target, ast.Name):
        return value if target.id == name else None
    if isinstance(target, (ast.Tuple, ast.List)):
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
            for t, v in zip(target.elts, value.elts, strict=True):
                got = _value_for(t, v, name)
                if got is not None:
                    return got
            return None
        return value if name in _target_names(target) else None
    return None


def _trace(tree: ast.Module, scope: list[ast.AST], name: str, before: int,
           role: str | None = None, hops: int = 0) -> tuple[int | None, bool]:
    """Follow ``name`` back: ``(line that made it, whether a loop over data was crossed)``."""
    if hops > _MAX_HOPS:
        return None, False
    if name.startswith("self."):  # an attribute: where any method assigned it
        found = _attribute_bindings(tree, name[len("self."):])
        if len(found) != 1:
            return None, False  # none in this file, or several: no single origin
        line, node, value = found[0]
        return _follow(tree, node, value, line, name, False, role, hops)
    for body in scope:
        found = _bindings(body, name, before)
        if found:
            break
        if _is_parameter(body, name):
            return _through_callers(tree, body, name, role, hops)
    else:
        return None, False  # an import, a builtin: not followed
    line, node, value = max(found, key=lambda b: b[0])
    if role == ROWS and isinstance(value, ast.Subscript) and _is_split(value.slice) and \
            _in_loop(body, line):
        return None, False  # idx = perm[i:i + bs] in a loop: a batch, not the data's rows
    loop = isinstance(node, (ast.For, *_COMPREHENSIONS))
    if not (loop or isinstance(node, (ast.Assign, ast.AnnAssign))) or \
            (isinstance(node, ast.Assign) and _value_for(node.targets[0], node.value, name) is None
             and not any(_value_for(t, node.value, name) is not None for t in node.targets)):
        return line, False  # changed in place on this line
    return _follow(tree, node, value, line, name, loop, role, hops)


def _in_loop(body: ast.AST, line: int) -> bool:
    """Whether ``line`` lies in the body of a ``for`` or ``while`` loop of ``body``."""
    return any(isinstance(n, (ast.For, ast.While)) and
               n.body[0].lineno <= line <= (n.end_lineno or n.lineno)
               for n in ast.walk(body))


def _follow(tree: ast.Module, node: ast.AST, value: ast.AST, line: int, name: str, loop: bool,
            role: str | None, hops: int) -> tuple[int | None, bool]:
    """The origin of ``value``, bound to ``name`` by ``node`` on ``line`` (a loop when ``loop``).

    A pure wrapper is seen through; so is a call of a function of this file that only hands
    data on (``self.data.train_loader()`` returning ``DataLoader(self.train_ds)``), whose
    returns are followed; an attribute of ``self`` is followed to where it was assigned.
    """
    handed = _handing_on(tree, value, _unpacked_index(node, name), role)
    if handed is not None:
        results = [r for r in (_follow(tree, ret, part, ret.lineno, name, False, role, hops + 1)
                               for ret, part in handed) if r[0] is not None]
        if results:
            origin, looped = max(results, key=lambda r: r[0])
            return origin, loop or looped
    inner = _unwrapped(value, role)
    if inner is None and not loop:
        return line, False  # this line computes the data
    names = [n for n in _refs(value if inner is None else inner) if n != name] or \
        ([name] if loop or inner is not None else [])
    results = []
    for other in names:
        origin, looped = _trace(tree, _scope_of(tree, node), other, line, role, hops + 1)
        if origin is not None and origin != line:
            results.append((origin, loop or looped))
    if results:
        return max(results, key=lambda r: r[0])  # the latest change to any part of the data
    return (None, False) if loop else (line, False)


def _refs(node: ast.AST) -> list[str]:
    """The names ``node`` reads, with ``self.attr`` read as one name (``"self.attr"``)."""
    out: list[str] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and \
                n.value.id == "self":
            out.append(f"self.{n.attr}")
            continue
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            out.append(n.id)
        stack.extend(reversed(list(ast.iter_child_nodes(n))))
    return out


def _functions(tree: ast.Module, fname: str) -> list[ast.AST]:
    return [n for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == fname]


def _returns(func: ast.AST) -> list[ast.Return]:
    """The ``return`` statements of ``func`` itself (not of functions nested in it)."""
    out, stack = [], list(ast.iter_child_nodes(func))
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(n, ast.Return) and n.value is not None:
            out.append(n)
        stack.extend(ast.iter_child_nodes(n))
    return out


class _Unbatch(ast.NodeTransformer):
    """``X[b]`` -> ``X`` where ``b`` is a name or slice: a generator's batch of the rows.

    A constant key (``batch["x"]``) picks a field, not rows, and is kept.
    """

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        if isinstance(node.value, (ast.Name, ast.Attribute)) and \
                isinstance(node.slice, (ast.Name, ast.Slice)) and not any(
                isinstance(n, ast.Call) for n in ast.walk(node.slice)):
            return node.value  # (``b["x"]`` picks a field, not rows: kept)
        return self.generic_visit(node)


def _yields(func: ast.AST) -> list[ast.Return]:
    """The ``yield x`` statements of a generator ``func``, as returns of ``x`` at their lines.

    Each batch a generator hands on is what a loop over it binds.
    """
    out, stack = [], list(ast.iter_child_nodes(func))
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Yield) and \
                n.value.value is not None:
            batch = _Unbatch().visit(copy.deepcopy(n.value.value))
            out.append(ast.copy_location(ast.Return(value=batch), n))
        stack.extend(ast.iter_child_nodes(n))
    return out


def _unpacked_index(node: ast.AST, name: str) -> tuple[int, ...] | None:
    """The position of ``name`` in a tuple unpacking, or None.

    An assignment (``X, y = load()``) or a loop (``for xb, yb in batches(X, y)``); nested
    unpacking gives a path (``(X_tr, y_tr), (X_va, y_va) = split(X, y)``: ``y_tr`` is (0, 1)).
    """
    target = node.target if isinstance(node, (ast.For, ast.AsyncFor)) else \
        node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
    return _path_to(target, name) if isinstance(target, (ast.Tuple, ast.List)) else None


def _path_to(target: ast.AST, name: str) -> tuple[int, ...] | None:
    if isinstance(target, ast.Name):
        return () if target.id == name else None
    if isinstance(target, (ast.Tuple, ast.List)):
        for i, elt in enumerate(target.elts):
            inner = _path_to(elt, name)
            if inner is not None:
                return (i, *inner)
    return None


def _handing_on(tree: ast.Module, value: ast.AST, index: tuple[int, ...] | None = None,
                role: str | None = None) -> list[tuple[ast.Return, ast.AST]] | None:
    """What the function of this file that ``value`` calls returns, if it only hands data on.

    ``(return statement, returned data)`` pairs. The function is named once in the file (a method or a plain function) and every one of
    its returns is a pure wrapper of data made elsewhere (``return DataLoader(self.train_ds)``);
    a function that computes its result (``return (x - m) / s``) is where the data is made,
    and the call's line stays the origin; for :data:`ROWS` a scaling that keeps every row is
    handing on too (the rows were chosen before it). ``index``: the call's result is unpacked
    and the data is that element of a returned tuple (``X, y = load()``).
    """
    while isinstance(value, ast.Call) and getattr(value.func, "id", None) in _DATA_FUNCS and \
            value.args:  # enumerate(self.loader()), iter(get_loader())
        if value.func.id == "enumerate" and index:  # ``for i, (xb, yb) in enumerate(...)``
            if index[0] != 1:
                return None  # the counter
            index = index[1:]
        value = value.args[0]
    if not isinstance(value, ast.Call):
        return None
    func = value.func
    fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    defs = _functions(tree, fname) if fname else []
    if len(defs) != 1:
        return None
    parts = []
    for ret in _returns(defs[0]) + _yields(defs[0]):
        part = ret.value
        for i in index or ():
            if not isinstance(part, (ast.Tuple, ast.List)):
                break
            if i >= len(part.elts):
                return None
            part = part.elts[i]
        parts.append((ret, part))
    if not parts or any(_unwrapped(part, role) is None
                        for _, part in parts):
        return None
    return parts


def _attribute_bindings(tree: ast.Module, attr: str) -> list[tuple[int, ast.AST, ast.AST]]:
    """``(line, statement, value)`` of every ``self.attr = value`` in the file (any method).

    Methods run in an order the file does not show, so every assignment counts, the ``None``
    placeholders of an ``__init__`` excepted.
    """
    out = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else []
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr == attr and \
                    isinstance(t.value, ast.Name) and t.value.id == "self" and \
                    not (isinstance(node.value, ast.Constant) and node.value.value is None):
                out.append((node.lineno, node, node.value))
    return out


def _is_parameter(body: ast.AST, name: str) -> bool:
    if not isinstance(body, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    a = body.args
    return name in [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def _through_callers(tree: ast.Module, func: ast.AST, name: str, role: str | None,
                     hops: int) -> tuple[int | None, bool]:
    """A parameter: follow the argument the function's callers in this file pass for it.

    A function called by its plain name, or a method (defined in a class of this file) called
    as ``obj.name(...)`` / ``self.name(...)``, from a single call site (a helper called from
    several places has no one origin), is followed; the argument is seen through a pure
    wrapper (``torch.from_numpy(y)``: ``y``).
    """
    params = [p.arg for p in (*func.args.posonlyargs, *func.args.args)]
    owner = next((c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and func in c.body),
                 None)
    decorators = {getattr(d, "id", getattr(d, "attr", None)) for d in
                  getattr(func, "decorator_list", ())}
    if owner is not None and "classmethod" in decorators:
        return None, False  # called on the class: no instance's calls to tell apart
    if owner is not None:
        if "staticmethod" not in decorators:
            params = params[1:]  # self: the receiver, not an argument
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and
                 isinstance(n.func, ast.Attribute) and n.func.attr == func.name and
                 _receiver_class(tree, n) in (owner.name, None)]
        known = [n for n in calls if _receiver_class(tree, n) == owner.name]
        calls = known or calls  # a receiver of another class of this file is not this method
    else:
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and
                 isinstance(n.func, ast.Name) and n.func.id == func.name]
    if len(calls) != 1 or any(isinstance(a, ast.Starred) for a in calls[0].args):
        return None, False
    call = calls[0]
    arg = next((k.value for k in call.keywords if k.arg == name), None)
    if arg is None and name in params and params.index(name) < len(call.args):
        arg = call.args[params.index(name)]
    if isinstance(arg, ast.Call):
        inner = _unwrapped(arg, role)
        if isinstance(inner, ast.Tuple) and len(inner.elts) == 1:
            inner = inner.elts[0]
        arg = inner if isinstance(inner, (ast.Name, ast.Attribute)) else arg
    root = _root(arg) if arg is not None else None
    if root is None:
        return None, False
    stmt = next((st for st in _statements_at(tree, call.lineno)
                 if any(n is call for n in ast.walk(st))), None) or _header_of(tree, call)
    if stmt is None:
        return None, False
    return _trace(tree, _scope_of(tree, stmt), root, stmt.lineno, role, hops + 1)


def _receiver_class(tree: ast.Module, call: ast.Call) -> str | None:
    """The class of this file a method call's receiver is an instance of, when it shows.

    ``self.m()`` inside a class; ``Cls().m()``; ``obj.m()`` where ``obj = Cls(...)`` in the
    enclosing scopes. None when it does not show (a parameter, an import's class).
    """
    classes = {c.name: c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}
    recv = call.func.value
    if isinstance(recv, ast.Call) and isinstance(recv.func, ast.Name):
        return recv.func.id if recv.func.id in classes else None
    if not isinstance(recv, ast.Name):
        return None
    if recv.id == "self":
        return next((name for name, c in classes.items() if c.lineno <= call.lineno <=
                     (c.end_lineno or c.lineno)), None)
    stmt = next((st for st in _statements_at(tree, call.lineno)
                 if any(n is call for n in ast.walk(st))), None)
    if stmt is None:
        return None
    for scope in _scope_of(tree, stmt):
        found = _bindings(scope, recv.id, stmt.lineno)
        if found:
            value = max(found, key=lambda b: b[0])[2]
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and \
                    value.func.id in classes:
                return value.func.id
            return None
    return None


def _header_of(tree: ast.Module, call: ast.Call) -> ast.stmt | None:
    """The loop or ``with`` whose header makes ``call`` (``for xb, yb in batches(X, y):``)."""
    return next((st for st in ast.walk(tree) if isinstance(st, (ast.For, ast.AsyncFor, ast.With))
                 and any(n is call for h in ((st.iter,) if isinstance(st, (ast.For, ast.AsyncFor))
                                             else st.items) for n in ast.walk(h))), None)


def _unwrapped(value: ast.AST, role: str | None = None) -> ast.AST | None:
    """What a pure wrapper wraps (``DataLoader(ds, ...)`` -> ``ds``).

    None when ``value`` computes something (arithmetic, a subscript, a call that is not a
    wrapper). With a ``role``, a contiguous slice (``X[:3000]``, a split) is a wrapper too: it
    keeps the rows' scale and label mix, so what made them lies further back; without one
    (duplicates, alignment) the slice is what changed the data. For :data:`ROWS` (how many
    rows there are) the slice or split is the origin, and a scaling that keeps every row
    (``scaler.transform(X)``) is seen through.
    """
    if isinstance(value, ast.Name):
        return value
    if role not in (None, ROWS) and isinstance(value, ast.Subscript) and _is_split(value.slice):
        return _unwrapped(value.value, role)
    if role == ROWS and isinstance(value, ast.BinOp):  # (X - mu) / sd: X's rows, every one
        return _unwrapped(value.left, role)
    if role == ROWS and isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Name):
        # X[train_idx]: the rows the index holds (followed to the split that made it)
        inner = _unwrapped(value.value, role)
        return None if inner is None else ast.Tuple(elts=[
            *(inner.elts if isinstance(inner, ast.Tuple) else [inner]), value.slice],
            ctx=ast.Load())
    if isinstance(value, (ast.Tuple, ast.List, ast.Dict)):  # (x, y) handed on together
        # (a dict of named inputs, ``fit({"numeric": X, "region": r}, y)``: its values)
        inner = [_unwrapped(e, role) for e in
                 (value.values if isinstance(value, ast.Dict) else value.elts)]
        if not inner or any(i is None for i in inner):
            return None
        return ast.Tuple(elts=[e for i in inner for e in
                               (i.elts if isinstance(i, ast.Tuple) else [i])], ctx=ast.Load())
    if isinstance(value, ast.Call):
        func = value.func
        fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if isinstance(func, ast.Attribute) and fname in _DATA_METHODS:
            return _unwrapped(func.value, role)  # x.to(device): the receiver is the data
        if fname in _SPLITS:  # a random split keeps each array's scale and label mix
            parts = [a for a in value.args if not isinstance(a, ast.Constant)]
            if role in (None, ROWS) or not parts:
                return None  # without a role (alignment) or for rows, the split changed them
            parts = parts[:1] if role == "inputs" else parts[-1:]
        elif fname in _PAIRING:
            parts = [a for a in value.args if not isinstance(a, ast.Constant)]
            if len(parts) == 1 and isinstance(parts[0], (ast.Tuple, ast.List)):
                parts = list(parts[0].elts)  # from_tensor_slices((x, y))
            if role is not None and len(parts) >= 2:  # the half the finding is about
                parts = parts[:1] if role in ("inputs", ROWS) else parts[-1:]
            elif role is None and len(parts) >= 2 and _same_split(parts) is not None:
                # TensorDataset(X[:n], y[:n]): one split of every part keeps them aligned
                parts = _same_split(parts)
        elif fname in _DATA_FUNCS:
            parts = value.args[:1]  # DataLoader(ds, BATCH): the dataset, not the settings
        elif role == ROWS and fname in _SCALING and isinstance(func, ast.Attribute):
            parts = value.args[:1]  # scaler.transform(X): every row kept, only values change
        elif isinstance(func, ast.Name) and fname in _WRAPPERS.get():
            parts = value.args[:1]  # to_t(X[tr], torch.float32): this file's own wrapper
        else:
            return None
        inner = [_unwrapped(p, role) for p in parts]
        if not inner or any(i is None for i in inner):
            return None
        return ast.Tuple(elts=[e for i in inner for e in
                               (i.elts if isinstance(i, ast.Tuple) else [i])], ctx=ast.Load())
    if isinstance(value, ast.Attribute):  # df.values, batch.x; ``self.train_ds`` is followed
        return value if isinstance(value.value, ast.Name) and value.value.id == "self" else \
            _unwrapped(value.value, role)
    if isinstance(value, (ast.ListComp, ast.GeneratorExp)) and len(value.generators) == 1 and \
            not value.generators[0].ifs and _repacks(value.elt):
        # [{"input_ids": i, "labels": t} for i, t in zip(ids, labels)]: rows re-packed as they
        # are, so the data is what the comprehension iterates over
        return _unwrapped(value.generators[0].iter, role)
    return None


_REPACK = (ast.Name, ast.Dict, ast.Tuple, ast.List, ast.Constant, ast.Load, ast.Starred,
           ast.Attribute, ast.keyword)


def _local_wrappers(tree: ast.Module) -> frozenset:
    """Names of this file's functions and lambdas that return a wrapper of their first argument.

    ``to_t = lambda a, dt: torch.tensor(a, dtype=dt)``, ``def as_t(a): return
    torch.from_numpy(a).float()``: calls of them are seen through like the wrappers they call.
    Named once in the file; a function whose body does anything before its return (``a =
    a[:100]``) is not one.
    """
    found: dict[str, list] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = [st for st in node.body if not (isinstance(st, ast.Expr) and
                                                   isinstance(st.value, ast.Constant))]
            only = len(body) == 1 and isinstance(body[0], ast.Return)  # nothing done before
            found.setdefault(node.name, []).append((node.args, body[0].value if only else None))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda) and \
                len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found.setdefault(node.targets[0].id, []).append((node.value.args, node.value.body))
    out = set()
    for name, defs in found.items():
        if len(defs) != 1 or defs[0][1] is None or not defs[0][0].args:
            continue
        args, body = defs[0]
        first = args.args[0].arg
        inner = _unwrapped(body) if not isinstance(body, ast.Name) else None
        if isinstance(inner, ast.Tuple) and len(inner.elts) == 1:
            inner = inner.elts[0]
        if isinstance(inner, ast.Name) and inner.id == first:
            out.add(name)
    return frozenset(out)


def _repacks(elt: ast.AST) -> bool:
    """Whether a comprehension's element only arranges its loop variables (no computation).

    Calls that wrap a value (``torch.tensor(x)``) or only take another's shape
    (``torch.ones_like(ids)``, an attention mask) keep the values as they are.
    """
    for n in ast.walk(elt):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if not (name in _DATA_FUNCS or name in _DATA_METHODS or name.endswith("_like")):
                return False
        elif not isinstance(n, _REPACK):
            return False
    return True


def _same_split(parts: list[ast.AST]) -> list[ast.AST] | None:
    """What the parts slice, when each is the same contiguous row range of something.

    ``X[:n]``, ``y[:n]``, also inside a wrapper: ``torch.from_numpy(X[:n])``; else None.
    """
    bare = []
    for p in parts:
        while isinstance(p, ast.Call) and getattr(p.func, "attr", getattr(p.func, "id", None)) \
                in _DATA_FUNCS and len(p.args) == 1:
            p = p.args[0]
        bare.append(p)
    if not all(isinstance(p, ast.Subscript) and _is_split(p.slice) for p in bare) or \
            len({ast.dump(p.slice) for p in bare}) != 1:
        return None
    return [p.value for p in bare]


def _is_split(index: ast.AST) -> bool:
    """A contiguous row range: ``[:n]``, ``[n:]``, ``[a:b]`` (no step, no mask, no index array)."""
    return isinstance(index, ast.Slice) and index.step is None and all(
        bound is None or isinstance(bound, (ast.Constant, ast.Name, ast.BinOp, ast.UnaryOp))
        for bound in (index.lower, index.upper))
