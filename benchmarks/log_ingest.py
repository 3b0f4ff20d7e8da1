"""Log ingestion cost against the number of columns: ``load_log`` and the whole ``diagnose``.

Run: ``python benchmarks/log_ingest.py [COLUMNS ...]`` (default: 500 1000 2000 5000).
For each width it writes a CSV of 20 rows (``step``, ``loss`` and that many metric columns),
then times ``load_log`` in this process and ``diagnose_log`` (read, classify, isolate, save).
Linear ingestion shows as a per-column cost that stays flat as the width grows.
"""

from __future__ import annotations

import csv
import os
import sys
import tempfile
import time

from model_debugger.diagnose import diagnose_log
from model_debugger.logs import load_log

ROWS = 20


def write(path: str, columns: int) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["step", "loss"] + [f"metric_{i}" for i in range(columns)])
        for r in range(ROWS):
            w.writerow([r, f"{1 / (r + 1):.6g}"] + [f"{r * 0.1:.3g}"] * columns)


def main(widths: list[int]) -> None:
    print(f"{'columns':>8} {'load s':>8} {'us/col':>8} {'diagnose s':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in widths:
            path = os.path.join(tmp, f"wide{n}.csv")
            write(path, n)
            t0 = time.perf_counter()
            load_log(path)
            load = time.perf_counter() - t0
            t0 = time.perf_counter()
            diagnose_log(path, root=os.path.join(tmp, "sessions"))
            whole = time.perf_counter() - t0
            print(f"{n:>8} {load:>8.3f} {1e6 * load / n:>8.1f} {whole:>11.3f}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [500, 1000, 2000, 5000])
