"""Sequence regression with an LSTM: predict a decayed running sum of a noisy signal."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SEQ_LEN, N_SEQ = 20, 1200


def make_sequences(n):
    x = torch.randn(n, SEQ_LEN, 1)
    weights = 0.85 ** torch.arange(SEQ_LEN - 1, -1, -1, dtype=torch.float32)
    target = (x.squeeze(-1) * weights).sum(dim=1, keepdim=True) / 3.0
    return x, target


class SeqModel(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.lstm = nn.LSTM(input_size=1, hidden_size=hidden, batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, seq):
        outputs, _ = self.lstm(seq)
        last = outputs[:, -1, :]
        return self.out(last)


def main():
    torch.manual_seed(5)
    seqs, sums = make_sequences(N_SEQ)
    train_seqs, train_sums = seqs[:1000], sums[:1000]
    test_seqs, test_sums = seqs[1000:], sums[1000:]
    loader = DataLoader(TensorDataset(train_seqs, train_sums), batch_size=40, shuffle=True)
    model = SeqModel()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    huber = nn.SmoothL1Loss()
    for epoch in range(6):
        for batch_x, batch_y in loader:
            optimizer.zero_grad()
            loss = huber(model(batch_x), batch_y)
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            test_loss = huber(model(test_seqs), test_sums).item()
        print(f"epoch={epoch} loss={loss.item():.4f} test_loss={test_loss:.4f}")


if __name__ == "__main__":
    main()
