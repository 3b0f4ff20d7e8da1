"""Intent classification of variable-length commands: packed LSTM over padded token batches."""
import random

import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset

VOCAB = 60
INTENTS = 3


def synth_command(rng):
    length = rng.randint(3, 48)
    words = [rng.randint(4, VOCAB - 1) for _ in range(length)]
    intent = rng.randrange(INTENTS)
    for pos in rng.sample(range(length), 2):
        words[pos] = 1 + intent
    return words, intent


class Commands(Dataset):
    def __init__(self, n, seed):
        rng = random.Random(seed)
        self.items = [synth_command(rng) for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        words, intent = self.items[i]
        return torch.tensor(words), intent


def collate(batch):
    seqs, intents = zip(*batch)
    lengths = torch.tensor([len(s) for s in seqs])
    return pad_sequence(seqs, batch_first=True), lengths, torch.tensor(intents)


class IntentNet(nn.Module):
    def __init__(self, dim=24, hidden=32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, padding_idx=0)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True)
        self.head = nn.Linear(hidden, INTENTS)

    def forward(self, tokens, lengths):
        emb = self.embed(tokens)
        packed = pack_padded_sequence(emb, lengths, batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)
        return self.head(h[-1])


def evaluate(model, loader):
    model.eval()
    right = total = 0
    with torch.no_grad():
        for tokens, lengths, intents in loader:
            right += (model(tokens, lengths).argmax(1) == intents).sum().item()
            total += len(intents)
    model.train()
    return right / total


def main():
    torch.manual_seed(21)
    train = DataLoader(Commands(1200, 1), batch_size=40, shuffle=True, collate_fn=collate)
    val = DataLoader(Commands(400, 2), batch_size=100, collate_fn=collate)
    model = IntentNet()
    opt = torch.optim.Adam(model.parameters(), lr=4e-3)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(4):
        for tokens, lengths, intents in train:
            opt.zero_grad()
            loss = criterion(model(tokens, lengths), intents)
            loss.backward()
            opt.step()
        print(f"epoch {epoch} loss {loss.item():.4f} val_acc {evaluate(model, val):.3f}")


if __name__ == "__main__":
    main()
