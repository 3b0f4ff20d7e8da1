# FAULT: NaN that starts on rank 1's data. Sample 1001 of the "sensor log" is corrupt (a NaN
# reading). The strided split puts it in rank 1's shard, at rank 1's 16th batch; its loss is NaN,
# DDP's all-reduce spreads the NaN gradient to rank 0, and both replicas become NaN from then on.
# Style: torchrun, a small Experiment class with setup()/run(), hand-made batches (no DataLoader),
# gradient clipping, SGD with momentum + LinearLR warmup.
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

class Experiment:
    def setup(self):
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.set_num_threads(1)
        g = torch.Generator().manual_seed(0)
        X = torch.randn(2048, 14, generator=g)
        Y = X[:, :2].sum(1, keepdim=True) - 0.5 * X[:, 2:3]
        X[1001, 4] = float("nan")                      # <-- the corrupt reading (odd index: rank 1)
        self.X, self.Y = X[self.rank::self.world], Y[self.rank::self.world]
        torch.manual_seed(0)
        self.model = DDP(nn.Sequential(nn.Linear(14, 40), nn.Tanh(), nn.Linear(40, 1)))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.LinearLR(self.opt, start_factor=0.2, total_iters=10)

    def run(self, epochs=2, bs=32):
        for ep in range(epochs):
            for i in range(0, len(self.X), bs):
                xb, yb = self.X[i:i + bs], self.Y[i:i + bs]
                self.opt.zero_grad()
                loss = nn.functional.mse_loss(self.model(xb), yb)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.opt.step(); self.sched.step()
            if self.rank == 0:
                print(f"epoch {ep} loss {loss.item():.4f}", flush=True)
        dist.destroy_process_group()

if __name__ == "__main__":
    e = Experiment(); e.setup(); e.run()
