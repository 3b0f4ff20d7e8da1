"""Scripts run in a child process under capture: crashes, kills, time limits, arguments, seeds.

Each case writes a small real training script, runs it with ``runner.run_script`` and reads the
record the child streamed to disk. A child spends seconds importing torch, so every case starts at
once (a module fixture) and each test waits for its own.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("torch")

from model_debugger.records import Run  # noqa: E402
from model_debugger.runner import run_script  # noqa: E402

pytestmark = pytest.mark.slow

TRAIN = """\
import sys
import time

import torch
from torch import nn

model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)


def train_step():
    opt.zero_grad()
    x = torch.randn(16, 4)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    loss.backward()
    opt.step()
    return loss.item()
"""

CRASH = """
for _ in range(5):
    train_step()
raise ValueError("bad batch shape")  # <crash>
"""

ENDLESS = """
while True:
    train_step()
    time.sleep(0.005)
"""

SEEDED = """
import json
from torch.utils.data import DataLoader, TensorDataset
json.dump(sys.argv, open(sys.argv[-1], "w"))
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
for _ in range(int(sys.argv[sys.argv.index("--epochs") + 1])):
    for xb, yb in DataLoader(data, batch_size=16, shuffle=True):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
"""

# no torch here: the time limit must not depend on how long importing torch takes
PRINTING = """\
import itertools
import time

for i in itertools.count():
    print(f"step {i}: loss={1 / (i + 1):.4f}")
    time.sleep(0.02)
"""

MAX_SECONDS = 3


def write_script(folder, body: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train.py"
    path.write_text(TRAIN + textwrap.dedent(body), encoding="utf-8")
    return str(path)


def line_of(path: str, marker: str) -> int:
    with open(path, encoding="utf-8") as fh:
        (line,) = [i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# <{marker}>")]
    return line


def run(folder, body: str, args=(), **kwargs) -> dict:
    script = write_script(folder, body)
    record = str(folder / "record.jsonl")
    with open(folder / "output.txt", "w", encoding="utf-8") as out:
        result = run_script(script, list(args), record, stdout=out, **kwargs)
    return {"script": script, "result": result, "run": Run.load(record),
            "output": (folder / "output.txt").read_text(encoding="utf-8")}


def run_printing(folder, **kwargs) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(PRINTING, encoding="utf-8")
    record = str(folder / "record.jsonl")
    with open(folder / "output.txt", "w", encoding="utf-8") as out:
        result = run_script(str(folder / "train.py"), [], record, stdout=out, **kwargs)
    return {"result": result, "run": Run.load(record)}


def run_and_kill(folder) -> dict:
    """Run an endless script and SIGKILL it from here once its record holds 5 steps."""
    script = write_script(folder, ENDLESS)
    record = folder / "record.jsonl"
    box = {}

    def target():
        with open(os.devnull, "w") as out:
            box["result"] = run_script(script, [], str(record), stdout=out)

    thread = threading.Thread(target=target)
    thread.start()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and thread.is_alive():
            if record.exists() and len(Run.load(str(record)).steps) >= 5:
                break
            time.sleep(0.05)
        pid = Run.load(str(record)).first("start")["pid"]
        os.kill(pid, signal.SIGKILL)  # like the kernel's OOM killer: no cleanup at all
    finally:
        thread.join(timeout=90)
    return {"script": script, "result": box["result"], "record": str(record)}


def seeded(folder) -> dict:
    args = ["--epochs", "2", "--record", "not ours", "--seed", "7", "a b",
            str(folder / "argv.json")]
    out = run(folder, SEEDED, args, seed=3)
    out["args"] = args
    return out


@pytest.fixture(scope="module")
def children(tmp_path_factory):
    root = tmp_path_factory.mktemp("children")
    with ThreadPoolExecutor(max_workers=5) as pool:
        futures = {
            "crash": pool.submit(run, root / "crash", CRASH),
            "killed": pool.submit(run_and_kill, root / "killed"),
            "timeout": pool.submit(run_printing, root / "timeout", max_seconds=MAX_SECONDS),
            "seed_a": pool.submit(seeded, root / "seed_a"),
            "seed_b": pool.submit(seeded, root / "seed_b"),
        }
        yield {name: f for name, f in futures.items()}


def test_crashing_script_keeps_steps_and_error_location(children):
    case = children["crash"].result(timeout=180)
    script, result, rec = case["script"], case["result"], case["run"]
    assert result.returncode == 1 and not result.timed_out
    assert [s["i"] for s in rec.steps] == [0, 1, 2, 3, 4]
    err = rec.error
    assert err["kind"] == "exception" and err["type"] == "ValueError"
    assert err["message"] == "bad batch shape" and err["step"] == 5
    assert os.path.samefile(err["location"]["file"], script)
    assert err["location"]["line"] == line_of(script, "crash")
    assert rec.ended and rec.first("end")["status"] == "exception"
    assert "ValueError: bad batch shape" in case["output"]


def test_sigkilled_script_leaves_a_readable_partial_record(children):
    case = children["killed"].result(timeout=180)
    record = case["record"]
    assert case["result"].returncode == -signal.SIGKILL
    rec = Run.load(record)
    assert not rec.ended and rec.error is None
    n = len(rec.steps)
    assert n >= 5 and [s["i"] for s in rec.steps] == list(range(n))
    assert all(isinstance(s["loss"], float) for s in rec.steps)
    # a line cut short by the kill is ignored, the steps before it are kept
    with open(record, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"t": "step", "i": n, "loss": 0.12})[:-7])
    assert len(Run.load(record).steps) == n


def test_max_seconds_stops_an_endless_script(children):
    case = children["timeout"].result(timeout=180)
    result, rec = case["result"], case["run"]
    # stopped as interrupted (by the child's own timer or the runner's SIGTERM), not killed
    assert result.returncode == 130
    assert MAX_SECONDS <= result.seconds < MAX_SECONDS + 20
    losses = [e["value"] for e in rec.of("metric") if e["name"] == "loss"]
    assert len(losses) > 10  # what the script printed before the limit is in the record
    assert losses[:3] == [1.0, 0.5, 0.3333]
    assert rec.error["kind"] == "interrupted" and "time limit" in rec.error["message"]
    assert rec.ended and rec.events[-1]["t"] == "end"
    assert rec.events[-1]["status"] == "interrupted"


def test_arguments_are_passed_and_seed_makes_runs_identical(children):
    losses = {}
    for name in ("seed_a", "seed_b"):
        case = children[name].result(timeout=180)
        args, result, rec = case["args"], case["result"], case["run"]
        assert result.returncode == 0, case["output"]
        with open(args[-1], encoding="utf-8") as fh:
            argv = json.load(fh)
        assert argv[1:] == args and os.path.samefile(argv[0], case["script"])
        assert rec.first("start")["argv"] == argv
        assert rec.error is None and rec.first("end")["status"] == "ok"
        losses[name] = [s["loss"] for s in rec.steps]
    assert len(losses["seed_a"]) == 8 and len(set(losses["seed_a"])) == 8
    assert losses["seed_a"] == losses["seed_b"]
