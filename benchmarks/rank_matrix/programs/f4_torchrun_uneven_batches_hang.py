# FAULT: hang. The 1025 samples are split by stride (rank 0: 513, rank 1: 512) and batched WITHOUT
# drop_last, so rank 0 has 17 batches per epoch and rank 1 has 16. Rank 1 finishes its 48 steps and
# leaves; rank 0's 49th backward waits in DDP's all-reduce for a peer that never comes.
# Style: torchrun, top-level script with a train_one_epoch() helper, TensorDataset + Subset +
# DataLoader(shuffle=True), AdamW.
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, Subset

def train_one_epoch(model, loader, opt, loss_fn):
    total = 0.0
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        total += loss.item()
    return total / len(loader)

if __name__ == "__main__":
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(1025, 12, generator=g); Y = (X[:, 0] - X[:, 5] > 0).long()
    shard = Subset(TensorDataset(X, Y), range(rank, len(X), world))
    loader = DataLoader(shard, batch_size=32, shuffle=True)     # <-- no drop_last: 17 vs 16 batches
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(3):
        avg = train_one_epoch(model, loader, opt, nn.CrossEntropyLoss())
        print(f"rank {rank} epoch {epoch} avg loss {avg:.4f}", flush=True)
    dist.destroy_process_group()
