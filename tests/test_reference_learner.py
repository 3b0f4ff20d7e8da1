"""A plateau is the task's floor only when the data holds no more than the model learned.

``reference_learner`` scores a 5-nearest-neighbour predictor on the kept rows against the run's
own score; Isolate keeps a tentative plateau a problem when the neighbours do far better (a
funnel of layers narrowing to one unit on digits: 0.19 against 0.97), and takes it as the floor
when they do not (labels that are noise: neither learner beats chance).
"""

from __future__ import annotations

import types

import numpy as np
import torch
from torch import nn

from model_debugger.phases.isolate import LEARNABLE_MARGIN, _settle_plateau
from model_debugger.probes.reference_learner import ReferenceLearner
from model_debugger.records import HEALTHY, ArtifactInfo, Classification, Evidence, Run
from model_debugger.session import DebugSession
from model_debugger.trainers.torch import TorchTrainer


def _trainer(noise: bool, n: int = 600) -> TorchTrainer:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, n)
    x = (rng.normal(size=(n, 6)) + 3.0 * np.eye(4, 6)[y]).astype(np.float32)  # clusters
    if noise:
        y = rng.permutation(y)
    model = nn.Sequential(nn.Linear(6, 1), nn.ReLU(), nn.Linear(1, 4))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    batches = [((xt[i:i + 50],), yt[i:i + 50]) for i in range(0, n, 50)]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return TorchTrainer(model, state, {"cls": torch.optim.SGD, "hyper": {"lr": 0.1}},
                        {"name": "cross_entropy"}, batches)


def _ctx(tr, val_acc):
    return types.SimpleNamespace(trainer=tr, signals={"val_acc_max": val_acc},
                                 run=Run([{"t": "start"}]), time_left=lambda: 60.0)


def test_the_neighbours_score_the_same_rows_the_model_learned_little_from():
    learnable = ReferenceLearner().run(_ctx(_trainer(noise=False), 0.3)).learnable
    assert learnable["metric"] == "accuracy" and learnable["model_score"] == 0.3
    assert learnable["score"] > 0.9  # the clusters are plain to a k-NN
    noise = ReferenceLearner().run(_ctx(_trainer(noise=True), 0.3)).learnable
    assert noise["score"] < 0.4  # labels that are noise: nobody predicts them
    assert ReferenceLearner().run(_ctx(_trainer(noise=False), None)) == []  # no own score


def test_ids_an_embedding_looks_up_have_no_neighbours():
    """Token ids are categories: id 41 is no nearer to 40 than to 3, so a k-NN on them scores
    nothing about the data (it sent the label probe's many fits ahead of the probes of an
    end-padded sequence model that learned nothing)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 50, size=(600, 12))
    y = (ids[:, 0] > 25).astype(np.int64)
    tr = _trainer(noise=False)
    plain = ReferenceLearner().run(types.SimpleNamespace(
        **vars(_ctx(tr, 0.5)), train_xy=(ids, y), model=tr.model)).learnable
    assert plain is not None  # integers into a model without an embedding: features
    embedded = nn.Sequential(nn.Embedding(50, 4), nn.Flatten(), nn.Linear(48, 2))
    assert ReferenceLearner().run(types.SimpleNamespace(
        **vars(_ctx(tr, 0.5)), train_xy=(ids, y), model=embedded)) == []


def _tentative(tmp_path) -> DebugSession:
    s = DebugSession.create(str(tmp_path / "root"))
    s.record_artifact(ArtifactInfo("script", script="/nonexistent/train.py", seed=0))
    s.record_reproduce({"status": "reproduced", "problem": "loss_not_decreasing",
                        "runs": {"total": 1, "reproduced": 1,
                                 "categories": ["loss_not_decreasing"]}})
    s.record_classification(Classification("loss_not_decreasing", (), (
        Evidence("loss_final", 1.27, ""), Evidence("constant_predictor_loss", 1.386, ""),
        Evidence("loss_floor_share", 0.92, "tentative"))), {"loss_floor_share": 0.92})
    return s


def test_a_plateau_stays_a_problem_when_the_data_holds_more(tmp_path):
    s = _tentative(tmp_path)
    _settle_plateau(s, [], {"lr_range"}, {"reference": "5-nearest-neighbour",
                                           "metric": "accuracy", "score": 0.97,
                                           "model_score": 0.19, "rows": 600})
    cls = s.state.classification
    assert cls.primary == "loss_not_decreasing"
    assert cls.evidence[-1].signal == "reference_score" and cls.evidence[-1].value == 0.97
    assert s.state.signals["reference_gap"] == 0.78


def test_a_plateau_is_the_floor_when_nothing_predicts_better(tmp_path):
    for learnable in (None, {"reference": "5-nearest-neighbour", "metric": "accuracy",
                             "score": 0.30, "model_score": 0.30 - LEARNABLE_MARGIN / 2,
                             "rows": 600}):
        s = _tentative(tmp_path / str(bool(learnable)))
        _settle_plateau(s, [], {"lr_range"}, learnable)
        assert s.state.classification.primary == HEALTHY
