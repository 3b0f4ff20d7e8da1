"""Loss stuck: the feature table was sorted by date for a plot, the label column was not.

expect-category: loss_not_decreasing
expect-root-cause: data
expect-check: label_alignment
expect-line: features = features[order]
"""
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

rng = np.random.default_rng(17)
n = 2000
date = rng.permutation(n)
features = rng.normal(size=(n, 8)).astype(np.float32)
labels = (features[:, 0] + features[:, 1] > 0).astype(np.int64)
order = np.argsort(date)
features = features[order]          # sorted for a chart ...
# ... labels keep their original order: row i of X no longer belongs to label i
X, y = torch.from_numpy(features), torch.from_numpy(labels)
loader = DataLoader(TensorDataset(X, y), batch_size=50, shuffle=True)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(3):
    for xb, yb in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
    print(f"epoch={epoch} loss={loss.item():.4f}")
