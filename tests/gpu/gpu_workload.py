"""Training workloads that hit a real CUDA OOM, run by tests/gpu/test_gpu_collector.py under triage-run.

Modes (argv[1]):
  leak        each step keeps a 1 GiB tensor alive in a global list (and its activations) until the GPU is full
  big-batch   a DataLoader whose batch makes the first forward pass need more than the whole GPU
  fraction    set_per_process_memory_fraction(0.05), then allocate until the cap rejects
  measure     no crash: time the collector's step hook with the real allocator stats, and a real
              100,000-entry torch.cuda.memory._snapshot()
"""

import json
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

MODE = sys.argv[1]
dev = torch.device("cuda", 0)
GiB = 1024**3
KEPT = []


class Indices(Dataset):
    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        return i


def leaky_step(model, opt, x):
    y = model(x)
    loss = y.float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    KEPT.append(torch.empty(GiB, dtype=torch.uint8, device=dev))  # the leak: never released
    return loss.item()


def leak():
    model = torch.nn.Linear(1024, 1024).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Indices(), batch_size=64)
    for step, idx in enumerate(loader):
        x = torch.randn(len(idx), 1024, device=dev)
        leaky_step(model, opt, x)
        if step > 10_000:
            raise SystemExit("no OOM?")


def big_batch():
    total = torch.cuda.get_device_properties(0).total_memory
    hidden = 65536
    batch = int(total // (hidden * 4)) * 2  # the first activation alone is twice the GPU
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 8)).to(
        dev
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Indices(), batch_size=batch, sampler=range(batch * 3))
    print(f"BATCH={batch}", flush=True)
    for idx in loader:
        x = torch.randn(len(idx), 64, device=dev)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()


def fraction():
    torch.cuda.set_per_process_memory_fraction(0.05, 0)
    print(f"CAP={int(0.05 * torch.cuda.get_device_properties(0).total_memory)}", flush=True)
    model = torch.nn.Linear(256, 256).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(10_000):
        model(torch.randn(32, 256, device=dev)).sum().backward()
        opt.step()
        KEPT.append(torch.empty(256 * 1024**2, dtype=torch.uint8, device=dev))


def measure():
    from collector import _torch
    from collector._state import STATE

    model = torch.nn.Linear(64, 64).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model(torch.randn(8, 64, device=dev)).sum().backward()
    opt.step()  # CUDA initialised, the collector's history and observer are set up
    n = 20_000
    t0 = time.perf_counter()
    for _ in range(n):
        _torch._on_optimizer_step(opt, (), {})
    hook_us = (time.perf_counter() - t0) / n * 1e6
    STATE.timeline.clear()
    # a 100,000-entry trace (the default ring) of small alloc/free pairs with Python stacks
    t0 = time.perf_counter()
    for _ in range(40_000):
        a = torch.empty(1024, device=dev)
        del a
    torch.cuda.synchronize()
    fill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    snap = torch.cuda.memory._snapshot()
    snap_s = time.perf_counter() - t0
    entries = sum(len(t) for t in snap["device_traces"])
    import io

    from collector import _encode

    t0 = time.perf_counter()
    buf = io.BytesIO()
    _encode.write_bundle(buf, {"schema": "x"}, snap, lambda: {})
    enc_s = time.perf_counter() - t0
    print(
        "MEASURE="
        + json.dumps(
            {
                "hook_us": round(hook_us, 2),
                "hook_fraction_of_50ms": round(hook_us / 50_000, 6),
                "trace_entries": entries,
                "alloc_free_us": round(fill_s / 40_000 * 1e6, 2),
                "snapshot_s": round(snap_s, 3),
                "encode_gzip_s": round(enc_s, 3),
                "bundle_mib": round(len(buf.getvalue()) / 1024**2, 1),
                "history_max_entries": STATE.history_max_entries,
            }
        ),
        flush=True,
    )


{"leak": leak, "big-batch": big_batch, "fraction": fraction, "measure": measure}[MODE]()
