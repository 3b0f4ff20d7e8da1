"""Loss barely moves: the model ends in Softmax and CrossEntropyLoss applies log-softmax again.

expect-category: loss_not_decreasing
expect-root-cause: architecture
expect-check: loss_output_mismatch
expect-line: nn.Softmax
"""
import torch
from torch import nn

torch.manual_seed(19)
X = torch.randn(3000, 20)
y = (X[:, :4] @ torch.tensor([1.0, -1.0, 0.5, 2.0])).gt(0).long() + (X[:, 4] > 1).long()
model = nn.Sequential(
    nn.Linear(20, 64), nn.ReLU(),
    nn.Linear(64, 3),
)
criterion = nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(3):
    for i in range(0, len(X), 100):
        opt.zero_grad()
        loss = criterion(model(X[i:i + 100]), y[i:i + 100])
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
