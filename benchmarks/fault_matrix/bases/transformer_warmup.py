"""A small TransformerEncoder classifies token sequences (which marker token is most frequent);
linear LR warmup with LambdaLR, gradient clipping."""
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, LENGTH, CLASSES = 16, 12, 4
WARMUP = 30


def sample_batch(n, gen):
    tokens = torch.randint(CLASSES, VOCAB, (n, LENGTH), generator=gen)
    label = torch.randint(0, CLASSES, (n,), generator=gen)
    pos = torch.rand(n, LENGTH, generator=gen) < 0.35
    tokens[pos] = label.unsqueeze(1).expand(-1, LENGTH)[pos]
    return tokens, label


class TinyTransformer(nn.Module):
    def __init__(self, d_model=32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Parameter(torch.zeros(1, LENGTH, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=64, dropout=0.1,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        self.cls = nn.Linear(d_model, CLASSES)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos
        h = self.encoder(h)
        return self.cls(h.mean(dim=1))


gen = torch.Generator().manual_seed(11)
val_tokens, val_labels = sample_batch(512, gen)
model = TinyTransformer()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / WARMUP))

for step in range(160):
    tokens, labels = sample_batch(64, gen)
    model.train()
    loss = F.cross_entropy(model(tokens), labels)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    opt.step()
    warmup.step()
    if step % 40 == 39:
        model.eval()
        with torch.no_grad():
            val_logits = model(val_tokens)
            acc = (val_logits.argmax(-1) == val_labels).float().mean().item()
        print(f"step {step + 1}: loss {loss.item():.3f}, lr {warmup.get_last_lr()[0]:.2e}, "
              f"val_acc {acc:.3f}")
