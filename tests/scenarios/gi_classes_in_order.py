"""Loss rises: the training set is built class by class and the loader never shuffles it.

expect-category: gradient_instability
expect-root-cause: data
expect-check: data_order
expect-line: DataLoader(
fault: data (rows grouped by class, DataLoader without shuffle)
"""
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

rng = np.random.default_rng(5)
centres = rng.normal(scale=2.0, size=(4, 12))
per_class = [centres[c] + rng.normal(size=(400, 12)) for c in range(4)]
features = np.concatenate(per_class).astype("float32")        # class 0 rows, then class 1, ...
labels = np.repeat(np.arange(4), 400)

train_set = TensorDataset(torch.from_numpy(features), torch.from_numpy(labels))
batches = DataLoader(train_set, batch_size=40)

classifier = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 4))
optimiser = torch.optim.SGD(classifier.parameters(), lr=0.1, momentum=0.9)
loss_of = nn.CrossEntropyLoss()
for epoch in range(3):
    for xb, yb in batches:
        optimiser.zero_grad()
        loss = loss_of(classifier(xb), yb)
        loss.backward()
        optimiser.step()
    print("epoch", epoch, "last batch loss", round(loss.item(), 4))
