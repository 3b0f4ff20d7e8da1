"""Source edits by position, and the mutant they make (with the changed and expected lines).

An operator builds a list of :class:`Edit` (offsets into the base's source, from AST
positions) and marks one as the *change* (the line recorded as changed) and one as the
*location* (the line that makes the faulty object, where a diagnosis should point). Line numbers
are computed in the mutated source after every edit is applied.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

CATEGORIES = ("loss_not_decreasing", "overfitting", "gradient_instability", "memory_issue",
              "performance_issue", "convergence_to_wrong_solution")
ROOT_CAUSES = ("hyperparameter", "data", "architecture", "training_loop", "hardware")


@dataclass(frozen=True)
class Edit:
    """Replace ``source[start:end]`` with ``text``.

    Parameters
    ----------
    start, end : int
        Offsets in the original source (``start == end`` inserts).
    text : str
        The replacement.
    change : bool
        This edit's first line is the recorded changed line.
    location : bool
        This edit's first line is the expected location.
    aux : bool
        A supporting edit (an added import): never the change by default.
    """

    start: int
    end: int
    text: str
    change: bool = False
    location: bool = False
    aux: bool = False


@dataclass(frozen=True)
class Mutant:
    """A mutated program and what a diagnosis of it should say.

    Parameters
    ----------
    operator : str
        The operator id.
    source : str
        The mutated program.
    changed_line : int
        1-based line in ``source`` that holds the change.
    expected_line : int
        1-based line in ``source`` that makes the faulty object (the expected location).
    expected_last : int
        The last line of that edit (an inserted block spans several lines; 0: one line).
    category : str
        The expected primary category.
    root_cause : str
        The expected root-cause kind.
    family : str
        The taxonomy family (model, training, data, loop, resources).
    """

    operator: str
    source: str
    changed_line: int
    expected_line: int
    category: str
    root_cause: str
    family: str
    description: str = ""
    expected_last: int = 0
    extra: dict = field(default_factory=dict)

    def meta(self) -> dict:
        """Everything but the source."""
        out = asdict(self)
        out.pop("source")
        return out


def apply_edits(source: str, edits: list[Edit]) -> tuple[str, int, int, int]:
    """Apply non-overlapping edits.

    Returns the new source, the changed line, the location line and the location edit's last
    line.

    Without an edit marked ``change`` the first edit not marked ``aux`` is the change; without one marked
    ``location`` the change is the location.
    """
    if not edits:
        raise ValueError("no edits")
    ordered = sorted(edits, key=lambda e: (e.start, e.end))
    for a, b in zip(ordered, ordered[1:]):
        if b.start < a.end:
            raise ValueError(f"overlapping edits at {a.start}-{a.end} and {b.start}-{b.end}")
    change = next((e for e in edits if e.change), next((e for e in edits if not e.aux), edits[0]))
    location = next((e for e in edits if e.location), change)
    out, pos, starts = [], 0, {}
    new_len = 0
    for e in ordered:
        out.append(source[pos:e.start])
        new_len += e.start - pos
        starts[id(e)] = new_len + (len(e.text) - len(e.text.lstrip("\n")))
        out.append(e.text)
        new_len += len(e.text)
        pos = e.end
    out.append(source[pos:])
    mutated = "".join(out)

    def line_of(e: Edit) -> int:
        return mutated.count("\n", 0, starts[id(e)]) + 1

    first = line_of(location)
    return mutated, line_of(change), first, first + location.text.strip("\n").count("\n")
