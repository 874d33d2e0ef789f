#!/usr/bin/env python3
"""The PyTorch twin of day5/19_gpt: nanoGPT's GPT (model.py) and training loop (train.py), character-level.

Written for this workshop from nanoGPT's architecture and optimizer, not nanoGPT's code: the same
model (LayerNorm -> causal self-attention -> residual -> LayerNorm -> MLP with exact GELU ->
residual, the head tied to wte, nanoGPT's init and state_dict names), AdamW with weight decay on
the 2-D parameters only, warm-up then cosine decay, clipping at a global norm, gradient
accumulation, and the batches of day5/19_gpt: each iteration one global batch of windows drawn by
torch.randint from a generator seeded with --seed, rank r's micro-step m taking its slice
(r * accum_steps + m); evaluation from a generator of its own (--seed + 1); --dropout's masks from
torch's generator seeded for each micro-batch as day5/19_gpt seeds its own (PyTorch's CPU bernoulli_
in a build without MKL, as Debian's: a 53-bit uniform of each 64-bit draw).

    python3 tests/torch_gpt.py DATA_DIR WORLD_SIZE [--init w.h5] [--save w.h5] [--max_iters N] ...
    python3 tests/torch_gpt.py DATA_DIR 1 --device cuda [--dtype bfloat16] ...   (a GPU's yardstick: tests/bench_gpu.sh)
    python3 tests/torch_gpt.py DATA_DIR 1 --dtype bfloat16_operands ...   (day5/19_gpt --dtype bfloat16's arithmetic)

--dtype bfloat16 runs the matmuls under torch.autocast, as nanoGPT does; bfloat16_operands rounds
every matmul's two operands to bfloat16 and multiplies them in float32, forward and backward (the
products exact, the sums float32's), which is what day5/19_gpt --dtype bfloat16 computes. Autocast
also rounds each product's result, through kernels that depend on the CPU (oneDNN's).

Prints, per evaluation, "step N: train loss X, val loss Y", and as its last line a JSON object:
{"losses": [...], "evals": [[iter, train, val], ...], "train_seconds": S, "iters": N}. Weights go
in and out as HDF5 with one dataset per state_dict key (h5py), the layout of common/h5.h.
"""
import argparse, json, math, os, sys, time

import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


ROUND_OPERANDS = False  # --dtype bfloat16_operands


def to_bf16(t):  # t's values rounded to bfloat16 (to nearest, ties to even), kept in t's dtype
    return t.to(torch.bfloat16).to(t.dtype)


class RoundedMatmul(torch.autograd.Function):
    """a @ b with both operands rounded to bfloat16, and so each product of the backward pass."""
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return to_bf16(a) @ to_bf16(b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad = to_bf16(grad)
        return grad @ to_bf16(b).transpose(-2, -1), to_bf16(a).transpose(-2, -1) @ grad


def matmul(a, b):
    return RoundedMatmul.apply(a, b) if ROUND_OPERANDS else a @ b


class Linear(nn.Linear):  # nn.Linear, its matmul rounded under --dtype bfloat16_operands
    def forward(self, x):
        if not ROUND_OPERANDS:
            return super().forward(x)
        y = matmul(x.reshape(-1, x.size(-1)), self.weight.t()).view(*x.shape[:-1], -1)
        return y + self.bias if self.bias is not None else y


class LayerNorm(nn.Module):
    """nn.LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1), as nanoGPT's."""
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.c_proj = Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.attn_dropout = nn.Dropout(c.dropout)
        self.resid_dropout = nn.Dropout(c.dropout)
        self.n_head = c.n_head
        mask = torch.tril(torch.ones(c.block_size, c.block_size)).view(1, 1, c.block_size, c.block_size)
        self.register_buffer("mask", mask, persistent=False)  # not in the state_dict

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = matmul(att, v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.gelu = nn.GELU()
        self.c_proj = Linear(4 * c.n_embd, c.n_embd, bias=c.bias)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = LayerNorm(c.n_embd, c.bias)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = LayerNorm(c.n_embd, c.bias)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c.vocab_size, c.n_embd),
            wpe=nn.Embedding(c.block_size, c.n_embd),
            drop=nn.Dropout(c.dropout),
            h=nn.ModuleList([Block(c) for _ in range(c.n_layer)]),
            ln_f=LayerNorm(c.n_embd, c.bias)))
        self.lm_head = Linear(c.n_embd, c.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    def forward(self, idx, targets):
        B, T = idx.size()
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def load_text(directory):
    data = open(os.path.join(directory, "input.txt"), "rb").read()  # characters are bytes, as the C program's
    chars = sorted(set(data))
    stoi = {ch: i for i, ch in enumerate(chars)}
    tokens = torch.tensor([stoi[b] for b in data], dtype=torch.long)
    n_train = int(len(tokens) * 0.9)
    return tokens[:n_train], tokens[n_train:], len(chars)


def windows(data, offsets, block_size):
    x = torch.stack([data[i:i + block_size] for i in offsets.tolist()])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in offsets.tolist()])
    return x, y


def worker(rank, a, queue):
    world = a.world_size
    torch.set_num_threads(a.threads or max(1, (os.cpu_count() or 1) // world))
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(a.port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    train, val, vocab_size = load_text(a.data)
    a.vocab_size = vocab_size
    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    # --dtype bfloat16: the matmuls under torch.autocast, the weights and AdamW's state in float32.
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=a.dtype == "bfloat16")
    global ROUND_OPERANDS
    ROUND_OPERANDS = a.dtype == "bfloat16_operands"  # (set here: each spawned rank runs this)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model = GPT(a)
    if a.init:
        import h5py
        with h5py.File(a.init, "r") as f:
            state = {k: torch.from_numpy(f[k][()]) for k in model.state_dict()}
        model.load_state_dict(state)
    model.to(device)
    raw = model
    if world > 1:
        model = DDP(model, bucket_cap_mb=a.bucket_mb)
    # configure_optimizers: decay the 2-D parameters, not the others.
    params = [p for p in raw.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=a.learning_rate, betas=(a.beta1, a.beta2), foreach=False)

    def get_lr(it):
        if it < a.warmup_iters:
            return a.learning_rate * (it + 1) / (a.warmup_iters + 1)
        if it > a.lr_decay_iters or a.lr_decay_iters <= a.warmup_iters:
            return a.min_lr
        ratio = (it - a.warmup_iters) / (a.lr_decay_iters - a.warmup_iters)
        return a.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (a.learning_rate - a.min_lr)

    per_rank = a.batch_size * a.accum_steps
    global_batch = per_rank * world
    train_gen = torch.Generator().manual_seed(a.seed)
    eval_gen = torch.Generator().manual_seed(a.seed + 1)

    def my_slice(offsets, m):
        first = (rank * a.accum_steps + m) * a.batch_size
        return offsets[first:first + a.batch_size]

    @torch.no_grad()
    def estimate_loss(data):
        raw.eval()
        total = 0.0
        for _ in range(a.eval_iters):
            offsets = torch.randint(len(data) - a.block_size, (global_batch,), generator=eval_gen)
            for m in range(a.accum_steps):
                x, y = windows(data, my_slice(offsets, m), a.block_size)
                with autocast:
                    total += raw(x.to(device), y.to(device)).item()
        total = torch.tensor([total], dtype=torch.float32)
        if world > 1:
            dist.all_reduce(total)
        raw.train()
        return total.item() / (a.eval_iters * a.accum_steps * world)

    losses, evals, train_seconds = [], [], 0.0
    for it in range(a.max_iters + 1):
        if it % a.eval_interval == 0 or it == a.max_iters:
            tl, vl = estimate_loss(train), estimate_loss(val)
            evals.append([it, tl, vl])
            if rank == 0:
                print(f"step {it}: train loss {tl:.4f}, val loss {vl:.4f}", flush=True)
        if it == a.max_iters:
            break
        sync()
        start = time.perf_counter()
        lr = get_lr(it)
        for group in optimizer.param_groups:
            group["lr"] = lr
        offsets = torch.randint(len(train) - a.block_size, (global_batch,), generator=train_gen)
        loss_sum = 0.0
        for m in range(a.accum_steps):
            x, y = windows(train, my_slice(offsets, m), a.block_size)
            if world > 1:
                model.require_backward_grad_sync = m == a.accum_steps - 1
            # The dropout masks of this micro-batch of the global batch, as day5/19_gpt seeds them.
            torch.manual_seed((a.seed << 32) + (1 << 31) + it * a.accum_steps * world + rank * a.accum_steps + m)
            with autocast:
                loss = model(x.to(device), y.to(device))
            loss_sum += loss.item()
            (loss / a.accum_steps).backward()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(raw.parameters(), a.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step_loss = torch.tensor([loss_sum], dtype=torch.float32)
        if world > 1:
            dist.all_reduce(step_loss)
        sync()
        train_seconds += time.perf_counter() - start
        losses.append(step_loss.item() / (a.accum_steps * world))
    if rank == 0:
        if a.save:
            import h5py
            with h5py.File(a.save, "w") as f:
                for k, v in raw.state_dict().items():
                    f[k] = v.cpu().numpy()
        queue.put(json.dumps({"losses": losses, "evals": evals, "train_seconds": train_seconds,
                              "iters": a.max_iters}))
    if world > 1:
        # Every rank past its last collective, then out without the process group's teardown: with
        # Debian's torch and gloo, a 2-rank run has now and then hung in it at exit (CI, November
        # 2026), its results already out. (The queue's message is written: put returns after it.)
        dist.barrier()
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("world_size", type=int)
    for name, kind, default in [("n_layer", int, 4), ("n_head", int, 4), ("n_embd", int, 128), ("block_size", int, 64),
                                ("batch_size", int, 12), ("max_iters", int, 2000), ("learning_rate", float, 1e-3),
                                ("min_lr", float, 1e-4), ("warmup_iters", int, 100), ("lr_decay_iters", int, 2000),
                                ("weight_decay", float, 0.1), ("beta1", float, 0.9), ("beta2", float, 0.99),
                                ("grad_clip", float, 1.0), ("accum_steps", int, 1), ("eval_interval", int, 250),
                                ("eval_iters", int, 20), ("seed", int, 1337), ("threads", int, 0),
                                ("bucket_mb", float, 25.0), ("port", int, 29531), ("dropout", float, 0.0)]:
        p.add_argument("--" + name, type=kind, default=default)
    p.add_argument("--bias", action="store_true")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "bfloat16_operands"])
    p.add_argument("--init")
    p.add_argument("--save")
    a = p.parse_args()
    if a.device == "cuda" and a.world_size != 1:
        p.error("--device cuda runs one process (WORLD_SIZE 1)")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    if a.world_size == 1:
        worker(0, a, queue)
    else:
        mp.spawn(worker, args=(a, queue), nprocs=a.world_size, join=True)
    print(queue.get())


if __name__ == "__main__":
    main()
