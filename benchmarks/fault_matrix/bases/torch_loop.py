"""Three Gaussian blobs, an MLP, a plain PyTorch loop over a DataLoader."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

centers = torch.tensor([[2.0, 0.0, 0.0, 1.0], [-2.0, 1.0, 0.0, 0.0], [0.0, -2.0, 1.0, -1.0]])
labels = torch.randint(0, 3, (3000,))
features = centers[labels] + 0.8 * torch.randn(3000, 4)
train_X, val_X = features[:2400], features[2400:]
train_y, val_y = labels[:2400], labels[2400:]

train_loader = DataLoader(TensorDataset(train_X, train_y), batch_size=64, shuffle=True)
val_loader = DataLoader(TensorDataset(val_X, val_y), batch_size=256)

net = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
loss_fn = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

for epoch in range(8):
    net.train()
    for xb, yb in train_loader:
        optimizer.zero_grad()
        logits = net(xb)
        loss = loss_fn(logits, yb)
        loss.backward()
        optimizer.step()
    net.eval()
    correct = total = 0
    val_loss = 0.0
    with torch.no_grad():
        for xb, yb in val_loader:
            out = net(xb)
            val_loss += loss_fn(out, yb).item() * len(yb)
            correct += (out.argmax(1) == yb).sum().item()
            total += len(yb)
    print(f"epoch {epoch + 1}  loss {loss.item():.4f}  val_loss {val_loss / total:.4f}  "
          f"val_acc {correct / total:.3f}")
