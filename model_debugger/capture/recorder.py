"""The Recorder: one context manager that owns every hook and writes the run record.

The record is a stream of JSON lines (``record.jsonl``), written fresh by each run (opened with
``"w"``). Events other than per-step ones are flushed at once and per-step events at least every
``FLUSH_SECONDS``: by the training thread when steps come, and by a daemon flusher thread when
they stop coming (a hang in a C call, a ``time.sleep``, a long data load), so a script that is
killed mid-run (SIGKILL) still leaves everything up to its last fraction of a second on disk (and
an exception or a SIGTERM, which close the record, loses nothing).

Imports: the Recorder sits at the top of ``capture``. It imports the instruments lazily (when
torch or tensorflow/keras is imported), and nothing of capture imports it: what the instruments
share with it (:data:`FLUSH_SECONDS`, :func:`~._util.num`, :func:`~._util.rss_bytes`, the stack
of active recorders) lives in :mod:`._util`. Outside ``capture`` it imports only
:mod:`model_debugger.redact`, kept as a leaf dependency rather than injected: redaction is part
of what a record *is* (an error message, a traceback, the command line are written redacted or
not at all), so no caller may leave it out; ``redact`` imports nothing of the package but
``safe_write``, itself a leaf.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass

from ..redact import (
    is_secret_name,
    redact,
    redact_args,
    remember_environment,
    remember_script,
)
from . import patches
from ._util import FLUSH_SECONDS, is_oom, num, rss_bytes
from ._util import active as _active
from ._util import active_recorder as active_recorder
from .codeloc import traceback_location
from .imports import when_imported
from .metrics import StdoutTee, parse_metric_line, patch_summary_writer
from .warned import WarningLog

_STREAM_ONLY = ("step", "hist")  # with a file, not kept in ``Recorder.events``
_ENCODER = json.JSONEncoder(default=str)  # json.dumps(default=) builds one per call
try:  # ``JSONEncoder.encode`` builds a C encoder per call (~5 us of a ~9 us step event): one
    from json.encoder import c_make_encoder as _c_make_encoder  # built once, reused
    from json.encoder import encode_basestring_ascii as _ascii

    _C_ENCODE = _c_make_encoder(None, str, _ascii, None, ": ", ", ", False, False, True)
except (ImportError, TypeError):  # no C accelerator (another Python): the encoder above
    _C_ENCODE = None


def _encode(event: dict) -> str:
    """One event as a JSON line's text: what ``_ENCODER.encode`` writes, faster.

    The reused C encoder keeps no circular-reference markers; an event that trips it is
    encoded by ``_ENCODER`` (which says what is wrong).
    """
    if _C_ENCODE is not None:
        try:
            return "".join(_C_ENCODE(event, 0))
        except (RecursionError, ValueError, TypeError):
            pass
    return _ENCODER.encode(event)


def _fresh(path: str):
    """A new record file: unbuffered (see ``Recorder.flush``), private (0600), never appended.

    An earlier file there is truncated (the recorder then makes it 0600); a symlink planted at
    ``path`` is never followed: the open fails.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | \
        getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(path, flags, 0o600), "wb", buffering=0)


@dataclass(frozen=True)
class CaptureConfig:
    """Settings of a capture.

    Schedules in steps count each optimizer's own steps (two optimizers that alternate, as in
    a GAN, are both measured).

    Parameters
    ----------
    hist_every : int
        Record per-module gradient histograms every this many optimizer steps (0: never).
    update_every : int
        Measure the update/weight ratio every this many steps (it needs a copy of the weights).
    module_norms : bool
        Record per-module gradient norms with the global one.
    parse_stdout : bool
        Parse printed ``name=value`` lines as metrics.
    norm_every : int
        PyTorch: measure gradient norms every this many optimizer steps. 0 (the default) is
        automatic: on the steps with full detail (every step unless ``detail_every_max`` allows
        thinning). A step without a measurement has no ``gn`` and no ``rss`` (process memory is
        read on the same steps). Keras measures every step.
    detail_every_max : int
        PyTorch steady-state thinning (see :mod:`.torch_steps`): after the first 64 steps, full
        detail on every k-th step only, the smallest k that keeps it within 1% of a step, at
        most this (and 16; a ``detail_every`` event says so); every step when a gradient is not
        on the CPU. 1 (the default) keeps full detail on every step: thinning still reads the
        learning rate and watches kept graphs only on its sampled steps, and gives a second
        optimizer that steps in turn no detail when k is even.
    """

    hist_every: int = 100
    update_every: int = 50
    module_norms: bool = True
    parse_stdout: bool = True
    norm_every: int = 0
    detail_every_max: int = 1

    def __post_init__(self) -> None:
        for name in ("hist_every", "update_every", "norm_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a whole number >= 0, not {value!r}")
        value = self.detail_every_max
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"detail_every_max must be a whole number >= 1, not {value!r}")


class Recorder:
    """Capture a training run. Use as ``with model_debugger.capture(): ...``.

    Parameters
    ----------
    path : str or None
        Where to stream the JSON-lines record; None keeps it in memory only. With a path,
        ``events`` holds every event but the per-step ones (``step``, ``hist``): kept in memory
        they would grow with the run and show up in the recorded RSS as a leak.
    config : CaptureConfig, optional
        Sampling settings.
    """

    def __init__(self, path: str | None = None, config: CaptureConfig | None = None) -> None:
        self.path = path
        self.config = config or CaptureConfig()
        self.events: list[dict] = []
        self.step = 0
        self.epoch = 0
        self.error: dict | None = None
        self._fh = None
        self._queue: list[dict] = []  # appended without the lock; taken with slice + del
        self._unsent = b""  # encoded rows taken from the queue that a failed write left over
        self.flush_error: BaseException | None = None  # the flusher thread's last write error
        self._lock = threading.RLock()  # held while draining/writing (training thread, flusher)
        self._flusher: threading.Thread | None = None
        self._stop_flush = threading.Event()
        self._before_event: list = []
        self._closed = False  # the block has ended and closed the record file
        self._draining = False
        self._flushed = 0.0
        self._stack = ExitStack()
        self._instruments: list = []
        self._tee: StdoutTee | None = None
        self._untee = None  # removes the tee from sys.stdout (see :mod:`.patches`)
        self._warned: WarningLog | None = None  # the framework warnings (see :mod:`.warned`)
        self._keepers: list | None = None  # set when the block ends
        self._t0 = 0.0

    # -- writing ---------------------------------------------------------------------------
    def emit(self, kind: str, /, **data) -> dict:
        """Append one event to the record.

        With a file, per-step events (``step``, ``hist``) are queued and encoded in one batch at
        least every ``FLUSH_SECONDS`` (one batch runs warm in the CPU caches; one encode per step
        would run cold after every training step); any other event writes the queue first, so
        the file keeps the order of events, and is flushed at once. Instruments that keep step
        rows (:meth:`before_event`) write them before any other event.
        """
        event = {"t": kind, **data}
        if kind in _STREAM_ONLY and self._fh is not None:  # the hot path: no lock
            self._queue.append(event)
            if time.perf_counter() - self._flushed >= FLUSH_SECONDS:
                self.flush()
            return event
        with self._lock:
            if kind != "step":
                self._drain()
            if self._fh is None:
                self.events.append(event)
                if self._closed:  # after the block (a late error location): appended at once
                    with open(self.path, "a", encoding="utf-8") as fh:  # this run's own file
                        fh.write(_encode(event) + "\n")
                return event
            self.events.append(event)
            self._queue.append(event)
            self.flush()
        return event

    def emit_steps(self, events: list[dict]) -> None:
        """Append ``step`` events built whole (``{"t": "step", ...}``), as :meth:`emit` would.

        The step rows' batch (:meth:`~.torch_steps.StepRows._drain`) in one call: queued for
        the next :meth:`flush` (which the caller makes), or kept in :attr:`events` without a
        file.
        """
        if self._fh is not None:  # the hot path: no lock (see flush)
            self._queue.extend(events)
            return
        with self._lock:
            self.events.extend(events)
            if self._closed and events:  # after the block: appended at once
                with open(self.path, "a", encoding="utf-8") as fh:  # this run's own file
                    fh.write("".join([_encode(e) + "\n" for e in events]))

    def _file_closed(self) -> None:
        self._fh = None
        self._closed = True

    def before_event(self, drain) -> None:
        """Call ``drain()`` before any event but ``step``/``hist`` is written.

        An instrument that keeps per-step numbers as rows and writes them in batches registers
        its drain here, so that the record stays in order.
        """
        self._before_event.append(drain)

    def _drain(self) -> None:
        with self._lock:
            if self._draining:
                return
            self._draining = True
            try:
                for drain in self._before_event:
                    drain()
            finally:
                self._draining = False

    def flush(self) -> None:
        """Write the queued events to the file (thread-safe).

        The training thread appends to the queue without the lock; the queue is taken with a
        slice and a ``del`` of the same length (each atomic), so an event appended meanwhile
        stays queued for the next flush. The file is unbuffered: what a failed write (a full
        disk) did not write is kept, to the byte, and written first by the next flush, so a
        write error neither loses nor repeats a row; the error itself propagates (the flusher
        thread keeps it in :attr:`flush_error`, the training thread's next flush retries).
        """
        with self._lock:
            fh = self._fh
            if fh is None:
                return
            queue = self._queue
            n = len(queue)
            data = self._unsent
            if n:  # encoded before the queue is let go: an interrupt here loses nothing
                encode = _encode
                data += "".join([encode(e) + "\n" for e in queue[:n]]).encode("utf-8")
                self._unsent = data
                del queue[:n]
            view = memoryview(data)
            while view:
                written = fh.write(view)  # raw file: the bytes written, or an OSError
                view = view[written or 0:]
                self._unsent = view.tobytes() if view else b""
            self._flushed = time.perf_counter()
            if threading.current_thread() is not self._flusher:
                self.flush_error = None  # all written: the flusher's error is repaired

    def _start_flusher(self) -> None:
        """Start the daemon thread that writes queued steps when the training thread stalls."""
        self._stop_flush.clear()
        thread = threading.Thread(target=self._flush_loop, name="model_debugger-flusher",
                                  daemon=True)
        thread.start()
        self._flusher = thread

    def _stop_flusher(self) -> None:
        thread, self._flusher = self._flusher, None
        if thread is not None:
            self._stop_flush.set()
            thread.join()

    def _flush_loop(self) -> None:
        """Every half ``FLUSH_SECONDS``: drain and flush when nothing was written for that long.

        While steps come, the training thread flushes them itself and this thread only looks
        at the clock; when they stop (a hang, a sleep, a data load), the kept steps reach the
        disk within ``1.5 * FLUSH_SECONDS``.
        """
        while not self._stop_flush.wait(FLUSH_SECONDS / 2):
            if time.perf_counter() - self._flushed < FLUSH_SECONDS:
                continue
            try:
                with self._lock:
                    if self._fh is None:
                        return
                    self._drain()
                    self.flush()
            except Exception as exc:  # noqa: BLE001 - a full disk: the rows stay unsent and the
                self.flush_error = exc  # training thread's next flush writes them or raises
                self._flushed = time.perf_counter()

    def metric(self, name: str, value, source: str, step: int | None = None,
               epoch: int | None = None) -> None:
        """Record a metric value seen from ``source`` (log, stdout, tensorboard, auto)."""
        try:
            value = float(value)
        except (TypeError, ValueError):
            return
        self.emit("metric", name=str(name), value=num(value), source=source,
                  step=self.step if step is None else int(step),
                  epoch=self.epoch if epoch is None else int(epoch))

    def set_epoch(self, epoch: int, source: str) -> None:
        """Move to a new epoch (a re-iterated DataLoader, a printed ``epoch N``, Keras)."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.emit("epoch", epoch=epoch, step=self.step, source=source)

    def _on_line(self, line: str) -> None:
        epoch, found = parse_metric_line(line)
        for name, value in found.items():
            if not is_secret_name(name):  # "pin_password: 1234" printed is no metric to keep
                self.metric(name, value, "stdout", epoch=epoch)

    # -- lifetime --------------------------------------------------------------------------
    def __enter__(self) -> Recorder:
        self._t0 = time.perf_counter()
        try:
            if self.path:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                self._stack.callback(self._file_closed)  # runs after the file is closed
                self._fh = self._stack.enter_context(_fresh(self.path))
                self._stack.callback(self.flush)  # before the file closes (last in, first out)
                self._start_flusher()
                self._stack.callback(self._stop_flusher)  # stopped before the last flush
            remember_environment()  # redacted in what this run writes, even once unset
            remember_script(sys.argv[0] if sys.argv else "")  # db_pass = "..." in the script
            if self._fh is not None:
                os.fchmod(self._fh.fileno(), 0o600)  # private whatever the umask
            self.emit("start", time=time.time(), pid=os.getpid(), argv=redact_args(sys.argv),
                      config=asdict(self.config), rss=rss_bytes())
            if self.config.parse_stdout:
                self._tee = StdoutTee(sys.stdout, self._on_line)
                self._stack.callback(self._restore_stdout)  # stacks: any exit order (patches)
                self._untee = patches.install(sys, "stdout", self._tee.over)
            self._warned = WarningLog(self)
            self._stack.callback(self._warned.install())
            self._stack.callback(when_imported("torch", self._attach_torch))
            for name in ("tensorflow", "keras"):
                self._stack.callback(when_imported(name, self._attach_keras))
            self._stack.callback(when_imported(
                "torch.utils.tensorboard.writer",
                lambda m: self._stack.callback(patch_summary_writer(m, self._tb_scalar))))
            self._stack.callback(when_imported(  # training in processes the capture misses
                "multiprocessing.process", lambda m: self._stack.callback(_watch_processes(m))))
            _active.append(self)
            self._stack.callback(_active.remove, self)
        except BaseException:
            self._stack.close()
            raise
        return self

    @property
    def keeper(self):
        """Live objects kept for Isolate (the model, initial weights, batches), or None.

        After the block the Recorder holds only these (the instruments and every hook are
        gone): a Recorder kept after its block keeps the model alive through ``rec.keeper``
        until :meth:`release` or until the Recorder itself is dropped.
        """
        keepers = self._keepers if self._keepers is not None else \
            [k for k in (getattr(i, "keeper", None) for i in self._instruments) if k is not None]
        return next((k for k in keepers if k.model is not None), keepers[0] if keepers else None)

    def release(self) -> None:
        """Let go of the live objects kept for Isolate (model, batches, spilled weights)."""
        for keeper in self._keepers or []:
            keeper.release()
        self._keepers = []

    def _let_go(self) -> None:
        """After the block: keep the keepers, drop the instruments and their drains."""
        if self._keepers is None:
            self._keepers = [k for k in (getattr(i, "keeper", None) for i in self._instruments)
                             if k is not None]
        self._instruments = []
        self._before_event = []

    def _attach_torch(self, _module) -> None:
        from .torch_instrument import TorchInstrument

        inst = TorchInstrument(self)
        self._instruments.append(inst)
        self._stack.callback(inst.close)
        inst.attach()

    def _attach_keras(self, module) -> None:
        from .keras_instrument import KerasInstrument

        inst = next((i for i in self._instruments if isinstance(i, KerasInstrument)), None)
        if inst is None:
            inst = KerasInstrument(self)
            self._instruments.append(inst)
            self._stack.callback(inst.close)
        inst.attach(module.__name__)

    def _tb_scalar(self, tag: str, value: float, global_step) -> None:
        self.metric(tag, value, "tensorboard")

    def _restore_stdout(self) -> None:
        if self._tee is not None:
            self._tee.finish()  # a stream kept elsewhere forwards only, holding no Recorder
            untee, self._untee = self._untee, None
            self._tee = None
            if untee is not None:
                untee()

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            for inst in self._instruments:
                inst.finish()
            if self._warned is not None:
                self._warned.finish()
            if exc is not None and not (isinstance(exc, SystemExit) and not exc.code):
                self.record_error(exc, tb)
            status = "ok" if self.error is None else self.error["kind"]
            self.emit("end", status=status, steps=self.step,
                      seconds=round(time.perf_counter() - self._t0, 4))
        finally:
            try:
                self._stack.close()
            finally:
                self._let_go()
        return False

    def record_error(self, exc: BaseException, tb=None) -> None:
        """Record an exception that ended the run (OOM, interrupt, anything else)."""
        import traceback

        if isinstance(exc, KeyboardInterrupt):
            kind = "interrupted"
        elif is_oom(exc):
            kind = "oom"
        else:
            kind = "exception"
        tb = tb if tb is not None else exc.__traceback__
        self.error = {
            "kind": kind, "type": type(exc).__name__, "message": redact(str(exc)[:20000])[:2000],
            "location": traceback_location(tb), "step": self.step,
            "traceback": redact("".join(traceback.format_exception(type(exc), exc, tb))[-20000:])[-6000:],
        }
        self.emit("error", **self.error)


_processes = {"users": 0, "original": None}  # one patch shared by nested recorders


def _watch_processes(module):
    """Record a ``process`` event for each ``multiprocessing`` process started under capture.

    With :data:`RANKS_ENV` set (a script run by the CLI), such a process (``torch.multiprocessing
    .spawn``, a ``Process`` per rank) runs under a capture of its own (:class:`RankTarget`);
    without it, its training is not captured and the event lets Reproduce say so. The patch is
    shared by nested recorders and restored when the last one ends (any exit order); the events
    go to the innermost active recorder. Returns the undo callable.
    """
    cls = module.BaseProcess
    if _processes["users"] == 0:
        original = cls.start

        def start(proc):
            try:
                _capture_rank(proc)  # before it starts: the process runs under its own capture
            except Exception:  # noqa: BLE001 - recording must never break the user's start()
                pass
            original(proc)
            rec = active_recorder()
            if rec is None:
                return
            target = getattr(proc, "_target", None)
            name = (f"{getattr(target, '__module__', '?')}."
                    f"{getattr(target, '__qualname__', '?')}" if target is not None
                    else type(proc).__qualname__)
            try:
                rec.emit("process", target=name, kind=type(proc).__name__, pid=proc.pid)
            except Exception:  # noqa: BLE001 - recording must never break the user's start()
                pass

        _processes["original"] = original
        cls.start = start
    _processes["users"] += 1
    done = []

    def undo() -> None:
        if done:
            return
        done.append(True)
        _processes["users"] -= 1
        if _processes["users"] == 0 and _processes["original"] is not None:
            cls.start = _processes["original"]
            _processes["original"] = None

    return undo


RANKS_ENV = "MODEL_DEBUGGER_RANKS"  # the folder where started processes write their records
# processes that are not ranks: DataLoader workers, pools' helpers, the launcher's own
_NOT_RANKS = ("torch.utils.data", "multiprocessing", "concurrent.futures", "torch._inductor",
              "torch.distributed.elastic")


_rank_context: list = [None, None]  # (factory, after) of set_rank_context


def set_rank_context(factory, after=None) -> None:
    """Run every process started under capture from now on inside ``factory()``.

    ``factory`` is picklable (a ``functools.partial`` of a module function) and returns a
    context manager, entered inside the process's capture: the run's seed, its intervention
    and step budget (:mod:`model_debugger._child`). ``after(recorder)``, picklable too, runs
    once the process's capture has ended (its hooks removed, its live objects kept): the probes
    of the rank the job's records name. None: nothing.
    """
    _rank_context[0], _rank_context[1] = factory, after


class RankTarget:
    """What a process started under capture runs: its target inside a capture of its own.

    Picklable (a process started with the ``spawn`` or ``forkserver`` method receives it as it
    receives its target); its record is ``proc-<pid>.jsonl`` in ``folder``; ``context`` is the
    factory of :func:`set_rank_context`. In a forked child the parent's recorders (copies
    holding no file) are closed first: their hooks, inherited with the memory, would otherwise
    record into memory beside this one.
    """

    def __init__(self, target, folder: str, context=None, after=None) -> None:
        self.target = target
        self.folder = folder
        self.context = context
        self.after = after

    def __call__(self, *args, **kwargs):
        """Run the target under a capture writing this process's record."""
        for inherited in list(_active):
            try:
                inherited._stack.close()
            except Exception:  # noqa: BLE001 - a copy's hooks: undo what can be undone
                pass
        rec = Recorder(process_record(self.folder))
        try:
            with rec:
                if self.context is None:
                    return self.target(*args, **kwargs)
                with self.context():
                    return self.target(*args, **kwargs)
        except KeyboardInterrupt:
            self.after = None  # stopped (Ctrl-C, a time limit): no probes after it
            raise
        finally:
            if self.after is not None:
                self.after(rec)
                rec.release()


def process_record(folder: str) -> str:
    """The record of this process among a job's processes (the folder made, private)."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return os.path.join(folder, f"proc-{os.getpid()}.jsonl")


def _capture_rank(proc) -> None:
    """Wrap a process's target in a :class:`RankTarget` when a ranks folder is set.

    ``torch.multiprocessing.spawn`` starts its ``_wrap(fn, i, args, queue)``, which reports an
    exception of ``fn`` to the parent and exits: ``fn`` itself is wrapped, so that its record
    holds the exception. Targets from :data:`_NOT_RANKS` are left alone.
    """
    folder = os.environ.get(RANKS_ENV)
    target = getattr(proc, "_target", None)
    if not folder or target is None or isinstance(target, RankTarget):
        return
    module = str(getattr(target, "__module__", "") or "")
    if module == "torch.multiprocessing.spawn" and getattr(target, "__name__", "") == "_wrap":
        args = tuple(getattr(proc, "_args", ()))
        if args and not isinstance(args[0], RankTarget):
            proc._args = (RankTarget(args[0], folder, *_rank_context), *args[1:])
        return
    if module.startswith(_NOT_RANKS):
        return
    proc._target = RankTarget(target, folder, *_rank_context)


def _after_fork_in_child() -> None:
    """In a forked child (a DataLoader worker, ``os.fork``) no recorder writes the parent's file.

    The child gets a copy of each active recorder, its file handle and, maybe, a lock held by
    the flusher thread, which does not exist in the child: the copies keep events in memory.
    """
    for rec in _active:
        rec._lock = threading.RLock()
        rec._flusher = None
        rec._fh = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def log(**metrics) -> None:
    """Record metrics explicitly: ``model_debugger.log(val_loss=0.52, val_acc=0.81)``.

    A no-op outside ``capture()``; ``epoch=N`` and ``step=N`` set the context of the values.
    """
    rec = active_recorder()
    if rec is None:
        return
    epoch = metrics.pop("epoch", None)
    step = metrics.pop("step", None)
    if epoch is not None:
        rec.set_epoch(int(epoch), "log")
    for name, value in metrics.items():
        if hasattr(value, "item"):
            value = value.item()
        rec.metric(name, value, "log", step=step)
