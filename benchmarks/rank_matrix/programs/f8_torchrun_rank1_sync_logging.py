# FAULT: straggler. Rank 1 was made the "metrics rank": after every step it serialises a histogram
# of every parameter to JSON and appends it to a log file with flush + os.fsync (synchronous),
# ~15-30 ms per step; rank 0 waits for it in the next step's all-reduce.
# Style: torchrun, argparse + main(), DDP, DataLoader over a TensorDataset with DistributedSampler,
# Adam + CosineAnnealingWarmRestarts.
import tempfile
import os, json, argparse
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler

def log_metrics(fh, step, loss, model):
    rec = {"step": step, "loss": float(loss)}
    for name, p in model.named_parameters():
        v = p.detach().flatten()
        gv = p.grad.detach().flatten()
        rec[name] = {"hist": torch.histc(v, bins=64).tolist(), "values": [round(t, 6) for t in v.tolist()],
                     "grad": [round(t, 8) for t in gv.tolist()], "grad_sq": [t * t for t in gv.tolist()]}
    fh.write(json.dumps(rec, indent=1, sort_keys=True) + "\n"); fh.flush(); os.fsync(fh.fileno())

def main():
    ap = argparse.ArgumentParser(); ap.add_argument("--epochs", type=int, default=3); a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1280, 16, generator=g); y = torch.tanh(x[:, :4].sum(1, keepdim=True))
    ds = TensorDataset(x, y); sampler = DistributedSampler(ds, seed=1)
    dl = DataLoader(ds, batch_size=32, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=20)
    fh = open(os.path.join(tempfile.gettempdir(), f"md_rank_matrix_f8_metrics_rank{rank}.jsonl"), "w")
    step = 0
    for ep in range(a.epochs):
        sampler.set_epoch(ep)
        for xb, yb in dl:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step(); sched.step(); step += 1
            if rank == 1:                                   # <-- the fault: synchronous, every step
                log_metrics(fh, step, loss.item(), model.module)
        if rank == 0:
            print(f"epoch {ep} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
