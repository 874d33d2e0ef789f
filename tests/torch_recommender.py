"""PyTorch twin of step 15 (day3/15_recommender_ddp): matrix factorisation with
biases on MovieLens, four nn.Embedding(sparse=True) tables and a global_mean
buffer, MSE plus an L2 term on the batch's rows, torch.optim.SparseAdam; one
process taking the global batches (batch_size = W x the C program's per-rank
batch). The same 90/10 split (splitmix64 of the seed and each rating's line),
the same dense ids (MovieLens ids in increasing order), the same batches
(torch.randperm seeded seed + epoch over the training ratings in file order),
and with --init the same weights (h5py, state_dict names).

usage: python3 torch_recommender.py DATA_DIR [--batch_size N] [--epochs N]
           [--max_steps N] [--lr X] [--weight_decay X] [--dim N] [--seed N]
           [--no-shuffle] [--init ckpt.h5] [--threads N]
prints: one JSON line: per-step losses, the test RMSE, seconds per epoch
(the training loop alone) and the seconds spent reading the CSV.
"""
import argparse, json, os, time
import numpy as np
import torch, torch.nn as nn

MASK = (1 << 64) - 1


def is_test(seed, index):  # common/data/movielens.c's movielens_is_test, on numpy uint64
    with np.errstate(over="ignore"):
        z = np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + index.astype(np.uint64) + np.uint64(1)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z % np.uint64(10) == 0


class MatrixFactorization(nn.Module):
    def __init__(self, n_users, n_items, dim, global_mean):
        super().__init__()
        self.user_embedding = nn.Embedding(n_users, dim, sparse=True)
        self.item_embedding = nn.Embedding(n_items, dim, sparse=True)
        self.user_bias = nn.Embedding(n_users, 1, sparse=True)
        self.item_bias = nn.Embedding(n_items, 1, sparse=True)
        self.register_buffer("global_mean", torch.tensor([global_mean], dtype=torch.float32))
        with torch.no_grad():  # the C program's init: U(-0.05, 0.05) row after row, biases 0
            self.user_embedding.weight.uniform_(-0.05, 0.05)
            self.item_embedding.weight.uniform_(-0.05, 0.05)
            self.user_bias.weight.zero_()
            self.item_bias.weight.zero_()

    def forward(self, user, item):
        p, q = self.user_embedding(user), self.item_embedding(item)
        prediction = (p * q).sum(1) + self.user_bias(user).squeeze(1) + self.item_bias(item).squeeze(1) + self.global_mean
        return prediction, p, q


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--batch_size", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--max_steps", type=int, default=-1)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight_decay", type=float, default=0.1)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-shuffle", action="store_true")
    ap.add_argument("--init")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    start = time.time()
    table = np.loadtxt(os.path.join(a.data, "ratings.csv"), delimiter=",", skiprows=1, usecols=(0, 1, 2),
                       dtype=np.float64) if os.path.getsize(os.path.join(a.data, "ratings.csv")) < 50e6 else \
        np.fromstring(open(os.path.join(a.data, "ratings.csv")).read().split("\n", 1)[1].replace("\n", ","),
                      sep=",").reshape(-1, 4)[:, :3]
    read_seconds = time.time() - start
    users, user = np.unique(table[:, 0].astype(np.int64), return_inverse=True)
    items, item = np.unique(table[:, 1].astype(np.int64), return_inverse=True)
    rating = table[:, 2].astype(np.float32)
    test = is_test(a.seed, np.arange(len(rating)))
    train = ~test
    train_user, train_item, train_rating = (torch.from_numpy(x[train].astype(np.int64 if x is not rating else np.float32))
                                            for x in (user, item, rating))
    test_user, test_item = torch.from_numpy(user[test].astype(np.int64)), torch.from_numpy(item[test].astype(np.int64))
    test_rating = torch.from_numpy(rating[test])
    global_mean = float(np.float32(rating[train].astype(np.float64).sum() / train.sum()))

    torch.manual_seed(a.seed)
    model = MatrixFactorization(len(users), len(items), a.dim, global_mean)
    if a.init:
        import h5py
        with h5py.File(a.init, "r") as f:
            state = {k: torch.from_numpy(np.array(f[k])) for k in model.state_dict()}
        model.load_state_dict(state)
    optimizer = torch.optim.SparseAdam(model.parameters(), lr=a.lr)

    n = len(train_rating)
    losses, epoch_seconds, steps = [], [], 0
    for epoch in range(a.epochs):
        if a.max_steps >= 0 and steps >= a.max_steps:
            break
        epoch_start = time.time()
        order = torch.randperm(n, generator=torch.Generator().manual_seed(a.seed + epoch)) if not a.no_shuffle \
            else torch.arange(n)
        for b in range(0, n, a.batch_size):
            if steps == a.max_steps:
                break
            batch = order[b:b + a.batch_size]
            u, i, r = train_user[batch], train_item[batch], train_rating[batch]
            optimizer.zero_grad()
            prediction, p, q = model(u, i)
            loss = ((prediction - r) ** 2).mean() + a.weight_decay * ((p * p).sum(1) + (q * q).sum(1)).mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            steps += 1
        epoch_seconds.append(time.time() - epoch_start)
    with torch.no_grad():
        prediction, _, _ = model(test_user, test_item)
        rmse = float(((prediction - test_rating) ** 2).double().mean().sqrt())
    print(json.dumps({"losses": losses, "test_rmse": rmse, "epoch_seconds": epoch_seconds, "read_seconds": read_seconds,
                      "n_users": len(users), "n_items": len(items)}))


if __name__ == "__main__":
    main()
