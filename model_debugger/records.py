"""Records: the run (what capture saw) and the frozen results of each phase, with JSON round trips."""

from __future__ import annotations

import io
import json
import math
import re
from dataclasses import asdict, dataclass, field, fields

import numpy as np

CATEGORIES = (
    "loss_not_decreasing", "overfitting", "gradient_instability", "memory_issue",
    "performance_issue", "convergence_to_wrong_solution",
)
HEALTHY = "healthy"
ROOT_CAUSES = ("hyperparameter", "data", "architecture", "training_loop", "hardware")


def as_float(value) -> float:
    """Decode a JSON number that may be stored as ``"nan"``/``"inf"``; None or junk becomes NaN."""
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):  # a record is untrusted input
        return math.nan


def _tokens(name: str) -> set[str]:
    return set(re.split(r"[^a-z0-9]+", name.lower())) - {""}


_VAL = {"val", "valid", "validation", "test", "eval", "dev", "holdout"}
_ACC = {"acc", "accuracy", "top1"}
_F1 = {"f1", "f1score", "recall", "precision", "auc", "auroc", "mcc"}
_RANKING = {"auc", "auroc", "rocauc"}  # class-balanced scores that rank: 0.5 at chance
_PR = {"pr", "prc", "prauc", "aucpr", "precision", "ap"}  # a precision-recall area: not 0.5


def _balanced_rank(name: str) -> int:
    """Which class-balanced score speaks for the rare class first (lower: preferred).

    F1 and MCC weigh both errors; recall says whether the rare class is found at all; an
    area under the ROC curve ranks scores whatever the threshold; precision alone is high
    when the model predicts the rare class for a handful of rows (it hides a recall of 0).
    """
    tok = _tokens(name)
    if tok & {"f1", "f1score", "mcc"} or any(t.endswith("f1") for t in tok):
        return 0
    if "recall" in tok:
        return 1
    if ranks_at_half(name):
        return 2
    return 3


def ranks_at_half(name: str) -> bool:
    """Whether a class-balanced score is an area under the ROC curve (chance scores 0.5, not 0).

    Its signals are read as ``2 * AUC - 1`` (the Gini coefficient: 0 at chance, 1 perfect),
    on the scale of the F1-like scores whose trivial predictor scores 0. An area under the
    precision-recall curve (``pr_auc``, ``auc_pr``) is not: its chance level is the positive
    rate.
    """
    tok = _tokens(name)
    return bool(tok & _RANKING) and not tok & _PR
# regression errors: (short names, the words of the long name)
_ERRORS = {"rmse": ({"rmse"}, {"root", "mean", "squared", "error"}),
           "mae": ({"mae"}, {"mean", "absolute", "error"}),
           "mse": ({"mse"}, {"mean", "squared", "error"})}
_R2 = {"r2", "rsquared", "r2score"}  # the coefficient of determination: 1 - MSE / variance
_ERROR_VARIANTS = {"percentage", "percent", "logarithmic", "log", "scaled", "relative", "msle",
                   "mape"}  # another error than the constant-predictor baseline is for


def metric_role(name: str) -> tuple[str, str] | None:
    """Classify a metric name as ``(split, kind)``.

    ``split`` is ``"train"`` or ``"val"``; ``kind`` is ``"loss"``, ``"acc"`` or ``"f1"`` (F1 and
    other class-balanced scores), a regression error: ``"mae"``, ``"mse"``, ``"rmse"``, or
    ``"r2"`` (the coefficient of determination).
    Returns None for anything else (learning rate, time, ...).
    """
    tok = _tokens(name)
    joined = name.lower()
    split = "val" if tok & _VAL or joined.startswith("val") else "train"
    if "loss" in tok or any(t.endswith("loss") for t in tok):
        return split, "loss"
    if tok & _ACC or any(t.endswith("acc") or t.endswith("accuracy") for t in tok):
        return split, "acc"
    if tok & _F1 or any(t.endswith("f1") for t in tok):
        return split, "f1"
    words = tok - _VAL - {"train", "training"}
    if words & _R2 or words == {"r", "squared"}:
        return split, "r2"
    for kind, names in _ERRORS.items():
        if words & names[0] and not words & _ERROR_VARIANTS or words == names[1]:
            return split, kind
    return None


# where metric values come from, most direct first (``metric`` events' ``source``)
METRIC_SOURCES = ("trainer", "keras", "tensorboard", "log", "stdout", "auto")
_SOURCE_RANK = {s: i for i, s in enumerate(METRIC_SOURCES)}

# Under a trainer: the user's lines that stand for what the trainer's loop did, in order of
# preference (kinds of ``ref`` events; see ``capture/torch_trainers.py``)
TRAINER_REFS = {
    "lightning": {"backward": ("training_step",), "loss_fn": ("training_step",),
                  "step": ("optimizer", "configure_optimizers"),
                  "optimizer": ("configure_optimizers",),
                  # (manual optimisation: the user's ``opt.step()`` is where clearing belongs)
                  "zero_grad": ("step", "training_step")},
    "transformers": {"backward": ("trainer_args", "trainer"),
                     "step": ("trainer_args", "trainer"),
                     "optimizer": ("trainer_args", "trainer"),
                     "loss_fn": ("model", "trainer")},
}


@dataclass
class Run:
    """Everything one captured run recorded, loaded from its JSON-lines stream.

    Attributes
    ----------
    events : list of dict
        The raw events in order (``start``, ``step``, ``metric``, ``nonfinite``, ``ref``, ...).
    bad_lines : int
        Lines of the record that could not be read (not JSON, not an event) and were skipped;
        every other line is kept.
    truncated : bool
        The last line was cut short (the process was killed while writing it); not counted
        in ``bad_lines``.
    ranks : list of Run
        A multi-process job's records, one per process that trained (rank order); the job's
        own events are then those of its representative rank (:mod:`model_debugger.ranks`).
    rank : dict or None
        In a rank's record: its ``rank`` event's fields (rank, world size, backend, ...).
    """

    events: list[dict] = field(default_factory=list)
    bad_lines: int = 0
    truncated: bool = False
    ranks: list = field(default_factory=list, repr=False, compare=False)
    rank: dict | None = None

    @classmethod
    def load(cls, path: str) -> Run:
        """Read a record; unreadable lines are skipped and counted, never the rest.

        A last line without its newline that does not parse is a write cut short by a killed
        process (``truncated``); any other line that is not a JSON object counts in
        ``bad_lines``.
        """
        with open(path, encoding="utf-8", errors="replace") as fh:
            return cls._parse(fh)

    @classmethod
    def parse(cls, data: str | bytes) -> Run:
        """A record from its text or bytes (read once, e.g. through ``safe_write.read_inside``).

        Parsed line by line exactly as :meth:`load` reads the file.
        """
        if isinstance(data, bytes):
            data = data.decode("utf-8", errors="replace")
        return cls._parse(io.StringIO(data, newline=None))

    @classmethod
    def _parse(cls, lines) -> Run:
        events, bad, truncated = [], 0, False
        for raw in lines:
            line = raw.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                event = None
            if isinstance(event, dict):
                events.append(event)
            elif raw.endswith("\n"):
                bad += 1
            else:
                truncated = True
        return cls(events, bad, truncated)

    def of(self, kind: str) -> list[dict]:
        """All events of one kind."""
        return [e for e in self.events if e.get("t") == kind]

    def first(self, kind: str) -> dict | None:
        """The first event of one kind, or None."""
        return next((e for e in self.events if e.get("t") == kind), None)

    @property
    def steps(self) -> list[dict]:
        """The ``step`` events: one per optimizer step."""
        return self.of("step")

    @property
    def error(self) -> dict | None:
        """The ``error`` event that ended the run, or None."""
        return self.first("error")

    @property
    def ended(self) -> bool:
        """False when the process died before the capture could close the record."""
        return self.first("end") is not None

    def series(self, key: str) -> np.ndarray:
        """A per-step array (``loss``, ``gn``, ``dt``, ``dw``, ``rss``, ``ur``), NaN where missing."""
        return np.array([as_float(s.get(key)) for s in self.steps], dtype=float)

    def module_norms(self) -> tuple[list[str], np.ndarray]:
        """Module names (first-seen order) and a steps x modules array of gradient norms."""
        names: list[str] = []
        for s in self.steps:
            for k in s.get("mgn", {}):
                if k not in names:
                    names.append(k)
        arr = np.full((len(self.steps), len(names)), np.nan)
        index = {n: i for i, n in enumerate(names)}
        for r, s in enumerate(self.steps):
            for k, v in s.get("mgn", {}).items():
                arr[r, index[k]] = as_float(v)
        return names, arr

    def metrics(self) -> dict[str, list[tuple[int, int, float]]]:
        """``{name: [(step, epoch, value), ...]}``, each name from its most direct source.

        One quantity can be seen twice (an HF log dict through the trainer's callback and
        printed on stdout; a validation loss logged and computed under ``no_grad``): the
        points of a name come from one source only, the first of :data:`METRIC_SOURCES`.
        """
        best: dict[str, int] = {}
        for e in self.of("metric"):
            rank = _SOURCE_RANK.get(e.get("source"), len(METRIC_SOURCES))
            best[e["name"]] = min(rank, best.get(e["name"], rank))
        out: dict[str, list] = {}
        for e in self.of("metric"):
            if _SOURCE_RANK.get(e.get("source"), len(METRIC_SOURCES)) == best[e["name"]]:
                out.setdefault(e["name"], []).append((e.get("step", 0), e.get("epoch", 0),
                                                      as_float(e["value"])))
        return out

    def metric_by_role(self, split: str, kind: str) -> tuple[str, np.ndarray] | None:
        """The best-matching metric series for a role, one value per epoch when epochs exist.

        User-reported metrics win over ``auto`` ones (validation losses seen under no_grad).
        """
        metrics = self.metrics()
        sources: dict[str, str] = {}
        for e in self.of("metric"):  # each name's most direct source (the one metrics() kept)
            src = e.get("source")
            old = sources.get(e["name"])
            if old is None or _SOURCE_RANK.get(src, 99) < _SOURCE_RANK.get(old, 99):
                sources[e["name"]] = src
        names = [n for n in metrics if metric_role(n) == (split, kind)]
        if not names:
            return None
        # a single printed value does not outrank a curve (a progress bar's last frame)
        names.sort(key=lambda n: (len(metrics[n]) < 2, sources.get(n) == "auto",
                                  -len(metrics[n]), _balanced_rank(n) if kind == "f1" else 0, n))
        name = names[0]
        return name, _per_epoch(metrics[name])

    def refs(self) -> dict[str, dict]:
        """First code reference of each kind: ``{"backward": {"file", "line"}, ...}``.

        Under a trainer (a ``trainer`` event), what the trainer did for the user was seen at
        the ``trainer.fit(...)`` / ``trainer.train()`` line; such a reference points at the
        user's line that decides it instead (:data:`TRAINER_REFS`).
        """
        out: dict[str, dict] = {}
        for e in self.of("ref"):
            out.setdefault(e["kind"], {"file": e["file"], "line": e["line"]})
        trainer = self.first("trainer")
        fit = (trainer or {}).get("fit")
        if fit:
            where = (fit.get("file"), fit.get("line"))
            for kind, instead in TRAINER_REFS.get(trainer.get("kind"), {}).items():
                ref = out.get(kind)
                if ref is not None and (ref["file"], ref["line"]) == where:
                    better = next((out[k] for k in instead if k in out and
                                   (out[k]["file"], out[k]["line"]) != where), None)
                    if better is not None:
                        out[kind] = {**better, "via": "trainer"}
        return out

    @property
    def epochs(self) -> int:
        """Epochs observed: DataLoader re-iterations, or epochs named by metrics."""
        seen = [s.get("ep", 0) for s in self.steps] + [e.get("epoch", 0) for e in self.of("epoch")]
        seen += [e.get("epoch") or 0 for e in self.of("metric")]
        return (max(seen) + 1) if (self.steps or self.of("metric")) and seen else 0

    @property
    def seconds(self) -> float:
        """Wall time of the run: the ``end`` event's, else the sum of the step times."""
        end = self.first("end")
        if end is not None:
            return float(end.get("seconds", 0.0))
        return float(np.nansum(self.series("dt"))) if self.steps else 0.0


def _per_epoch(points: list[tuple[int, int, float]]) -> np.ndarray:
    """Collapse a metric to its last value per epoch when it was reported several times per epoch."""
    epochs = [p[1] for p in points]
    if len(set(epochs)) > 1 and len(set(epochs)) < len(points):
        last: dict[int, float] = {}
        for _, ep, v in points:
            last[ep] = v
        return np.array([last[k] for k in sorted(last)], dtype=float)
    return np.array([p[2] for p in points], dtype=float)


PLANNED_STOPS = ("TimeLimit", "StepBudget")  # how a record names a planned stop (error ``type``)
REPRODUCE_STATUSES = ("reproduced", "not_reproduced", "crashed", "interrupted", "not_observed")
VERDICTS = ("resolved", "partially_resolved", "not_resolved")
ARTIFACT_KINDS = ("script", "cell", "log")


class RecordError(ValueError):
    """A phase result outside the vocabulary, or missing a required field."""


def _check(value, allowed, what: str, optional: bool = False):
    if value is None and optional:
        return value
    if value not in allowed:
        raise RecordError(f"unknown {what} {value!r} (expected one of: {', '.join(allowed)})")
    return value


def _split(cls, data: dict) -> tuple[dict, dict]:
    """``data`` as the dataclass's fields and the rest (kept, never dropped)."""
    if not isinstance(data, dict):
        raise RecordError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
    names = {f.name for f in fields(cls)} - {"extra"}
    return {k: v for k, v in data.items() if k in names}, \
        {k: v for k, v in data.items() if k not in names}


def _build(cls, known: dict, extra: dict):
    try:
        return cls(**known, extra=extra)
    except TypeError as exc:  # a required field is missing
        raise RecordError(f"{cls.__name__}: {exc}") from None


def _to_json(record) -> dict:
    out = {}
    for f in fields(record):
        if f.name == "extra":
            continue
        v = getattr(record, f.name)
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return {**out, **record.extra}


@dataclass(frozen=True)
class Evidence:
    """One number a classification rule used."""

    signal: str
    value: float | str
    detail: str

    def to_json(self) -> dict:
        """The evidence as JSON (a non-finite value as its text)."""
        v = self.value
        if isinstance(v, float):
            v = v if math.isfinite(v) else str(v)
        return {"signal": self.signal, "value": v, "detail": self.detail}


@dataclass(frozen=True)
class Classification:
    """The primary category, ranked secondaries, and the numbers behind them."""

    primary: str
    secondary: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()

    def __post_init__(self) -> None:
        _check(self.primary, (*CATEGORIES, HEALTHY), "category")
        for c in self.secondary:
            _check(c, CATEGORIES, "secondary category")

    def to_json(self) -> dict:
        """The classification as JSON."""
        return {"primary": self.primary, "secondary": list(self.secondary),
                "evidence": [e.to_json() for e in self.evidence]}

    @classmethod
    def from_json(cls, data: dict) -> Classification:
        """The classification from its JSON (raises RecordError outside the vocabulary)."""
        return cls(data["primary"], tuple(data.get("secondary", ())),
                   tuple(Evidence(**e) for e in data.get("evidence", ())))


@dataclass(frozen=True)
class Finding:
    """A root-cause hypothesis from a probe; ``confirmed`` only when a measurement supports it."""

    check: str
    root_cause: str
    confirmed: bool
    explanation: str
    location: dict | None = None
    evidence: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.check, str) or not self.check:
            raise RecordError(f"a finding needs a check id, not {self.check!r}")
        _check(self.root_cause, ROOT_CAUSES, "root cause")

    @property
    def category(self) -> str | None:
        """The category this finding explains (set by the probe runner)."""
        return (self.evidence or {}).get("category")

    def to_json(self) -> dict:
        """The finding as JSON, every field."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Finding:
        """The finding from its JSON (raises RecordError outside the vocabulary)."""
        return cls(**data)


@dataclass(frozen=True)
class ArtifactInfo:
    """What the session reproduces: a script (child process), a notebook cell, or a log.

    Attributes
    ----------
    type : str
        ``"script"``, ``"cell"`` or ``"log"``.
    script : str or None
        The user's script (absolute path) of a script session.
    copy : str
        The session's copy of the reproduced code or log, relative to the session folder.
    """

    type: str
    script: str | None = None
    args: tuple[str, ...] = ()
    seed: int | None = None
    max_seconds: float | None = None
    cwd: str | None = None
    copy: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(self.type, ARTIFACT_KINDS, "artifact type")

    def to_json(self) -> dict:
        """The artifact event's fields as JSON, recorded extras included."""
        return _to_json(self)

    @classmethod
    def from_json(cls, data: dict) -> ArtifactInfo:
        """The artifact from its JSON (keys it does not know are kept as extras)."""
        known, extra = _split(cls, data)
        known["args"] = tuple(known.get("args") or ())
        return _build(cls, known, extra)


@dataclass(frozen=True)
class Reproduction:
    """Reproduce's verdict over all runs (``summary``: "reproduced 2/3").

    Attributes
    ----------
    status : str
        One of :data:`REPRODUCE_STATUSES`.
    problem : str or None
        The category most runs showed (None when no run showed one).
    runs : dict
        ``{"total", "reproduced", "categories"}``.
    """

    status: str
    summary: str = ""
    problem: str | None = None
    runs: dict = field(default_factory=dict)
    steps: int = 0
    reason: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(self.status, REPRODUCE_STATUSES, "reproduce status")
        _check(self.problem, CATEGORIES, "category", optional=True)

    def get(self, key: str, default=None):
        """A field or a recorded extra by name (the report's JSON keys)."""
        return self.to_json().get(key, default)

    def to_json(self) -> dict:
        """The verdict as JSON, recorded extras included."""
        out = _to_json(self)
        if out["reason"] is None:
            del out["reason"]
        return out

    @classmethod
    def from_json(cls, data: dict) -> Reproduction:
        """The verdict from its JSON (raises RecordError outside the vocabulary)."""
        known, extra = _split(cls, data)
        return _build(cls, known, extra)


@dataclass(frozen=True)
class FixPlan:
    """One change for the current confirmed finding (``approved`` once recorded as approved).

    Attributes
    ----------
    finding : str
        The check id of the finding it addresses.
    diff : str
        The unified diff against the session's current code.
    source : str or None
        The fixed code (kept in the plan until it is approved; then in ``copy``).
    copy : str or None
        The approved fix's code in the session folder (``fixes/<n>.py``).
    """

    finding: str
    root_cause: str
    category: str | None = None
    location: dict | None = None
    diff: str = ""
    hunks: tuple = ()
    touches: tuple[str, ...] = ()
    suggestion: str = ""
    expected: str = ""
    overrides: tuple[str, ...] = ()
    fixed: str | None = None
    source: str | None = None
    copy: str | None = None
    approved: bool = False
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.finding, str) or not self.finding:
            raise RecordError(f"a fix plan needs the finding it addresses, not {self.finding!r}")
        _check(self.root_cause, ROOT_CAUSES, "root cause")
        _check(self.category, CATEGORIES, "category", optional=True)

    def get(self, key: str, default=None):
        """A field or a recorded extra by name (the report's JSON keys)."""
        return self.to_json().get(key, default)

    def __getitem__(self, key: str):
        return self.to_json()[key]

    def to_json(self) -> dict:
        """The plan as JSON, recorded extras included."""
        out = _to_json(self)
        if out["source"] is None:
            del out["source"]
        if out["copy"] is None:
            del out["copy"]
        return out

    @classmethod
    def from_json(cls, data: dict) -> FixPlan:
        """The plan from its JSON (raises RecordError outside the vocabulary)."""
        known, extra = _split(cls, data)
        for k in ("hunks", "touches", "overrides"):
            known[k] = tuple(known.get(k) or ())
        return _build(cls, known, extra)


@dataclass(frozen=True)
class Verification:
    """Verify's verdict on one approved fix, over seeds.

    Attributes
    ----------
    verdict : str
        One of :data:`VERDICTS`.
    category : str
        The category judged; ``metric`` is its defining signal, compared before and after.
    records : dict
        ``{"before": {seed: record}, "after": {seed: record}}``, records relative to the
        session folder: which run each side's numbers came from (a reused reproduction run or
        a new one).
    """

    verdict: str
    category: str | None = None
    finding: str | None = None
    metric: str | None = None
    seeds: tuple[int, ...] = ()
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    remaining: tuple[str, ...] = ()
    remaining_symptom: str | None = None
    records: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(self.verdict, VERDICTS, "verdict")
        _check(self.category, CATEGORIES, "category", optional=True)
        for c in self.remaining:
            _check(c, CATEGORIES, "remaining category")

    def get(self, key: str, default=None):
        """A field or a recorded extra by name (the report's JSON keys)."""
        return self.to_json().get(key, default)

    def __getitem__(self, key: str):
        return self.to_json()[key]

    def to_json(self) -> dict:
        """The verification as JSON, recorded extras included."""
        return _to_json(self)

    @classmethod
    def from_json(cls, data: dict) -> Verification:
        """The verification from its JSON (raises RecordError outside the vocabulary)."""
        known, extra = _split(cls, data)
        known["seeds"] = tuple(known.get("seeds") or ())
        known["remaining"] = tuple(known.get("remaining") or ())
        return _build(cls, known, extra)


@dataclass(frozen=True)
class Intervention:
    """One change installed in a re-run (the user's code is never edited).

    ``id`` names an entry of :data:`model_debugger.interventions.INTERVENTIONS`; ``params`` are
    its arguments (JSON). Isolate re-runs the artifact with one intervention per hypothesis.
    """

    id: str
    params: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """The intervention as JSON: ``{"id", "params"}``."""
        return {"id": self.id, "params": dict(self.params)}

    @classmethod
    def from_json(cls, data: dict | str) -> Intervention:
        """The intervention from its JSON, as a dict or as text."""
        data = json.loads(data) if isinstance(data, str) else data
        return cls(str(data["id"]), dict(data.get("params") or {}))
