"""Loss falls, F1 of the rare classes stays at zero: the prior is learned, not the task.

expect-category: convergence_to_wrong_solution
expect-root-cause: data
expect-check: class_imbalance|label_alignment
expect-line: loss = nn.functional.cross_entropy(|X = torch.randn(n, 12) + 0.05
fault: data (90/5/5 classes, signal too weak to beat the prior)
"""
import model_debugger
import torch
from torch import nn

torch.manual_seed(13)
n = 3000
y = torch.multinomial(torch.tensor([0.9, 0.05, 0.05]), n, replacement=True)
X = torch.randn(n, 12) + 0.05 * nn.functional.one_hot(y, 12).float()
model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 3))
opt = torch.optim.Adagrad(model.parameters(), lr=0.05)


def minority_f1(pred, target):
    tp = ((pred > 0) & (target > 0) & (pred == target)).sum().item()
    fp = ((pred > 0) & (pred != target)).sum().item()
    fn = ((target > 0) & (pred != target)).sum().item()
    return 2 * tp / max(2 * tp + fp + fn, 1)


for epoch in range(6):
    for i in range(0, n, 150):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(X[i:i + 150]), y[i:i + 150])
        loss.backward()
        opt.step()
    with torch.no_grad():
        f1 = minority_f1(model(X).argmax(1), y)
    model_debugger.log(epoch=epoch, minority_f1=f1)
