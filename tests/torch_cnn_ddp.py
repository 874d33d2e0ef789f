"""PyTorch reference for step 14 (day3/14_cnn_ddp): the torchrun tutorial's
SimpleCNN on MNIST under DDP (CPU, gloo), Adam lr 1e-3, batch 64 per rank,
1 epoch, DistributedSampler. MNIST is read from local IDX files, as
torch_mnist_ddp.py does. Needs Debian's python3-torch (python3-h5py for
--init and --save-init).

usage: python3 torch_cnn_ddp.py MNIST_DIR WORLD_SIZE [--epochs N] [--batch N]
           [--lr X] [--seed N] [--no-shuffle] [--max-steps N] [--init ckpt.h5]
           [--save-init ckpt.h5] [--threads N] [--device cpu|cuda]
           [--dtype float32|bfloat16]   (bfloat16: forward, loss and test under torch.autocast)
prints: one JSON line with wall times, per-step losses (rank 0's), test loss,
test accuracy and the confusion matrix (rows: true class).
"""
import argparse, gzip, json, os, struct, time
import numpy as np
import torch, torch.nn as nn, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def read_idx(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rb") as f:
        raw = f.read()
    magic, = struct.unpack(">I", raw[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(mnist_dir, split):
    pre = "train" if split == "train" else "t10k"
    def find(stem):
        for ext in ("", ".gz"):
            p = os.path.join(mnist_dir, stem + ext)
            if os.path.exists(p):
                return p
        raise FileNotFoundError(stem)
    x = read_idx(find(f"{pre}-images-idx3-ubyte")).reshape(-1, 1, 28, 28).astype(np.float32) / 255.0
    y = read_idx(find(f"{pre}-labels-idx1-ubyte")).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


class SimpleCNN(nn.Module):  # the torchrun tutorial's model
    def __init__(self):
        super().__init__()
        self.network = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return self.network(x)


def worker(rank, ws, a, q):
    torch.set_num_threads(a.threads or max(1, (os.cpu_count() or 1) // ws))
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(a.port)
    cuda = a.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=ws)
    dev = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(dev)
    torch.manual_seed(a.seed)
    model = SimpleCNN()
    if a.save_init and rank == 0:
        import h5py
        with h5py.File(a.save_init, "w") as f:
            for k, v in model.state_dict().items():
                f[k] = v.numpy()
    if a.init:
        import h5py
        with h5py.File(a.init, "r") as f:
            model.load_state_dict({k: torch.from_numpy(f[k][...]) for k in model.state_dict()})
    t_load = time.time()
    x, y = load(a.mnist, "train")
    ds = TensorDataset(x, y)
    sampler = DistributedSampler(ds, num_replicas=ws, rank=rank, shuffle=not a.no_shuffle, seed=a.seed)
    loader = DataLoader(ds, batch_size=a.batch, sampler=sampler)
    model = DDP(model.to(dev), device_ids=[rank] if cuda else None)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    crit = nn.CrossEntropyLoss()
    autocast = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=a.dtype == "bfloat16")
    losses = []
    epochs = a.epochs if a.max_steps < 0 else -(-a.max_steps // len(loader))
    dist.barrier()
    t0 = time.time()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for data, target in loader:
            if len(losses) == a.max_steps:
                break
            data, target = data.to(dev), target.to(dev)
            opt.zero_grad()
            with autocast:
                loss = crit(model(data), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    t_train = time.time() - t0
    if rank == 0:
        xt, yt = load(a.mnist, "test")
        with torch.no_grad(), autocast:
            logits = torch.cat([model(xt[i:i + 1000].to(dev)).float().cpu() for i in range(0, len(xt), 1000)])
        test_loss = nn.functional.cross_entropy(logits, yt, reduction="sum").item() / len(yt)
        pred = logits.argmax(1)
        confusion = torch.zeros(10, 10, dtype=torch.long)
        confusion.index_put_((yt, pred), torch.ones_like(yt), accumulate=True)
        q.put({"world_size": ws, "train_s": t_train, "load_s": t0 - t_load, "steps": len(losses),
               "losses": losses, "test_loss": test_loss, "test_acc": (pred == yt).float().mean().item(),
               "confusion": confusion.tolist(), "lr": a.lr, "torch": torch.__version__,
               "threads_per_rank": torch.get_num_threads()})
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("mnist"); p.add_argument("world_size", type=int)
    p.add_argument("--epochs", type=int, default=1); p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.001); p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-shuffle", action="store_true"); p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--init"); p.add_argument("--save-init")
    p.add_argument("--threads", type=int, default=0, help="per rank (0: the cores / world size)")
    p.add_argument("--port", type=int, default=29521)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    a = p.parse_args()
    t = time.time()
    ctx = mp.get_context("spawn"); q = ctx.SimpleQueue()
    mp.spawn(worker, args=(a.world_size, a, q), nprocs=a.world_size, join=True)
    r = q.get(); r["wall_s"] = time.time() - t
    print(json.dumps(r))
