"""Loss stuck: the model output is detached, so no gradient ever reaches the weights.

expect-category: loss_not_decreasing
expect-root-cause: training_loop
expect-check: detached_output
expect-line: .detach()
fault: training_loop (`.detach()` on the prediction)
"""
import model_debugger
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(1)
X = torch.randn(1024, 8)
y = X @ torch.randn(8, 1) + 0.1 * torch.randn(1024, 1)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
loader = DataLoader(TensorDataset(X, y), batch_size=32, shuffle=True)
for epoch in range(3):
    for xb, yb in loader:
        pred = model(xb).detach().requires_grad_()
        loss = nn.functional.mse_loss(pred, yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model_debugger.log(epoch=epoch, train_loss=loss.item())
