"""Multi-rank jobs, rank by rank: real ``torch.distributed`` on gloo, world size 2, on the CPU.

Each job runs through the CLI as a user would: ranks the script starts itself
(``torch.multiprocessing.spawn``, one ``multiprocessing.Process`` per rank) and ranks the real
launcher starts (``--nproc-per-node 2``: ``torch.distributed.run``). Every test asserts the
per-rank records (``reproduce.rank_table``: one row per rank, its own steps and status) and the
verdict: healthy jobs stay healthy; an exploding learning rate, a non-finite batch on one rank, a
straggler, a desync and a hang each get their category and a finding that names the rank and the
line. The rank analysis itself (:mod:`model_debugger.ranks`) is also tested on hand-made records,
so each rule is seen to fail as well as to pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from model_debugger import ranks as R
from model_debugger.records import Run

ENV = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")

# a function per rank, started by torch.multiprocessing.spawn; MODE picks the fault
SPAWN = '''
import os, socket, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

MODE = sys.argv[1]


def train(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    X = torch.randn(256, 8)
    y = X[:, :1] * 2 - X[:, 1:2] + 0.1 * torch.randn(256, 1)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    model = net if MODE == "desync" else DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=4.0 if MODE == "explode" else 0.05)
    for step in range(40):
        i = (step * 32) % 256
        xb, yb = X[i:i + 32], y[i:i + 32]
        if MODE == "nan_on_one" and rank == 1 and step == 15:
            xb = xb.clone()
            xb[3, 2] = float("nan")
        if MODE == "straggler" and rank == 1:
            time.sleep(0.03)  # STRAGGLER LINE
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if MODE == "hang" and rank == 1 and step == 8:
            time.sleep(120)  # HANG LINE
    dist.destroy_process_group()


if __name__ == "__main__":
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(train, args=(2, port), nprocs=2)
'''

# a script per rank, started by the launcher (rank and world from the environment)
LAUNCHED = '''
import sys
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(100 + rank)
X = torch.randn(256, 8)
y = X[:, :1] - X[:, 2:3]
model = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)))
opt = torch.optim.Adam(model.parameters(), lr=float(sys.argv[1]))
for epoch in range(5):
    for i in range(0, 256, 32):
        loss = nn.functional.mse_loss(model(X[i:i + 32]), y[i:i + 32])
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"rank {rank} epoch {epoch} loss={loss.item():.4f}")
dist.destroy_process_group()
'''

# one multiprocessing.Process per rank, gradients averaged by hand with all_reduce
PROCESSES = '''
import os, socket
import multiprocessing as mp
import torch
import torch.distributed as dist
from torch import nn


def worker(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Linear(6, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    X = torch.randn(128, 6, generator=g)
    y = X.sum(1, keepdim=True)
    for step in range(40):
        loss = nn.functional.mse_loss(model(X), y)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    procs = [mp.Process(target=worker, args=(r, 2, port)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
'''


def _diagnose(tmp_path: Path, source: str, *args: str, flags=()) -> dict:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    proc = subprocess.run(
        [sys.executable, "-m", "model_debugger.cli", "diagnose", str(script), "--json",
         "--root", str(tmp_path / "s"), "--probe-seconds", "10", "--max-seconds", "90",
         *flags, "--", *args], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _line(source: str, mark: str) -> int:
    return next(i for i, ln in enumerate(textwrap.dedent(source).splitlines(), 1) if mark in ln)


def _table(report: dict, world: int = 2) -> list[dict]:
    rep = report["reproduce"]
    assert rep["ranks"] == world, rep
    rows = rep["rank_table"]
    assert [r["rank"] for r in rows] == list(range(world))
    assert all(r["world_size"] == world and r["backend"] == "gloo" for r in rows)
    assert len({r["pid"] for r in rows}) == world  # one record per process
    return rows


def _finding(report: dict, check: str) -> dict:
    found = [f for f in report["findings"] if f["check"] == check]
    assert found, [f["check"] for f in report["findings"]]
    return found[0]


# -- healthy jobs stay healthy -----------------------------------------------------------------

def test_a_healthy_spawned_job_is_captured_on_every_rank_and_healthy(tmp_path):
    report = _diagnose(tmp_path, SPAWN, "healthy")
    rows = _table(report)
    assert all(r["steps"] == 40 and r["status"] == "ok" for r in rows), rows
    assert all(r["step_ms"] and r["peak_rss_mb"] for r in rows)
    assert report["classification"]["primary"] == "healthy", report["classification"]
    assert report["reproduce"]["steps"] == 40


def test_a_healthy_torchrun_job_is_launched_rank_by_rank_and_healthy(tmp_path):
    report = _diagnose(tmp_path, LAUNCHED, "0.01", flags=("--nproc-per-node", "2"))
    rows = _table(report)
    assert [r["local_rank"] for r in rows] == [0, 1]  # set by the real launcher
    assert all(r["steps"] == 40 and r["status"] == "ok" for r in rows), rows
    assert report["classification"]["primary"] == "healthy", report["classification"]


def test_a_process_per_rank_with_hand_averaged_gradients_is_healthy(tmp_path):
    report = _diagnose(tmp_path, PROCESSES)
    rows = _table(report)
    assert all(r["steps"] == 40 for r in rows)
    # the all_reduce calls are the job's collectives: timed, not the loop's own work
    assert all(r["last_collective"]["last_called"] == "all_reduce" for r in rows), rows
    assert all(r["last_collective"]["collectives"] == 80 for r in rows), rows
    assert report["classification"]["primary"] == "healthy", report["classification"]


# -- faults ---------------------------------------------------------------------------------------

def test_an_exploding_learning_rate_on_both_ranks_is_gradient_instability(tmp_path):
    report = _diagnose(tmp_path, SPAWN, "explode")
    rows = _table(report)
    assert all(r["first_nonfinite"] is not None for r in rows), rows
    assert report["classification"]["primary"] == "gradient_instability"
    sweep = _finding(report, "lr_range")  # on spawned rank 0's live model, after its script
    assert sweep["confirmed"] and sweep["evidence"]["rank"] == 0
    assert sweep["location"]["line"] == _line(SPAWN, "torch.optim.SGD")


def test_a_nonfinite_batch_on_one_rank_names_that_rank_before_the_all_reduce_spreads_it(
        tmp_path):
    report = _diagnose(tmp_path, SPAWN, "nan_on_one")
    rows = _table(report)
    assert rows[1]["first_nonfinite"]["what"] == "loss"  # where it began
    assert rows[0]["first_nonfinite"]["what"] == "grad"  # what the all-reduce brought rank 0
    cls = report["classification"]
    assert cls["primary"] == "gradient_instability"
    ev = {e["signal"]: e["value"] for e in cls["evidence"]}
    assert ev["nonfinite_rank"] == 1 and ev["first_nonfinite_step"] == 15, ev
    data = _finding(report, "nonfinite_inputs")
    assert data["confirmed"] and data["root_cause"] == "data"
    assert data["evidence"]["rank"] == 1  # measured on rank 1's own kept batches, live
    assert data["evidence"]["rows_checked"] > 0
    # the NaN row is the data's finding: a sweep on rank 1's rows without it does not diverge
    assert not any(f["check"] == "lr_range" and f["confirmed"] for f in report["findings"])


def test_a_straggler_rank_is_a_performance_issue_that_names_it_and_its_line(tmp_path):
    report = _diagnose(tmp_path, SPAWN, "straggler")
    rows = _table(report)
    assert rows[1]["own_ms"] > rows[0]["own_ms"] + 20, rows  # its own work per step
    assert rows[0]["blocked_ms"] > rows[1]["blocked_ms"] + 20, rows  # the victim waits
    cls = report["classification"]
    assert cls["primary"] == "performance_issue"
    assert {e["signal"]: e["value"] for e in cls["evidence"]}["rank_straggler"] == 1
    f = _finding(report, "rank_straggler")
    assert f["confirmed"] and f["root_cause"] == "training_loop"
    assert f["evidence"]["rank"] == 1 and f["evidence"]["victims"] == ["rank 0"]
    assert f["location"]["line"] == _line(SPAWN, "STRAGGLER LINE")
    live = _finding(report, "step_overhead")  # probed on the straggler's own live objects
    assert live["evidence"]["rank"] == 1


def test_replicas_that_drift_apart_are_a_desync(tmp_path):
    report = _diagnose(tmp_path, SPAWN, "desync")
    _table(report)
    cls = report["classification"]
    assert cls["primary"] == "convergence_to_wrong_solution", cls
    f = _finding(report, "rank_desync")
    assert f["confirmed"] and f["root_cause"] == "training_loop"
    assert f["evidence"]["ddp"] is False and f["evidence"]["ranks"] == [1]


def test_a_rank_that_never_joins_ends_the_job_at_the_timeout_with_a_partial_record(tmp_path):
    report = _diagnose(tmp_path, SPAWN, "hang", flags=("--collective-timeout", "3"))
    rows = _table(report)
    assert report["reproduce"]["seconds"] < 60  # bounded by the timeout, not the 120 s sleep
    assert rows[0]["last_collective"]["waiting"] and not rows[1]["last_collective"]["waiting"]
    assert rows[0]["last_collective"]["where"] == "backward", rows  # DDP's all-reduce
    assert all(r["steps"] == 9 for r in rows), rows  # every step up to the hang was kept
    cls = report["classification"]
    assert cls["primary"] == "performance_issue", cls
    ev = {e["signal"]: e["value"] for e in cls["evidence"]}
    assert ev["rank_hang_missing"] == "1" and ev["rank_hang_waiting"] == "0"
    f = _finding(report, "rank_hang")
    assert f["confirmed"] and f["evidence"]["missing"] == [1]
    assert f["location"]["line"] == _line(SPAWN, "HANG LINE")


def test_a_spawned_process_without_a_process_group_is_captured_too(tmp_path):
    report = _diagnose(tmp_path, '''
        import torch
        import torch.multiprocessing as mp
        from torch import nn


        def work(i):
            torch.manual_seed(i)
            model = nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            X = torch.randn(64, 4)
            y = X @ torch.ones(4, 1)
            for _ in range(30):
                loss = nn.functional.mse_loss(model(X), y)
                opt.zero_grad()
                loss.backward()
                opt.step()


        if __name__ == "__main__":
            mp.spawn(work, nprocs=1)
    ''')
    rep = report["reproduce"]
    assert rep["status"] != "not_observed" and rep["steps"] == 30, rep
    assert [r["rank"] for r in rep["rank_table"]] == [None]  # a process, not a rank


# -- the rank analysis on hand-made records -------------------------------------------------------

def _rank_run(rank: int, steps: list[dict], *extra: dict, world: int = 2) -> Run:
    events = [{"t": "start", "pid": 100 + rank},
              {"t": "rank", "rank": rank, "world_size": world, "backend": "gloo"},
              *({"t": "step", "i": i, **s} for i, s in enumerate(steps)), *extra]
    if not any(e.get("t") == "error" for e in extra):
        events.append({"t": "end", "status": "ok"})
    run = Run(events)
    run.rank = {"rank": rank, "world_size": world, "backend": "gloo"}
    return run


def _job(*ranks: Run) -> Run:
    job = Run(list(ranks[0].events))
    job.ranks = list(ranks)
    return job


def _steps(n: int, dt: float, bz: float, fw: float, **more) -> list[dict]:
    return [{"dt": dt, "dw": 0.0, "bz": bz, "fw": fw, "co": 0.0, "loss": 1.0, **more}
            for _ in range(n)]


@pytest.mark.parametrize("extra_ms, fires", [(30.0, True), (0.5, False)])
def test_the_straggler_is_the_rank_with_the_most_own_work(extra_ms, fires):
    e = extra_ms / 1000
    # rank 1 sleeps e in its loop; rank 0 waits e in backward (DDP's all-reduce)
    fast = _rank_run(0, _steps(20, 0.01 + e, 0.008 + e, 0.002))
    slow = _rank_run(1, _steps(20, 0.01 + e, 0.008, 0.002))
    sig = R.signals(_job(fast, slow))
    assert sig["rank_straggler"] == 1
    assert sig["rank_straggler_ms"] == pytest.approx(extra_ms, abs=0.01)
    assert R.is_straggler(sig) is fires
    rows = R.table(_job(fast, slow))
    assert rows[0]["blocked_ms"] == pytest.approx(extra_ms, abs=0.01)
    assert rows[1]["blocked_ms"] == 0


@pytest.mark.parametrize("second, desync", [(5.0, False), (5.001, True)])
def test_a_desync_is_checksums_that_differ(second, desync):
    a = _rank_run(0, [{"pcs": 5.0}, {"pcs": 6.0}])
    b = _rank_run(1, [{"pcs": 5.0}, {"pcs": 6.0 if second == 5.0 else 6.001}])
    sig = R.signals(_job(a, b))
    assert sig["rank_checksums"] == 2
    assert ("rank_desync_step" in sig) is desync
    if desync:
        assert sig["rank_desync_step"] == 1 and sig["rank_desync_ranks"] == [1]


def test_the_first_nonfinite_value_is_ordered_by_step_then_loss_before_gradient():
    a = _rank_run(0, [{}] * 3, {"t": "nonfinite", "step": 2, "what": "grad", "module": "fc"})
    b = _rank_run(1, [{}] * 3, {"t": "nonfinite", "step": 2, "what": "loss", "module": "emb"})
    sig = R.signals(_job(a, b))
    assert sig["nonfinite_rank"] == 1 and sig["nonfinite_rank_module"] == "emb"
    assert sig["nonfinite_ranks"] == 2
    c = _rank_run(0, [{}] * 3, {"t": "nonfinite", "step": 1, "what": "grad"})
    assert R.signals(_job(c, b))["nonfinite_rank"] == 0  # an earlier step wins


def test_the_probed_rank_is_where_the_first_nonfinite_began_else_the_straggler_else_0():
    nan_on_1 = _rank_run(1, [{}] * 3, {"t": "nonfinite", "step": 2, "what": "loss"})
    spread_to_0 = _rank_run(0, [{}] * 3, {"t": "nonfinite", "step": 2, "what": "grad"})
    assert R.probed([spread_to_0, nan_on_1]) == 1
    tied = _rank_run(0, [{}] * 3, {"t": "nonfinite", "step": 2, "what": "loss"})
    assert R.probed([tied, nan_on_1]) == 0  # on both at once: no one rank's, rank 0
    fast = _rank_run(0, _steps(20, 0.04, 0.038, 0.002))
    slow = _rank_run(1, _steps(20, 0.04, 0.008, 0.002))
    assert R.probed([fast, slow]) == 1
    even = _rank_run(1, _steps(20, 0.04, 0.038, 0.002))
    assert R.probed([fast, even]) == 0


def _write_rank(folder: Path, run: Run, ended: bool = True) -> None:
    events = [e for e in run.events if ended or e.get("t") != "end"]
    (folder / f"proc-{100 + run.rank['rank']}.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in events))


def test_rank_0_decides_which_rank_probes_and_exactly_one_does(tmp_path, monkeypatch):
    from model_debugger._rank_probes import DECISION, probes_here

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    zero = _rank_run(0, [{}] * 3, {"t": "nonfinite", "step": 2, "what": "grad"})
    one = _rank_run(1, [{}] * 3, {"t": "nonfinite", "step": 2, "what": "loss"})
    early, late = tmp_path / "early", tmp_path / "late"
    for folder in (early, late):
        folder.mkdir()
        _write_rank(folder, zero)
    _write_rank(early, one)  # every record ended: they name rank 1
    _write_rank(late, one, ended=False)  # rank 1 still running when rank 0 gives up waiting
    assert probes_here(str(late / "proc-101.jsonl"), one.rank, wait=0.2) is False  # no decision
    assert probes_here(str(early / "proc-100.jsonl"), zero.rank, wait=0.3) is False
    assert probes_here(str(early / "proc-101.jsonl"), one.rank, wait=0.3) is True
    assert probes_here(str(late / "proc-100.jsonl"), zero.rank, wait=0.3) is True  # past it
    _write_rank(late, one)  # rank 1 ends later and sees rank 0's decision: it does not probe
    assert probes_here(str(late / "proc-101.jsonl"), one.rank, wait=0.3) is False
    assert (late / DECISION).read_text() == "0" and (early / DECISION).read_text() == "1"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # ranks on other nodes: rank 0, no wait
    assert probes_here(str(early / "proc-100.jsonl"), zero.rank, wait=30) is True
    assert probes_here(str(early / "proc-101.jsonl"), one.rank, wait=30) is False


def test_a_hang_needs_a_rank_waiting_at_the_end_and_one_that_is_not():
    waiting = {"t": "stall", "step": 3, "where": "all_reduce#4", "seconds": 2.5}
    err = {"t": "error", "kind": "exception", "type": "RuntimeError", "message": "timed out"}
    a = _rank_run(0, [{}] * 3, waiting, err)
    b = _rank_run(1, [{}] * 3, {"t": "stall", "step": 3, "where": "loop", "seconds": 2.1})
    sig = R.signals(_job(a, b))
    assert sig["rank_hang"] == 1.0 and sig["rank_hang_missing"] == [1]
    assert sig["rank_hang_waiting"] == [0] and sig["rank_hang_seconds"] == 2.5
    # a slow first step that went on: a stall, then steps after it, is no hang
    c = _rank_run(0, [{}] * 5, {**waiting, "step": 1})
    assert R.signals(_job(c, b))["rank_hang"] == 0.0
    # a rank that never wrote a record is missing too
    assert R.signals(_job(_rank_run(0, [{}] * 3, waiting, err, world=3), b))[
        "rank_hang_missing"] == [1, 2]


# -- Verify through the same launcher --------------------------------------------------------------

def test_verify_reruns_a_launched_job_through_the_launcher_and_compares_across_ranks(tmp_path):
    slow = LAUNCHED.replace("        opt.step()\n", "        opt.step()\n"
                            "        if rank == 1:\n"
                            "            import time; time.sleep(0.03)  # SLOW RANK\n")
    report = _diagnose(tmp_path, slow, "0.01", flags=("--nproc-per-node", "2"))
    assert report["classification"]["primary"] == "performance_issue", report["classification"]
    f = _finding(report, "rank_straggler")
    assert f["location"]["line"] == _line(slow, "SLOW RANK")
    fixed = tmp_path / "fixed.py"
    fixed.write_text(textwrap.dedent(LAUNCHED))
    proc = subprocess.run(
        [sys.executable, "-m", "model_debugger.cli", "verify", report["session_dir"],
         "--fixed", str(fixed), "--yes", "--json", "--seeds", "2", "--max-seconds", "90"],
        capture_output=True, text=True, env=ENV, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    v = json.loads(proc.stdout)["verification"]
    assert v["verdict"] == "resolved", v
    assert v["metric"] == "rank_straggler_share"
    assert all(b > 0.25 for b in v["before"]["values"]), v
    assert all(a < 0.25 for a in v["after"]["values"]), v
    assert v["after"]["categories"] == ["healthy", "healthy"]


# -- in process (a notebook): one rank only, and said so ---------------------------------------------

def test_one_rank_captured_in_process_says_only_it_was_captured():
    from model_debugger import views
    from model_debugger.phases.outcome import _result_of

    run = Run([{"t": "start", "pid": 1},
               {"t": "rank", "rank": 1, "world_size": 4, "backend": "gloo"},
               *({"t": "step", "i": i, "loss": 1.0, "dt": 0.01, "dw": 0.0} for i in range(5)),
               {"t": "end", "status": "ok"}])
    res = _result_of(run, "healthy")
    assert res["single_rank"] == {"rank": 1, "world_size": 4} and "rank_table" not in res
    shown = views.text(views.reproduction({**res, "status": "not_reproduced"}))
    assert "only this process was captured, rank 1 of 4" in shown and "--nproc-per-node" in shown
    alone = Run([{"t": "rank", "rank": 0, "world_size": 1}, *run.events[2:]])
    assert "single_rank" not in _result_of(alone, "healthy")  # a group of one is one process


def test_processes_started_under_an_in_process_capture_are_named_not_captured(tmp_path):
    code = textwrap.dedent('''
        import torch
        import torch.multiprocessing as mp
        import model_debugger
        from model_debugger.phases.outcome import _result_of
        from model_debugger.records import Run


        def work(i):
            x = torch.zeros(1, requires_grad=True)
            opt = torch.optim.SGD([x], lr=0.1)
            for _ in range(5):
                (x - 1).pow(2).sum().backward()
                opt.step()


        if __name__ == "__main__":
            with model_debugger.capture() as rec:
                mp.spawn(work, nprocs=1)
            print(_result_of(Run(rec.events), None)["reason"])
    ''')
    script = tmp_path / "nb.py"
    script.write_text(code)
    env = {k: v for k, v in ENV.items() if k != "MODEL_DEBUGGER_RANKS"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "processes the capture did not reach" in out.stdout


# -- two nodes on one machine, one shared root ------------------------------------------------------

def test_a_job_on_two_nodes_under_a_shared_root_shows_every_rank_on_each_node(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(LAUNCHED))
    root = tmp_path / "shared"

    def node(rank: int) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "model_debugger.cli", "diagnose", str(script), "--json",
             "--root", str(root), "--probe-seconds", "5", "--max-seconds", "90",
             "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", str(rank),
             "--master-addr", "127.0.0.1", "--master-port", str(port), "--", "0.01"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)

    procs = [node(1), node(0)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    reports = [json.loads(out) for out, _ in outs]
    assert len({r["session_dir"] for r in reports}) == 2  # a session per node
    for report in reports:
        rows = _table(report)
        assert [r["node_rank"] for r in rows] == [0, 1]
        assert [r["local_rank"] for r in rows] == [0, 0]
        assert all(r["steps"] == 40 and r["status"] == "ok" for r in rows), rows
        assert report["classification"]["primary"] == "healthy"


def test_other_sessions_records_of_another_job_are_not_taken_for_this_ones(tmp_path):
    def session(name: str, job: str, rank: int) -> str:
        folder = tmp_path / name / "runs" / "0" / "record.ranks"
        folder.mkdir(parents=True)
        (tmp_path / name / "session.json").write_text("{}")
        events = [{"t": "start", "pid": rank},
                  {"t": "rank", "rank": rank, "world_size": 2, "job": job},
                  {"t": "step", "i": 0, "loss": 1.0}, {"t": "end"}]
        (folder / f"proc-{rank}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        return str(tmp_path / name / "runs" / "0" / "record.jsonl")

    mine = session("a", "job1", 0)
    session("b", "job2", 1)  # another job's rank 1
    assert [R._rank(r) for r in R.load_job(mine).ranks] == [0]
    session("c", "job1", 1)  # this job's rank 1, written by the other node
    assert [R._rank(r) for r in R.load_job(mine).ranks] == [0, 1]


# -- what is not a fault (review findings) ----------------------------------------------------------

def test_a_sharded_fsdp_job_is_not_a_desync(tmp_path):
    report = _diagnose(tmp_path, '''
        import torch
        import torch.distributed as dist
        from torch import nn
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo")
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(net)
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(dist.get_rank())
        X = torch.randn(256, 8, generator=gen)
        y = X[:, :1] - X[:, 2:3]
        for epoch in range(5):
            for i in range(0, 256, 32):
                loss = nn.functional.mse_loss(net(X[i:i + 32]), y[i:i + 32])
                opt.zero_grad()
                loss.backward()
                opt.step()
        dist.destroy_process_group()
    ''', flags=("--nproc-per-node", "2"))
    rows = _table(report)
    assert all(r["steps"] == 40 for r in rows)
    assert report["classification"]["primary"] == "healthy", report["classification"]


@pytest.mark.parametrize("waited, stop, hang", [
    (5.0, "TimeLimit", False),  # rank 1 waits at a barrier while rank 0 evaluates: stopped
    (40.0, "TimeLimit", True),  # ... 40 s and still waiting when stopped: a hang
    (3.0, "RuntimeError", True),  # the wait ended in an error (a timeout inside backward)
])
def test_a_wait_is_a_hang_when_it_fails_or_lasts(waited, stop, hang):
    err = {"t": "error", "kind": "interrupted" if stop == "TimeLimit" else "exception",
           "type": stop, "message": ""}
    busy = _rank_run(0, [{}] * 3, {"t": "stall", "step": 3, "where": "loop", "seconds": 4.0},
                     err)
    waiting = _rank_run(1, [{}] * 3, {"t": "stall", "step": 3, "where": "barrier#2",
                                      "seconds": 2.0},
                        {"t": "stall", "step": 3, "where": "barrier#2", "seconds": waited},
                        err)
    sig = R.signals(_job(busy, waiting))
    assert sig["rank_hang"] == (1.0 if hang else 0.0)
    if hang:
        assert sig["rank_hang_missing"] == [0] and sig["rank_hang_seconds"] == waited


def test_a_parent_that_trains_as_rank_0_is_one_of_the_ranks(tmp_path):
    record = tmp_path / "record.jsonl"
    steps = [{"t": "step", "i": i, "loss": 1.0} for i in range(4)]
    record.write_text("".join(json.dumps(e) + "\n" for e in [
        {"t": "start", "pid": 1}, {"t": "rank", "rank": 0, "world_size": 2}, *steps,
        {"t": "end"}]))
    folder = tmp_path / "record.ranks"
    folder.mkdir()
    (folder / "proc-2.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [
        {"t": "start", "pid": 2}, {"t": "rank", "rank": 1, "world_size": 2}, *steps,
        {"t": "end"}]))
    job = R.load_job(str(record))
    assert [R._rank(r) for r in job.ranks] == [0, 1]
    assert job.rank["rank"] == 0 and len(job.steps) == 4


def test_the_collective_timeout_caps_a_timeout_given_by_position_or_name():
    import datetime

    from model_debugger.capture.torch_dist import _with_timeout

    def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1):
        return timeout

    long, short = datetime.timedelta(seconds=600), datetime.timedelta(seconds=1)
    for args, kwargs in ((("gloo", None, long), {}), (("gloo",), {"timeout": long}),
                         (("gloo",), {})):
        a, k = _with_timeout(init_process_group, args, kwargs, 5.0)
        assert init_process_group(*a, **k) == datetime.timedelta(seconds=5)
    a, k = _with_timeout(init_process_group, ("gloo",), {"timeout": short}, 5.0)
    assert init_process_group(*a, **k) == short  # the user's shorter one stays


def test_probes_that_need_live_objects_run_on_rank_0_of_a_launched_job(tmp_path):
    sgd = LAUNCHED.replace("torch.optim.Adam", "torch.optim.SGD")
    report = _diagnose(tmp_path, sgd, "5.0", flags=("--nproc-per-node", "2"))
    _table(report)
    assert report["classification"]["primary"] == "gradient_instability"
    sweep = _finding(report, "lr_range")  # a learning-rate sweep on rank 0's model and batches
    assert sweep["confirmed"] and sweep["root_cause"] == "hyperparameter"
    assert sweep["evidence"]["rank"] == 0
    assert sweep["location"]["line"] == _line(sgd, "torch.optim.SGD")


def test_a_rank_that_dies_in_destroy_process_group_after_its_work_is_no_crash(tmp_path):
    from model_debugger.phases.outcome import _result_of

    steps = [{"t": "step", "i": i, "loss": 1.0} for i in range(6)]
    record = tmp_path / "record.jsonl"
    record.write_text(json.dumps({"t": "start", "pid": 1}) + "\n")
    folder = tmp_path / "record.ranks"
    folder.mkdir()
    for rank, last in ((0, {"t": "group_destroyed", "step": 6}), (1, {"t": "end"})):
        events = [{"t": "start", "pid": 10 + rank},
                  {"t": "rank", "rank": rank, "world_size": 2}, *steps, last]
        (folder / f"proc-{rank}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    job = R.load_job(str(record))
    res = _result_of(job, "healthy")
    assert res["status"] == "completed", res
    assert res["rank_table"][0]["status"] == "ok (died in destroy_process_group)"
    # killed before its last step's teardown: a crash, as it is
    (folder / "proc-0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [
        {"t": "start", "pid": 10}, {"t": "rank", "rank": 0, "world_size": 2}, *steps]))
    assert _result_of(R.load_job(str(record)), "healthy")["status"] == "crashed"


def test_spawned_ranks_get_the_runs_seed_and_step_budget(tmp_path):
    """What a re-run changes (Verify's seeds, Isolate's step budget) reaches spawned ranks."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent('''
        import torch
        import torch.multiprocessing as mp
        from torch import nn


        def work(i):
            model = nn.Linear(4, 1)  # initialised from the seed this process was given
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            X = torch.randn(64, 4)
            for _ in range(30):
                loss = nn.functional.mse_loss(model(X), X.sum(1, keepdim=True))
                opt.zero_grad()
                loss.backward()
                opt.step()


        if __name__ == "__main__":
            mp.spawn(work, nprocs=2)
    '''))

    def first_losses(seed: int, folder: str, *more: str) -> list:
        record = tmp_path / folder / "record.jsonl"
        subprocess.run([sys.executable, "-m", "model_debugger._child", "--record", str(record),
                        "--seed", str(seed), *more, str(script)], env=ENV, timeout=120,
                       capture_output=True)
        job = R.load_job(str(record))
        return [[s["loss"] for s in r.steps] for r in job.ranks]

    a, b, c = first_losses(7, "a"), first_losses(7, "b"), first_losses(8, "c")
    assert len(a) == 2 and a == b and a != c  # the same seed, the same runs on every rank
    stopped = first_losses(7, "d", "--max-steps", "5")
    assert [len(r) for r in stopped] == [5, 5]


# -- a sample of the rank fault matrix (benchmarks/rank_matrix: programs by another hand) ----------

MATRIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                      "rank_matrix")


@pytest.mark.parametrize("program", [
    "f4b_torchrun_uneven_batches_barrier_hang.py",  # ranks waiting in different collectives
    "f9_spawn_only_rank0_steps.py",  # one rank never steps its optimizer
    "h6_torchrun_long_rank0_eval.py",  # healthy: rank 1 waits 2.5 s at a barrier each epoch
])
def test_a_sample_of_the_rank_fault_matrix(program, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("rank_matrix_run",
                                                  os.path.join(MATRIX, "run.py"))
    matrix = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(matrix)
    path = os.path.join(matrix.PROGRAMS, program)
    report, _, err = matrix.diagnose(path, str(tmp_path / "s"), ENV)
    assert report is not None, err
    row = matrix.judge(program, path, report)
    assert row["category_hit"] and row["finding_hit"] and row["rank_hit"], row
    assert row["location_hit"], row
