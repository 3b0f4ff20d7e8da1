"""Slow: a regression trained two rows at a time; the fixed cost of each step is most of it.

expect-category: performance_issue
expect-root-cause: hyperparameter
expect-check: small_batches
expect-line: DataLoader(
expect-revealed: small_batches
fault: hyperparameter (batch_size=2)
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(rows=4000):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(rows, 10, generator=g)
    y = x @ torch.linspace(-1, 1, 10) + 0.1 * torch.randn(rows, generator=g)
    return TensorDataset(x, y.unsqueeze(1))


def main():
    loader = DataLoader(make_data(), batch_size=2, shuffle=True)
    net = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for epoch in range(2):
        running = 0.0
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            running += loss.item()
        print(f"epoch {epoch}: mse {running / len(loader):.4f}")


if __name__ == "__main__":
    main()
