"""Real OOM incidents on a real GPU, each with what really caused it: the labelled set the rules are
checked against on hardware (tests/gpu/test_gpu_incidents.py runs each mode under ``triage-run``).

One small GPT-style model (token embedding, pre-norm attention and MLP blocks, a vocabulary head, AdamW,
bf16 autocast) trained on random tokens, so every mode is the same job with one thing changed:

  leak           each step keeps the step's logits in a list for "later analysis": live memory grows by
                 one batch of logits per step until the device is full (site: the lm_head line)
  too-large      a batch the first step cannot fit (the DataLoader's batch size is recorded)
  too-large-later  steps at a short sequence length fit; the curriculum then moves to a longer one
  neighbour      another process holds most of the device; the same batch fits on an idle device
  fragmentation  variable sequence lengths, and the previous step's per-layer memories kept across the
                 step: the cache holds many partly used segments
  slow-leak B    each step keeps the last 128 positions of its logits in fp32: a leak much smaller than the
                 step, so the OOM comes in a step's peak (site: the SLOW-LEAK-LINE)
  batch-grow A B six steps at batch A fit; the schedule then moves to batch B, which does not
  eval-leak B    a validation loop without torch.no_grad() keeping every batch's output (and so its graph)
  bisect S HI    no crash: the largest batch that runs two full steps at sequence length S, by bisection
                 (a fresh model each try, the cache emptied between): the truth for max_batch_size
  hold GiB       allocate GiB on the device and wait (the neighbour)

OOMT_FRACTION=F caps the process at F of the device before any mode runs (a platform's wrapper would).
"""

import gc
import os
import random
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

SMOKE = (
    os.environ.get("OOMT_INCIDENTS_SMOKE") == "1"
)  # a few tiny steps on the CPU, no autocast: the script itself
dev = torch.device("cpu") if SMOKE else torch.device("cuda", 0)
GiB = 1024**3
VOCAB = 512 if SMOKE else 32000
HIDDEN = 256 if SMOKE else 1024
LAYERS = 2 if SMOKE else 8
SEQ = 64 if SMOKE else 2048
STEPS = 3 if SMOKE else 100_000


class Tokens(Dataset):
    def __init__(self, n, seq):
        self.n, self.seq = n, seq

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, VOCAB, (self.seq + 1,), generator=g)


class Block(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)
        self.heads = h // 128

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(Block(HIDDEN) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids, mems=None):
        x = self.emb(ids)
        kept = []
        for i, blk in enumerate(self.blocks):
            if mems:
                x = x + mems[i][:, : x.shape[1]].mean() * 0
            x = blk(x)
            if mems is not None:
                kept.append(x.detach().clone())
        logits = self.lm_head(self.norm(x))  # LOGITS-LINE
        return logits, kept


def make():
    torch.manual_seed(0)
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt


def train_step(model, opt, batch, mems=None):
    """one optimizer step; ``mems`` (a list, possibly empty) turns on the kept per-layer memories"""
    ids, tgt = batch[:, :-1].to(dev), batch[:, 1:].to(dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=not SMOKE):
        logits, kept = model(ids, mems)
    loss = F.cross_entropy(logits.float().view(-1, VOCAB), tgt.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss, logits, kept


def leak():
    model, opt = make()
    history = []
    loader = DataLoader(Tokens(1 << 20, SEQ), batch_size=8)
    for step, batch in enumerate(loader):
        loss, logits, _ = train_step(model, opt, batch)
        history.append(logits)  # kept for "later analysis": the leak
        if step >= STEPS:
            return
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)


def too_large(batch):
    model, opt = make()
    loader = DataLoader(Tokens(1 << 20, SEQ), batch_size=batch)
    for step, b in enumerate(loader):
        loss, _, _ = train_step(model, opt, b)
        print(f"step {step} loss {loss.item():.3f}", flush=True)
        if step >= STEPS:
            return


def too_large_later(batch, short, long):
    model, opt = make()
    for step in range(min(100, STEPS + 6)):
        seq = short if step < 6 else long  # the curriculum's next stage
        b = torch.stack([Tokens(1 << 20, seq)[step * batch + i] for i in range(batch)])
        loss, _, _ = train_step(model, opt, b)
        print(f"step {step} seq {seq} loss {loss.item():.3f}", flush=True)


def fragmentation(batch):
    model, opt = make()
    rng = random.Random(0)
    mems = []
    for step in range(min(400, STEPS)):
        seq = SEQ // 16 * rng.randint(2, 16)  # 256..2048 tokens on the GPU
        b = torch.stack([Tokens(1 << 20, seq)[step * batch + i] for i in range(batch)])
        loss, _, kept = train_step(model, opt, b, mems)
        mems = kept  # the previous step's per-layer memories, kept across the step
        print(f"step {step} seq {seq} loss {loss.item():.3f}", flush=True)


def slow_leak(batch):
    """a leak far smaller than a step: the OOM comes in a step's peak, as a too-large batch's would"""
    model, opt = make()
    tails = []
    loader = DataLoader(Tokens(1 << 20, SEQ), batch_size=batch)
    for step, b in enumerate(loader):
        loss, logits, _ = train_step(model, opt, b)
        tails.append(logits[:, -128:].float())  # SLOW-LEAK-LINE: the last positions, kept for a metric
        print(f"step {step} loss {loss.item():.3f}", flush=True)
        if step >= STEPS:
            return


def batch_grow(small, big):
    """steps at a batch that fits, then the schedule's next batch size, which does not"""
    model, opt = make()
    for step in range(min(100, STEPS + 6)):
        batch = small if step < 6 else big
        b = torch.stack([Tokens(1 << 20, SEQ)[step * big + i] for i in range(batch)])
        loss, _, _ = train_step(model, opt, b)
        print(f"step {step} batch {batch} loss {loss.item():.3f}", flush=True)


def eval_leak(batch):
    """a validation loop without torch.no_grad() that keeps every batch's output: each output holds its
    whole autograd graph (the activations of that batch) alive"""
    model, opt = make()
    for step in range(3):
        b = torch.stack([Tokens(1 << 20, SEQ)[step * batch + i] for i in range(batch)])
        train_step(model, opt, b)
    model.eval()
    outputs = []
    for i in range(min(10_000, STEPS)):
        b = torch.stack([Tokens(1 << 20, SEQ)[(1000 + i) * batch + j] for j in range(batch)])
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=not SMOKE):
            logits, _ = model(b[:, :-1].to(dev))  # EVAL-CALL-LINE
        outputs.append(logits[:, -1])  # EVAL-LEAK-LINE: a view: keeps the logits and the graph
        print(f"eval batch {i}", flush=True)


def fits(batch, seq):
    """does ``batch`` run two full steps at ``seq``? A fresh model and optimizer, the cache emptied after"""
    if not SMOKE:
        torch.cuda.reset_peak_memory_stats()
    ok = True
    try:
        model, opt = make()
        for step in range(2):
            b = torch.stack([Tokens(1 << 20, seq)[step * batch + i] for i in range(batch)])
            loss, _, _ = train_step(model, opt, b)
            loss.item()
    except torch.OutOfMemoryError:
        ok = False
    if SMOKE:
        return ok
    model = opt = b = loss = None
    peak = torch.cuda.max_memory_allocated()
    gc.collect()
    torch.cuda.empty_cache()
    print(f"PROBE batch={batch} seq={seq} fits={int(ok)} peak={peak}", flush=True)
    return ok


def bisect(seq, hi):
    """the largest batch that runs two full steps at ``seq`` (hi must not fit)"""
    lo = 1
    if SMOKE:
        fits(2, seq)
        return
    if not fits(lo, seq):
        print("MAXBATCH=0", flush=True)
        return
    while fits(hi, seq):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid, seq):
            lo = mid
        else:
            hi = mid
    print(f"MAXBATCH={lo}", flush=True)


def hold(gib):
    x = torch.empty(int(gib * GiB), dtype=torch.uint8, device=dev)
    print("HOLDING", x.numel(), os.getpid(), flush=True)
    time.sleep(3600)


MODES = {
    "leak": leak,
    "too-large": too_large,
    "neighbour": too_large,  # the same job; the test starts the neighbour
    "too-large-later": too_large_later,
    "fragmentation": fragmentation,
    "slow-leak": slow_leak,
    "batch-grow": batch_grow,
    "eval-leak": eval_leak,
    "bisect": bisect,
    "hold": hold,
}

if __name__ == "__main__":
    if sys.argv[1] not in MODES:
        raise SystemExit(f"unknown mode {sys.argv[1]}; one of {', '.join(MODES)}")
    if os.environ.get("OOMT_FRACTION") and not SMOKE:
        # the platform's cap, as a wrapper around the job would set it: the training code does not know
        torch.cuda.set_per_process_memory_fraction(float(os.environ["OOMT_FRACTION"]), 0)
    MODES[sys.argv[1]](*(int(a) for a in sys.argv[2:]))
