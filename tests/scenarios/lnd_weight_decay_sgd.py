"""Loss stuck: a weight decay of 2 (meant 2e-4) pulls the weights to zero every step.

expect-category: loss_not_decreasing
expect-root-cause: hyperparameter
expect-check: optimizer_settings
expect-line: torch.optim.SGD(|weight_decay=2.0
fault: hyperparameter (weight_decay=2.0 with SGD + momentum)
"""
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

rng = np.random.default_rng(11)
inputs = rng.normal(size=(2500, 16)).astype("float32")
weights = rng.normal(size=(16,)).astype("float32")
targets = (inputs @ weights > 0).astype("int64")
loader = DataLoader(TensorDataset(torch.from_numpy(inputs), torch.from_numpy(targets)),
                    batch_size=50, shuffle=True)

mlp = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
sgd = torch.optim.SGD(mlp.parameters(), lr=0.05, momentum=0.9,
                      weight_decay=2.0)
criterion = torch.nn.CrossEntropyLoss()
for epoch in range(4):
    total = 0.0
    for xb, yb in loader:
        sgd.zero_grad()
        batch_loss = criterion(mlp(xb), yb)
        batch_loss.backward()
        sgd.step()
        total += batch_loss.item()
    print(f"epoch {epoch} mean loss {total / len(loader):.4f}")
