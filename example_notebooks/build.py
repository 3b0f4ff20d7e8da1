"""Write the example notebooks from the walk-throughs below (``python example_notebooks/build.py``).

Each walk-through is a small real PyTorch training run taken from ``tests/scenarios/``, split into
cells (data, model, the training loop under ``%%reproduce``), then ``%classify``, ``%isolate``,
``%%fix`` with the corrected loop, ``%verify`` and ``%md_export``. The notebooks are committed
without outputs; ``tests/test_notebooks.py`` executes every one headless and checks the
classification and the final verdict.
"""

from __future__ import annotations

import os
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.dirname(os.path.abspath(__file__))

INTRO = ("Every diagnosis walks **Reproduce -> Classify -> Isolate -> Fix -> Verify**. "
         "`%%reproduce` runs the training cell under instrumentation (the loss curves update "
         "while it runs), records the run and classifies it with the numbers behind the "
         "category. `%isolate` runs probes on the live model and data: a finding is "
         "*confirmed* only by a measurement, and only a confirmed finding opens the Fix gate. "
         "`%%fix` shows the plan (finding, suggestion, diff, expected effect) with an Approve "
         "button; here `--yes` approves it so the notebook runs headless. `%verify` reruns the "
         "original and the fixed cell from the same starting state over several seeds, and "
         "`%md_export` writes the record notebook.")

WALKS = {
    "loss_not_decreasing": dict(
        title="Loss not decreasing: a learning rate far too small",
        source="tests/scenarios/lnd_lr_too_low.py",
        story="Plain SGD with `lr=1e-5` on a small classification problem: the loss "
              "stays flat for four epochs.",
        data="""import torch
from torch import nn

torch.manual_seed(0)
X = torch.randn(2048, 20)
y = (X[:, :5].sum(dim=1) > 0).long()""",
        model="model = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 2))\nmodel",
        loop="""optimizer = torch.optim.SGD(model.parameters(), lr=1e-5)
loss_fn = nn.CrossEntropyLoss()
for epoch in range(4):
    perm = torch.randperm(len(X))
    for i in range(0, len(X), 64):
        idx = perm[i:i + 64]
        optimizer.zero_grad()
        loss = loss_fn(model(X[idx]), y[idx])
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: loss={loss.item():.4f}")""",
        fix=("lr=1e-5", "lr=0.1"),
        why="The `lr_range` probe swept learning rates from the initial weights and measured "
            "a held-out loss far lower near 0.1: one change, the learning rate.",
    ),
    "gradient_instability": dict(
        title="Gradient instability: SGD diverges to NaN",
        source="tests/scenarios/gi_lr_too_high.py",
        story="A two-layer regression net trained with `lr=3.0`: the loss explodes and turns "
              "NaN within a few steps.",
        data="""import torch
from torch import nn

torch.manual_seed(5)
X = torch.randn(1024, 6)
y = X @ torch.randn(6, 1)""",
        model="model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))\nmodel",
        loop="""opt = torch.optim.SGD(model.parameters(), lr=3.0)
for step in range(200):
    idx = torch.randint(0, len(X), (64,))
    loss = nn.functional.mse_loss(model(X[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 20 == 0:
        print(f"step {step} loss={loss.item():.4g}")""",
        fix=("lr=3.0", "lr=0.05"),
        why="The sweep found the rates that diverge and the fastest safe one; the first "
            "non-finite step and module are in the record.",
    ),
    "memory_issue": dict(
        title="Memory issue: a batch that cannot be allocated",
        source="tests/scenarios/mem_oom.py",
        story="After 20 steps the loop switches to \"the whole dataset as one batch\": the "
              "allocation fails with out-of-memory. The cell fails, the partial record is kept "
              "and the kernel goes on.",
        data="""import torch
from torch import nn

torch.manual_seed(8)""",
        model="""model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.Adam(model.parameters())""",
        loop="""batch_size = 32
for step in range(30):
    if step == 20:
        batch_size = 2 ** 40  # "use the whole dataset as one batch"
    x = torch.randn(batch_size, 64)
    y = x[:, :10].argmax(dim=1)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()""",
        fix=("batch_size = 2 ** 40", "batch_size = 256"),
        why="`batch_memory` measured the activation bytes per sample and extrapolated to the "
            "failing allocation: the largest batch that fits is far below 2**40 samples.",
    ),
    "overfitting": dict(
        title="Overfitting: a wide MLP memorises 64 noisy samples",
        source="tests/scenarios/ovf_small_data_big_mlp.py",
        story="64 training samples, a 512-wide MLP, 40 epochs: the training loss goes to zero "
              "while the validation loss turns up.",
        data="""import torch
from torch import nn

torch.manual_seed(3)
def make(n):
    \"\"\"``n`` rows of 30 features; the label is the sign of feature 0 plus noise.\"\"\"
    X = torch.randn(n, 30)
    y = ((X[:, 0] + 0.8 * torch.randn(n)) > 0).long()
    return X, y
X, y = make(64)
Xv, yv = make(512)""",
        model="""model = nn.Sequential(nn.Linear(30, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 2))""",
        loop="""opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(40):
    for i in range(0, 64, 16):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(X[i:i + 16]), y[i:i + 16])
        loss.backward()
        opt.step()
    with torch.no_grad():
        val_logits = model(Xv)
        val_loss = nn.functional.cross_entropy(val_logits, yv).item()
        val_acc = (val_logits.argmax(1) == yv).float().mean().item()
    print(f"epoch {epoch}: train_loss={loss.item():.4f} val_loss={val_loss:.4f} val_acc={val_acc:.3f}")""",
        fix=("lr=1e-3)", "lr=1e-3, weight_decay=0.1)"),
        why="`data_volume` measured far more parameters than training samples. The data cannot "
            "grow here and the architecture stays (the cause is data, not the model), so the "
            "one change is regularisation: weight decay on the optimizer.",
    ),
    "performance_issue": dict(
        title="Performance issue: a collate function in pure Python",
        source="tests/scenarios/perf_python_collate.py",
        story="The collate function builds every batch element by element in Python; the model "
              "step is fast, so most of each step is spent waiting for data.",
        data="""import torch
from torch import nn

torch.manual_seed(11)
rows = [[float(v) for v in torch.randn(256)] for _ in range(1024)]
labels = [int(r[0] > 0) for r in rows]""",
        model="model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 2))",
        loop="""from torch.utils.data import DataLoader


def collate(batch):
    xs = torch.zeros(len(batch), 256)
    for i, (row, _) in enumerate(batch):
        for j, v in enumerate(row):
            xs[i, j] = v
    return xs, torch.tensor([label for _, label in batch])


opt = torch.optim.Adam(model.parameters(), lr=3e-3)
loader = DataLoader(list(zip(rows, labels)), batch_size=64, shuffle=True, collate_fn=collate)
for epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()""",
        fix=("""    xs = torch.zeros(len(batch), 256)
    for i, (row, _) in enumerate(batch):
        for j, v in enumerate(row):
            xs[i, j] = v
""", """    xs = torch.tensor([row for row, _ in batch])
"""),
        fix_flags="--data-consent",
        why="`dataloader_throughput` timed the loader alone against the model step alone and "
            "pointed at `collate`. Building the batch in one call is the one change; it touches "
            "the data pipeline, so it needs explicit consent (`--data-consent`).",
    ),
    "convergence_to_wrong_solution": dict(
        title="Convergence to a wrong solution: always predicting the majority class",
        source="tests/scenarios/cws_imbalanced_majority.py",
        story="5% positives and no class weights: the loss falls while the F1 score of the "
              "rare class stays at zero (the model predicts \"negative\" always).",
        data="""import torch
from torch import nn

torch.manual_seed(12)
n = 4000
y = (torch.rand(n) < 0.05).float()
X = torch.randn(n, 20) + 0.15 * y[:, None]
Xv, yv = X[3000:], y[3000:]
X, y = X[:3000], y[:3000]""",
        model="model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 1))",
        loop="""opt = torch.optim.SGD(model.parameters(), lr=0.05)
criterion = nn.BCEWithLogitsLoss()
for epoch in range(5):
    for i in range(0, len(X), 100):
        opt.zero_grad()
        loss = criterion(model(X[i:i + 100]).squeeze(1), y[i:i + 100])
        loss.backward()
        opt.step()
    with torch.no_grad():
        pred = (model(Xv).squeeze(1) > 0).float()
        val_f1 = 2 * (pred * yv).sum().item() / max(pred.sum().item() + yv.sum().item(), 1)
    print(f"epoch {epoch} | train_loss: {loss.item():.4f} | val_f1: {val_f1:.4f}")""",
        fix=("nn.BCEWithLogitsLoss()", "nn.BCEWithLogitsLoss(pos_weight=torch.tensor(19.0))"),
        why="`class_imbalance` measured the class shares; weighting the rare class by the "
            "inverse frequency makes ignoring it expensive.",
    ),
}

HEALTHY = dict(
    title="A healthy run: nothing to fix",
    source="tests/scenarios/healthy_mlp_adam.py",
    data="""import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(14)
X = torch.randn(2048, 10)
y = (X[:, 0] + X[:, 1] > 0).long()
train = DataLoader(TensorDataset(X[:1536], y[:1536]), batch_size=64, shuffle=True)
Xv, yv = X[1536:], y[1536:]""",
    model="model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 2))",
    loop="""opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(5):
    for xb, yb in train:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
    with torch.no_grad():
        out = model(Xv)
        val_loss = nn.functional.cross_entropy(out, yv).item()
        val_acc = (out.argmax(1) == yv).float().mean().item()
    print(f"epoch {epoch}: train_loss={loss.item():.4f} val_loss={val_loss:.4f} val_acc={val_acc:.3f}")""",
)


KERAS = dict(
    category="loss_not_decreasing",
    title="Keras: loss not decreasing with a learning rate far too small",
    source="tests/scenarios/keras_lnd_lr_too_low.py",
    story="A Keras 3 model trained with `model.fit` and plain SGD at `learning_rate=1e-5`: the "
          "loss stays flat. Nothing in the training code changes for the diagnosis: `fit` gets "
          "a recording callback and gradients are read where Keras applies them.",
    data="""import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras
import numpy as np

keras.utils.set_random_seed(0)
X = np.random.randn(2048, 20).astype("float32")
y = (X[:, :5].sum(axis=1) > 0).astype("int64")""",
    model="""model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="tanh"),
                          keras.layers.Dense(2)])""",
    loop="""model.compile(optimizer=keras.optimizers.SGD(learning_rate=1e-5),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(X, y, batch_size=64, epochs=4, verbose=2)""",
    fix=("learning_rate=1e-5", "learning_rate=0.1"),
    why="`lr_range` swept learning rates on clones of the model set to its initial weights: "
        "the loss falls fastest near 0.1. One change, the learning rate; Verify restores the "
        "model's initial weights before every run.",
)


def _notebook(cells: list) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def walkthrough(name: str, w: dict) -> nbformat.NotebookNode:
    """The notebook of one category: reproduce, classify, isolate, fix, verify, export."""
    category = name
    old, new = w["fix"]
    assert w["loop"].count(old) == 1, (category, old)
    fixed = w["loop"].replace(old, new)
    flags = " ".join(["--yes", w.get("fix_flags", "")]).strip()
    return _notebook([
        new_markdown_cell(f"# {w['title']}\n\n{w['story']}\n\nBased on `{w['source']}`. "
                          f"{INTRO}"),
        new_code_cell("%load_ext model_debugger"),
        new_markdown_cell("## Data and model\n\nOrdinary cells. `%%reproduce` keeps the "
                          "earlier cells the training cell depends on with it, as one script "
                          "(`artifact.py` in the session folder)."),
        new_code_cell(w["data"]),
        new_code_cell(w["model"]),
        new_markdown_cell("## Reproduce\n\nThe training loop, unchanged, under `%%reproduce`."),
        new_code_cell("%%reproduce --seed 0\n" + w["loop"]),
        new_markdown_cell("## Classify\n\nReproduce already classified the run; `%classify` "
                          "shows the category and the numbers behind it."),
        new_code_cell("%classify"),
        new_markdown_cell("## Isolate\n\nProbes on the live model, data and optimizer."),
        new_code_cell("%isolate"),
        new_markdown_cell(f"## Fix\n\n{w['why']}\n\nThe `%%fix` cell holds the corrected "
                          "training cell. Without `--yes` the plan waits for the Approve "
                          "button."),
        new_code_cell(f"%%fix {flags}\n" + fixed),
        new_markdown_cell("## Verify\n\nThe original and the fixed cell, each from the same "
                          "starting state, over three seeds."),
        new_code_cell("%verify"),
        new_code_cell("%md_status"),
        new_code_cell(f"%md_export {category}_record.ipynb"),
    ])


def healthy(w: dict) -> nbformat.NotebookNode:
    """The healthy run: classified healthy, Isolate finds nothing, the record is exported."""
    return _notebook([
        new_markdown_cell(f"# {w['title']}\n\nBased on `{w['source']}`: an MLP learns a "
                          "separable problem; training and validation loss both fall. The "
                          "diagnosis says so, with its numbers, and the Fix gate stays closed."),
        new_code_cell("%load_ext model_debugger"),
        new_code_cell(w["data"]),
        new_code_cell(w["model"]),
        new_code_cell("%%reproduce --seed 0\n" + w["loop"]),
        new_code_cell("%classify"),
        new_code_cell("%isolate"),
        new_code_cell("import model_debugger\n\nsession = model_debugger.current_session()\n"
                      "print('fix allowed:', session.report()['fix_allowed'])\n"
                      "session.tracker"),
        new_code_cell("%md_export healthy_record.ipynb"),
    ])


def notebooks() -> dict[str, nbformat.NotebookNode]:
    """``{file name: notebook}`` of every example."""
    out = {f"{cat}.ipynb": walkthrough(cat, w) for cat, w in WALKS.items()}
    out["healthy.ipynb"] = healthy(HEALTHY)
    out["keras_loss_not_decreasing.ipynb"] = walkthrough("keras_loss_not_decreasing", KERAS)
    return out


def main(argv: list[str]) -> int:
    """Validate and write every example notebook next to this file; the exit status."""
    for name, nb in notebooks().items():
        nbformat.validate(nb)
        nbformat.write(nb, os.path.join(HERE, name))
        print("wrote", name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
