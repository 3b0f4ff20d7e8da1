# HEALTHY. Style: torchrun, a main() with an EvalLoop on rank 0 only that takes ~2.5 s each epoch
# (longer than 2 s: rank 1 sits in dist.barrier() meanwhile), rank 0 appends one line per step to a
# metrics file, Adam + ReduceLROnPlateau driven by the validation loss (broadcast to all ranks).
import tempfile
import os, json, time
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler

def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [0.0], [1.5], [-1.0]]) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)

def evaluate(model, loader):
    model.eval(); tot, n = 0.0, 0
    with torch.no_grad():
        for xb, yb in loader:
            tot += nn.functional.mse_loss(model(xb), yb, reduction="sum").item(); n += len(xb)
            time.sleep(0.04)              # a slow metric (think: decoding / BLEU) per val batch
    model.train()
    return tot / n

def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    train_ds, val_ds = data(1280, 0), data(3840, 1)
    sampler = DistributedSampler(train_ds, shuffle=True)
    train_dl = DataLoader(train_ds, batch_size=32, sampler=sampler)
    val_dl = DataLoader(val_ds, batch_size=64)                  # 60 batches * 40 ms ~ 2.5 s
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
    log = open(os.path.join(tempfile.gettempdir(), "md_rank_matrix_h6_metrics.jsonl"), "w") if rank == 0 else None
    step = 0
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for xb, yb in train_dl:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step(); step += 1
            if log:
                log.write(json.dumps({"step": step, "loss": loss.item()}) + "\n"); log.flush()
        val = torch.tensor([evaluate(model.module, val_dl) if rank == 0 else 0.0])
        dist.barrier()
        dist.broadcast(val, src=0)
        plateau.step(val.item())
        if rank == 0:
            print(f"epoch {epoch} val_mse {val.item():.4f} lr {opt.param_groups[0]['lr']:.1e}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
