"""``dataloader_throughput``: the data loader alone vs the model step alone."""

from __future__ import annotations

import sys
import time

from ..capture.codeloc import definition_location
from .base import Probe, ProbeContext, register

BATCHES = 5


@register
class DataloaderThroughput(Probe):
    """The data loader alone against the model step alone, timed on a few batches."""

    id = "dataloader_throughput"
    cost = 2
    categories = ("performance_issue",)
    needs_live = True
    frameworks = ("torch", "keras")
    traces_origin = False  # located at the slow code itself (collate, __getitem__)
    fix = ("Move the expensive work out of the per-sample path (vectorised collate, precomputed "
           "tensors) or load in parallel with DataLoader(num_workers=N, persistent_workers=True).")

    def suggestion(self, finding) -> str:
        """Worker processes first when the loader had none; else the class's fix."""
        if (finding.evidence or {}).get("num_workers") == 0:
            return ("Load batches in parallel: DataLoader(num_workers=N) with N up to the CPU "
                    "count, or vectorise the per-sample work.")
        return self.fix

    def run(self, ctx: ProbeContext):
        """One confirmed finding when loading a batch takes longer than a training step on it.

        Located at the user's collate function, the dataset's ``__getitem__`` or the dataset itself.
        """
        loader = ctx.train_loader
        tr = ctx.trainer
        if loader is None or tr is None or tr.n == 0:
            return []
        t0 = time.perf_counter()
        it = iter(loader)
        try:
            next(it)
        except StopIteration:  # a generator that fit already exhausted
            return []
        start_ms = 1000 * (time.perf_counter() - t0)  # (worker processes started every pass)
        load_ms = _batch_ms(it)
        model = tr.fresh_model()
        inputs, target = tr.subset(slice(0, getattr(loader, "batch_size", None) or 32))
        tr.fit(model, inputs, target, 1)
        t0 = time.perf_counter()
        tr.fit(model, inputs, target, BATCHES)
        step_ms = 1000 * (time.perf_counter() - t0) / BATCHES
        started = _restarted_workers(ctx, loader, start_ms, load_ms, step_ms)
        if started is not None:
            return [started]
        if load_ms <= step_ms:
            return []
        collate = getattr(loader, "collate_fn", None)
        where = None
        if collate is not None and getattr(collate, "__module__", "").startswith("torch") is False:
            where = definition_location(collate) if isinstance(collate, type) else _func_loc(
                collate)
        dataset = getattr(loader, "dataset", loader)  # Keras: a PyDataset or a generator
        getitem = getattr(type(dataset), "__getitem__", None)
        if where is not None:
            where = _hottest_line(collate, lambda: collate(
                [dataset[i] for i in range(min(len(dataset), 8))])) or where
        elif getitem is not None and _func_loc(getitem):
            where = _hottest_line(getitem, lambda: [dataset[i] for i in
                                                     range(min(len(dataset), 4))]) or \
                _func_loc(getitem)
        where = where or _func_loc(dataset) or definition_location(dataset) or \
            (_pipeline_map(ctx) if ctx.framework == "keras" else None) or ctx.ref("loss_fn")
        workers = getattr(loader, "num_workers", getattr(loader, "workers", 0))
        return [self.finding(
            "data", True,
            f"Loading one batch takes {load_ms:.1f} ms, computing one step {step_ms:.1f} ms: "
            f"the model waits for data (num_workers={workers}). Move per-sample work out of "
            "the loop, vectorise the collate, or use worker processes.",
            where, load_ms=load_ms, step_ms=step_ms, num_workers=workers,
            strength=min(0.95, 0.5 + 0.1 * load_ms / max(step_ms, 1e-6)))]


def _restarted_workers(ctx: ProbeContext, loader, start_ms: float, load_ms: float,
                       step_ms: float):
    """A finding when the loader's worker processes cost more than loading in the process.

    A batch through ``num_workers`` processes costs its load plus, without
    ``persistent_workers``, their start at every pass spread over the pass's batches. Tested
    by experiment: the same dataset, sampler, batching and collate loaded in the training
    process (``num_workers=0``). Confirmed when that is under half the cost and the workers'
    cost is more than a step: the input pipeline's setting (``data``; more workers than CPU
    cores is named in the text, a cause the code can change, not one to escalate). Located
    where ``num_workers`` is set. PyTorch only.
    """
    import os

    workers = getattr(loader, "num_workers", 0)
    if ctx.framework != "torch" or not isinstance(workers, int) or workers <= 0:
        return None
    from torch.utils.data import DataLoader

    from .base import setting_location

    try:
        batches = len(loader)
    except TypeError:  # an iterable dataset without a length
        return None
    if not isinstance(loader, DataLoader) or batches <= 0:
        return None
    restart = 0.0 if getattr(loader, "persistent_workers", False) else \
        max(start_ms - load_ms, 0.0) / batches
    with_workers = load_ms + restart
    try:  # the same sampler and batching, in the training process
        inline = DataLoader(loader.dataset, batch_sampler=loader.batch_sampler,
                            collate_fn=loader.collate_fn, num_workers=0) \
            if loader.batch_sampler is not None else \
            DataLoader(loader.dataset, sampler=loader.sampler, batch_size=None,
                       collate_fn=loader.collate_fn, num_workers=0)
        it = iter(inline)
        next(it)
        in_process = _batch_ms(it)
    except Exception:  # noqa: BLE001 - a dataset the process cannot load alone: no experiment
        return None
    if with_workers <= step_ms or in_process >= 0.5 * with_workers:
        return None
    cores = os.cpu_count() or 1
    made = ctx.ref("loader")
    return DataloaderThroughput().finding(
        "data", True,
        f"Through the loader's {workers} worker processes a batch costs {with_workers:.1f} ms "
        + (f"({restart:.1f} ms of it their start at every pass over the data) "
           if restart else "")
        + f"against a training step's {step_ms:.1f} ms; loaded in the training process the "
        f"same batches take {in_process:.1f} ms"
        + (f". {workers} workers on {cores} CPU cores compete with training" if workers > cores
           else "")
        + ": use num_workers=0 for data held in memory, fewer workers, or "
        "persistent_workers=True.",
        setting_location(made, "num_workers") if made else None, start_ms=start_ms,
        restart_ms=restart, load_ms=load_ms, in_process_ms=in_process, step_ms=step_ms,
        num_workers=workers, cores=cores, strength=0.9, undone=True)


def _batch_ms(it) -> float:
    """Milliseconds per batch drawn from ``it`` over the next ``BATCHES`` (fewer at its end)."""
    t0 = time.perf_counter()
    got = 0
    for _ in range(BATCHES):
        try:
            next(it)
        except StopIteration:
            break
        got += 1
    return 1000 * (time.perf_counter() - t0) / max(got, 1)


def _pipeline_map(ctx: ProbeContext) -> dict | None:
    """A ``tf.data`` pipeline's mapped function, traced from where training took the data."""
    from ..provenance import data_origin, mapped_function
    from . import _numpy_stats as st

    used = st.data_location(ctx)
    return mapped_function(data_origin(used, "inputs")) or mapped_function(used)


def _func_loc(fn) -> dict | None:
    code = getattr(fn, "__code__", None) or getattr(fn, "gi_code", None)  # a generator too
    if code is None:
        return None
    from ..capture.codeloc import is_user_file

    return {"file": code.co_filename, "line": code.co_firstlineno} \
        if is_user_file(code.co_filename) else None


HOT_SHARE = 0.3  # a line taking this share of the slow function's time is where it is slow


def _hottest_line(fn, call) -> dict | None:
    """The user's line where ``call()`` spends most (``fn``: a collate or ``__getitem__``).

    Time is charged to the innermost line of the user's code running (a library call counts
    on the line that made it; a user helper or transform called from ``fn``, its own lines):
    where the work is, not only the line of ``fn`` that reached it. None when no line takes
    :data:`HOT_SHARE` of the time, when ``fn`` is not the user's code or when ``call`` fails.
    """
    code = getattr(fn, "__code__", None)
    if code is None or _func_loc(fn) is None:
        return None
    spent: dict[tuple, float] = {}
    outer: dict[int, float] = {}  # the same time charged to fn's own line that reached it
    at: list = [None, 0.0, None]  # the (file, line) running in the innermost user frame, since
    # when, and fn's own line then
    inside = [0]  # user frames of fn's call on the stack
    callees: dict[int, set] = {}  # fn's line -> names of the user functions it called there

    def charge(key) -> None:
        now = time.perf_counter()
        if at[0] is not None:
            spent[at[0]] = spent.get(at[0], 0.0) + now - at[1]
            if at[2] is not None:
                outer[at[2]] = outer.get(at[2], 0.0) + now - at[1]
        at[0], at[1] = key, now

    def local(frame, event, arg):
        if event == "line":
            if frame.f_code is code:
                at[2] = frame.f_lineno
            charge((frame.f_code.co_filename, frame.f_lineno))
        elif event == "return":
            inside[0] -= 1
            back = frame.f_back
            charge((back.f_code.co_filename, back.f_lineno) if inside[0] and back else None)
        return local

    def calls(frame, event, arg):
        if frame.f_code is code or inside[0] and _own(frame.f_code.co_filename):
            back = frame.f_back
            if back is not None and back.f_code is code and frame.f_code is not code:
                callees.setdefault(back.f_lineno, set()).add(frame.f_code.co_name)
            inside[0] += 1
            charge(None)
            return local
        return None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        call()
    except Exception:  # noqa: BLE001 - a sample that fails here: the function's own line
        return None
    finally:
        sys.settrace(previous)
    total = sum(spent.values())
    if not total:
        return None
    (file, line), took = max(spent.items(), key=lambda kv: kv[1])
    if took < HOT_SHARE * total:
        return None
    end = max((ln for *_, ln in code.co_lines() if ln is not None),
              default=code.co_firstlineno)
    if outer and not (file == code.co_filename and code.co_firstlineno <= line <= end):
        caller = max(outer.items(), key=lambda kv: kv[1])[0]  # fn's line that reached a helper
        if _sample_free(code, caller, callees.get(caller, set())):
            return {"file": code.co_filename, "line": caller}
    return {"file": file, "line": line}


def _sample_free(code, line: int, callees: set) -> bool:
    """Whether ``fn``'s statement at ``line`` reaches the slow helper on no sample's data.

    ``mu, sd = stats(self.ref_X)`` or ``x = self.normalize(self.X)[i]`` inside
    ``__getitem__(self, i)`` does the same work for every sample (the helper is given the whole
    array, whatever is done with its result): the fix is to hoist that call (compute it once),
    so it is the line to name, not the helper's lines where the time goes. A call given the
    item or anything made from it in ``fn`` (a local: ``rank(row, self.x)`` after
    ``row = self.x[i]``) is per-item work. ``callees``: the names of the user functions the
    statement was seen calling; only those calls are judged (a cheap call beside them on the
    line does not count). Without them, the whole statement is.
    """
    import ast

    local = set(code.co_varnames) - {"self"}  # the item and whatever was made from it
    try:
        with open(code.co_filename, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return False
    stmts = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and n.lineno == line]
    if not stmts:
        return False

    def free(node) -> bool:
        return not local & {x.id for x in ast.walk(node)
                            if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Load)}

    def name(call: ast.Call) -> str | None:
        func = call.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)

    reaching = [n for st in stmts for n in ast.walk(st)
                if isinstance(n, ast.Call) and name(n) in callees]
    if reaching:
        return all(free(n) for n in reaching)
    return all(free(st) for st in stmts)


def _own(path: str) -> bool:
    """The user's own code: a user file outside installed packages.

    PIL, torchvision and albumentations are not torch, yet not the user's either: time spent
    there stays on the user's line that called them.
    """
    from ..capture.codeloc import is_user_file

    parts = path.replace("\\", "/").split("/")
    return is_user_file(path) and "site-packages" not in parts and "dist-packages" not in parts
