"""Sentiment of short reviews: word ids, dict batches, a transformer encoder with a padding mask."""
import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

MAX_LEN = 128
GOOD = ["great", "fine", "lovely", "superb", "solid"]
BAD = ["awful", "broken", "poor", "dull", "faulty"]
FILLER = [f"w{i}" for i in range(150)]


def review(rng):
    words = rng.choices(FILLER, k=rng.randint(4, 28))
    label = rng.randrange(2)
    for _ in range(2):
        words.insert(rng.randrange(len(words) + 1), rng.choice(GOOD if label else BAD))
    return " ".join(words), label


class Vocab:
    def __init__(self, texts):
        self.index = {"<pad>": 0, "<unk>": 1}
        for text in texts:
            for word in text.split():
                self.index.setdefault(word, len(self.index))

    def encode(self, text):
        return [self.index.get(w, 1) for w in text.split()][:MAX_LEN]


class Reviews(Dataset):
    def __init__(self, texts, labels, vocab):
        self.texts, self.labels, self.vocab = texts, labels, vocab

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, i):
        return {"input_ids": torch.tensor(self.vocab.encode(self.texts[i])),
                "label": int(self.labels[i])}


def collate(items):
    ids = pad_sequence([item["input_ids"] for item in items], batch_first=True)
    return {"input_ids": ids, "attention_mask": ids != 0,
            "labels": torch.tensor([item["label"] for item in items])}


class Encoder(nn.Module):
    def __init__(self, vocab_size, dim=32):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.pos = nn.Embedding(MAX_LEN, dim)
        block = nn.TransformerEncoderLayer(dim, 4, dim_feedforward=64, dropout=0.1,
                                           batch_first=True)
        self.blocks = nn.TransformerEncoder(block, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 2)

    def forward(self, input_ids, attention_mask):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.blocks(self.tok(input_ids) + self.pos(positions),
                        src_key_padding_mask=~attention_mask)
        keep = attention_mask.unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1))


def main():
    rng = random.Random(5)
    texts, labels = zip(*(review(rng) for _ in range(1600)))
    labels = torch.tensor(labels)
    vocab = Vocab(texts[:1200])
    train = DataLoader(Reviews(texts[:1200], labels[:1200], vocab), batch_size=32,
                       shuffle=True, collate_fn=collate)
    val = DataLoader(Reviews(texts[1200:], labels[1200:], vocab), batch_size=200,
                     collate_fn=collate)
    torch.manual_seed(5)
    model = Encoder(len(vocab.index))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    total = 4 * len(train)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / total)))
    for epoch in range(4):
        model.train()
        for batch in train:
            logits = model(batch["input_ids"], batch["attention_mask"])
            loss = F.cross_entropy(logits, batch["labels"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        model.eval()
        right = 0
        with torch.no_grad():
            for batch in val:
                right += (model(batch["input_ids"], batch["attention_mask"]).argmax(1)
                          == batch["labels"]).sum().item()
        print(f"epoch {epoch + 1} loss {loss.item():.4f} val_acc {right / 400:.3f}")


if __name__ == "__main__":
    main()
