"""Tabular regression driven by a config dict; argparse supplies the defaults."""
import argparse
import math

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DEFAULTS = {"lr": 0.01, "momentum": 0.9, "batch_size": 32, "epochs": 10, "hidden": 32}


class Regressor(nn.Module):
    def __init__(self, n_in, hidden):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                                  nn.ReLU())
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        h = self.body(x)
        return self.head(h)


def load_data(n=1200, seed=7):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6)).astype(np.float32)
    w = np.array([1.5, -2.0, 0.5, 0.0, 1.0, -0.7], dtype=np.float32)
    y = X @ w + 0.5 * np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=n).astype(np.float32)
    return torch.from_numpy(X), torch.from_numpy(y.astype(np.float32)).unsqueeze(1)


def train(config):
    X, y = load_data()
    X_tr, y_tr, X_va, y_va = X[:1000], y[:1000], X[1000:], y[1000:]
    dl = DataLoader(TensorDataset(X_tr, y_tr), batch_size=config["batch_size"], shuffle=True)
    model = Regressor(X.shape[1], config["hidden"])
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=config["momentum"])
    criterion = nn.MSELoss()
    for ep in range(config["epochs"]):
        model.train()
        for xb, yb in dl:
            pred = model(xb)
            loss = criterion(pred, yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            val_mse = criterion(model(X_va), y_va).item()
        print(f"[{ep:02d}] train_mse={loss.item():.4f} val_rmse={math.sqrt(val_mse):.4f}")
    return model


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for key, value in DEFAULTS.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=value)
    train(vars(parser.parse_args()))
