"""One set of checks for every flag, magic argument and API value, and a script pre-flight.

Each ``check_*`` function returns the value (converted: a string becomes an ``int``/``float``)
or raises :class:`ValueError` with one line that names the flag and the allowed range. The
:func:`arg` wrapper turns a check into an ``argparse`` ``type=`` callable (raising
``argparse.ArgumentTypeError`` with the same text), so the CLI and the magics (whose parser
turns it into a ``UsageError``) say the same thing. :func:`check_script` refuses a script that
cannot run (missing, a folder, binary, not UTF-8, empty, a syntax error) before any session
exists. Nothing here imports torch or tensorflow.
"""

from __future__ import annotations

import argparse
import ast
import math
import os
import tokenize
from collections.abc import Callable

SEED_LIMIT = 2 ** 32  # numpy's legacy seeding (np.random.seed) takes 0 <= seed < 2**32
MAX_RUNS = 100
MAX_SECONDS = 1e7  # ~115 days; setitimer refuses much more on common platforms

__all__ = ["SEED_LIMIT", "MAX_RUNS", "MAX_SECONDS", "arg", "check_seed", "check_seeds",
           "check_count", "check_seconds", "check_budget", "check_probe_ids", "check_script",
           "check_run_args"]


def _shown(value) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _int(value, what: str, rule: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{what} must be {rule} (got {_shown(value)})")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip(), 10)
        except ValueError:
            pass
    raise ValueError(f"{what} must be {rule} (got {_shown(value)})")


def _float(value, what: str, rule: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{what} must be {rule} (got {_shown(value)})")
    try:
        x = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{what} must be {rule} (got {_shown(value)})") from None
    if not math.isfinite(x):
        raise ValueError(f"{what} must be {rule} (got {_shown(value)})")
    return x


def check_seed(value, what: str = "--seed", runs: int = 1):
    """A seed: an integer with ``0 <= seed < 2**32`` (and ``seed + runs - 1`` too).

    ``None`` (no seed) passes through.
    """
    if value is None:
        return None
    rule = "an integer with 0 <= seed < 2**32"
    seed = _int(value, what, rule)
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"{what} must be {rule} (got {_shown(value)})")
    if seed + runs - 1 >= SEED_LIMIT:
        raise ValueError(f"{what} must be {rule}; with {runs} runs the last seed would be "
                         f"{seed + runs - 1} (use a smaller seed)")
    return seed


def check_seeds(values, what: str = "seeds") -> list[int]:
    """A non-empty list of seeds, each ``0 <= seed < 2**32``, at most ``MAX_RUNS`` of them."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"{what} must be a list of integers with 0 <= seed < 2**32 "
                         f"(got {_shown(values)})")
    seeds = [check_seed(v, f"each of {what}") for v in values]
    if not 1 <= len(seeds) <= MAX_RUNS:
        raise ValueError(f"{what} must hold 1..{MAX_RUNS} seeds (got {len(seeds)})")
    return seeds


def check_count(value, what: str = "--runs", low: int = 1, high: int = MAX_RUNS) -> int:
    """A whole count with ``low <= value <= high`` (runs, seeds)."""
    rule = f"an integer from {low} to {high}"
    n = _int(value, what, rule)
    if not low <= n <= high:
        raise ValueError(f"{what} must be {rule} (got {_shown(value)})")
    return n


def check_seconds(value, what: str = "--max-seconds"):
    """A time limit: a finite number of seconds ``> 0`` (at most ``MAX_SECONDS``); None passes."""
    if value is None:
        return None
    rule = f"a finite number of seconds > 0 (at most {MAX_SECONDS:g})"
    x = _float(value, what, rule)
    if not 0 < x <= MAX_SECONDS:
        raise ValueError(f"{what} must be {rule} (got {_shown(value)})")
    return x


def check_budget(value, what: str = "--budget") -> float:
    """A time budget: a finite number of seconds ``>= 0`` (0 runs nothing that costs time)."""
    rule = f"a finite number of seconds >= 0 (at most {MAX_SECONDS:g})"
    x = _float(value, what, rule)
    if not 0 <= x <= MAX_SECONDS:
        raise ValueError(f"{what} must be {rule} (got {_shown(value)})")
    return x


def check_probe_ids(ids, what: str = "--probe"):
    """Known probe ids (None: the probes for the category); an unknown id names the known ones."""
    if ids is None:
        return None
    from .probes.base import PROBES

    if not ids:
        raise ValueError(f"{what} needs at least one probe id (known: {', '.join(sorted(PROBES))})")
    unknown = [i for i in ids if i not in PROBES]
    if unknown:
        raise ValueError(f"{what}: unknown probe id {_shown(unknown[0])} "
                         f"(known: {', '.join(sorted(PROBES))})")
    return list(dict.fromkeys(ids))


def check_path(value, what: str = "--root") -> str:
    """A non-empty path without NUL characters."""
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise ValueError(f"{what} must be a non-empty path (got {_shown(value)})")
    return value


def arg(check: Callable, *args) -> Callable[[str], object]:
    """An ``argparse`` ``type=`` callable running ``check(text, *args)``."""

    def convert(text: str):
        try:
            return check(text, *args)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(_without_flag(str(exc), args)) from None

    convert.__name__ = check.__name__.replace("check_", "")  # argparse names it in errors
    return convert


def _without_flag(message: str, args: tuple) -> str:
    """``message`` without its leading flag: argparse already prefixes ``argument --flag:``."""
    flag = next((a for a in args if isinstance(a, str)), None)
    if flag and message.startswith(flag + " "):
        return message[len(flag) + 1:]
    return message


def check_script(path: str) -> str:
    """Refuse a training script that cannot run, before any session is created.

    Parameters
    ----------
    path : str
        The script.

    Returns
    -------
    str
        The script's source text.

    Raises
    ------
    ValueError
        One line naming the file and what is wrong: missing, a folder, binary, not UTF-8 (or
        not its declared ``# coding``), empty, or a syntax error (with its line).
    """
    name = os.path.basename(path) or path
    if not os.path.exists(path):
        raise ValueError(f"no such file: {path}")
    if os.path.isdir(path):
        raise ValueError(f"{path} is a folder, not a script or a log")
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ValueError(f"{name}: cannot read the script ({exc.strerror or exc})") from None
    if b"\0" in data:
        raise ValueError(f"{name}: a binary file (NUL bytes), not a Python script")
    encoding = "utf-8"
    try:
        encoding, _ = tokenize.detect_encoding(iter(data.splitlines(True)).__next__)
        source = data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise _not_text(name, data, exc, encoding) from None
    except (SyntaxError, LookupError) as exc:  # an undecodable first line, or a bad cookie
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as bad:
            raise _not_text(name, data, bad, "utf-8") from None
        raise ValueError(f"{name}: bad source encoding ({_one_line(exc)})") from None
    syntax_error(source, name, raise_=True)
    if not ast.parse(source).body:
        raise ValueError(f"{name}: the script is empty (no code to run)")
    return source


def _not_text(name: str, data: bytes, exc: UnicodeDecodeError, encoding: str) -> ValueError:
    return ValueError(f"{name}: not {encoding} text (byte 0x{data[exc.start]:02x} at offset "
                      f"{exc.start}); save the script as UTF-8")


def syntax_error(source: str, name: str = "the code", raise_: bool = False) -> str | None:
    """``"NAME: syntax error at line N: MESSAGE"`` for code that does not compile, else None."""
    try:
        compile(source, name, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes in a str
        line = getattr(exc, "lineno", None)
        where = f" at line {line}" if line else ""
        msg = getattr(exc, "msg", None) or _one_line(exc)
        text = f"{name}: syntax error{where}: {_one_line(msg)}"
        if raise_:
            raise ValueError(text) from None
        return text
    return None


def _one_line(value) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= 200 else text[:197] + "..."


def check_run_args(script: str, runs: int = 1, seed=None, max_seconds=None,
                   probe_seconds=30.0) -> tuple:
    """Everything ``diagnose_script`` is given, checked.

    Returns
    -------
    tuple
        ``(runs, seed, max_seconds, probe_seconds)``, converted.

    Raises
    ------
    ValueError
        For the first value out of range, or a script that cannot run.
    """
    runs = check_count(runs, "runs")
    out = (runs, check_seed(seed, "seed", runs), check_seconds(max_seconds, "max_seconds"),
           check_budget(probe_seconds, "probe_seconds"))
    check_script(script)
    return out
