"""Framework warnings: recorded once per kind at the user's line, and turned into hypotheses."""

from __future__ import annotations

import json
import runpy
import warnings

from model_debugger.capture import Recorder
from model_debugger.probes.framework_warnings import known
from model_debugger.records import Run

SCRIPT = """\
import warnings
import torch
x, y = torch.randn(64, 3), torch.randn(64)
net = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, 10)
for i in range(12):
    loss = torch.nn.functional.mse_loss(net(x), y)
    opt.zero_grad()
    loss.backward()
    sched.step()
    opt.step()
    warnings.warn("the old API", DeprecationWarning)
"""


def test_each_kind_of_warning_is_recorded_once_with_the_user_line_and_its_count(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    record = tmp_path / "run.jsonl"
    before = warnings.showwarning
    shown = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # every repeat reaches showwarning
        hook = warnings.showwarning = lambda m, c, f, n, *a: shown.append((str(m)[:20], f, n))
        with Recorder(str(record)):
            layered = warnings.showwarning
            runpy.run_path(str(script), run_name="__main__")
        assert layered is not hook and warnings.showwarning is hook  # removed with the capture
    assert before is not hook
    # shown to the user at their line, although torch's stacklevel points into the capture
    assert {(f, n) for _, f, n in shown} == {(str(script), 8), (str(script), 11),
                                             (str(script), 13)}
    events = [json.loads(line) for line in record.read_text().splitlines()]
    seen = [e for e in events if e["t"] == "warning"]
    last = {e["line"]: e for e in seen}  # the last event of a kind holds its count
    assert set(last) == {8, 11}, seen  # the loss call and scheduler.step(), not torch's files
    assert all(e["file"] == str(script) for e in seen)
    assert last[8]["count"] == 12 and "different to the input size" in last[8]["message"]
    # every warning was passed on: the recorded ones and the 12 deprecations not recorded
    assert len(shown) == sum(e["count"] for e in last.values()) + 12
    assert "before `optimizer.step()`" in last[11]["message"]
    assert not any("old API" in e["message"] for e in seen)  # deprecations are not kept
    # the probe's hypotheses: one per known kind, at those lines, never confirmed
    from model_debugger.probes import PROBES, ProbeContext
    from model_debugger.records import Classification

    ctx = ProbeContext(run=Run(events), signals={}, classification=Classification(
        "gradient_instability", (), ()), framework="torch")
    probe = PROBES["framework_warnings"]()
    assert probe.applies(ctx)
    found = probe.run(ctx)
    assert sorted((f.location["line"], f.root_cause, f.confirmed) for f in found) == \
        [(8, "training_loop", False), (11, "training_loop", False)]
    assert "12 times" in next(f for f in found if f.location["line"] == 8).explanation


def test_only_warnings_that_name_a_pitfall_become_hypotheses():
    assert known("`sparse_categorical_crossentropy` received `from_logits=True`, but the "
                 "`output` argument was produced by a Softmax activation").root_cause == \
        "architecture"
    assert known("overflow encountered in exp").root_cause == "data"
    assert known("Implicit dimension choice for softmax has been deprecated").root_cause == \
        "architecture"
    assert known("The given NumPy array is not writable") is None


def test_warnings_from_many_threads_are_counted_once_each_and_none_after_the_end():
    import threading

    from model_debugger.capture.warned import WarningLog

    class Rec:
        step = 0

        def __init__(self):
            self.events = []

        def emit(self, kind, **data):
            self.events.append((kind, data))

    rec = Rec()
    log = WarningLog(rec)
    where = {"file": "train.py", "line": 3}

    def warn_many():
        for _ in range(500):
            log.note("overflow encountered in exp", RuntimeWarning, where)

    threads = [threading.Thread(target=warn_many) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(rec.events) == 1  # the first of its kind, at once
    log.finish()
    log.note("overflow encountered in exp", RuntimeWarning, where)  # after the end: not kept
    assert [d["count"] for _, d in rec.events] == [1, 4000]
