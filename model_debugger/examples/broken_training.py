"""The demo's training script: tabular regression on house-price features, SGD + momentum.

``broken_training.py`` trains on the raw (unscaled) features: the loss explodes and gradients
overflow to inf. ``fixed_training.py`` is the same script with the one change Isolate confirms
(the inputs standardised). ``make demo`` walks the whole method on the pair:

    model-debugger diagnose model_debugger/examples/broken_training.py --runs 3 --seed 0
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(n=4096):
    """House-price-like features (rooms, area in m^2, age in years, distance in m) and prices."""
    rooms = torch.randint(1, 8, (n, 1)).float()
    area = rooms * 25 + 10 * torch.randn(n, 1)
    age = 50 * torch.rand(n, 1)
    dist = 5000 * torch.rand(n, 1)
    X = torch.cat([rooms, area, age, dist], dim=1)
    price = 0.8 * rooms + 0.02 * area - 0.01 * age - 0.0001 * dist + 0.1 * torch.randn(n, 1)
    return X, price


class PriceModel(nn.Module):
    """An MLP from the 4 raw features to a price: one hidden layer of 32 ReLU units."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(4, 32)
        self.act = nn.ReLU()
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        """The predicted price of each row of ``x``."""
        return self.out(self.act(self.hidden(x)))


X, y = make_data()
loader = DataLoader(TensorDataset(X, y), batch_size=64, shuffle=True)
model = PriceModel()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
for epoch in range(3):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: train_loss={loss.item():.4f}")
