"""A CNN on scikit-learn's 8x8 digits; log-softmax outputs with NLLLoss; SGD with momentum."""
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

digits = load_digits()
X_train, X_test, y_train, y_test = train_test_split(digits.data, digits.target, test_size=0.25,
                                                    random_state=0, stratify=digits.target)
scaler = StandardScaler().fit(X_train)
X_train = torch.tensor(scaler.transform(X_train), dtype=torch.float32).view(-1, 1, 8, 8)
X_test = torch.tensor(scaler.transform(X_test), dtype=torch.float32).view(-1, 1, 8, 8)
y_train = torch.tensor(y_train)
y_test = torch.tensor(y_test)

cnn = nn.Sequential(
    nn.Conv2d(1, 16, kernel_size=3, padding=1),
    nn.ReLU(),
    nn.MaxPool2d(2),
    nn.Conv2d(16, 32, kernel_size=3, padding=1),
    nn.ReLU(),
    nn.Flatten(),
    nn.Linear(32 * 4 * 4, 64),
    nn.ReLU(),
    nn.Linear(64, 10),
    nn.LogSoftmax(dim=1),
)
criterion = nn.NLLLoss()
sgd = optim.SGD(cnn.parameters(), lr=0.05, momentum=0.9)
batches = DataLoader(TensorDataset(X_train, y_train), batch_size=32, shuffle=True)

for epoch in range(4):
    cnn.train()
    running = 0.0
    for images, target in batches:
        sgd.zero_grad()
        loss = criterion(cnn(images), target)
        loss.backward()
        sgd.step()
        running += loss.item()
    cnn.eval()
    with torch.no_grad():
        test_acc = (cnn(X_test).argmax(1) == y_test).float().mean().item()
    print(f"epoch {epoch}: mean train loss {running / len(batches):.4f}, test acc {test_acc:.4f}")
