"""A small CPU training loop that ends the way a GPU job does, for the collector's subprocess tests.

Modes (argv[1]): oom, thread, shm, next-start, check-inert, check-nothing, cpu-oom, torchrun.
The CUDA side is the stand-in (fake_cuda); everything else is real torch.
"""

import importlib.util
import os
import signal
import sys
import threading
import time

assert importlib.util.find_spec(
    "torch"
)  # libraries probe before importing: the collector must still see the import
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

MODE = sys.argv[1] if len(sys.argv) > 1 else "oom"


def fake():
    import fake_cuda

    return fake_cuda.current()


def train(steps_before_oom: int = 3) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(96, 8)), batch_size=16)
    f = fake()
    f.init()  # what model.cuda() would do: CUDA's lazy initialisation
    for step, (x,) in enumerate(loader, start=1):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        f.advance(step)
        if step == steps_before_oom:
            forward_that_ooms(f)


def forward_that_ooms(f) -> None:
    print(f"RAISE_AT={time.time():.3f}", flush=True)
    f.oom()


class BusErrorDataset(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        if i == 20:
            os.kill(os.getpid(), signal.SIGBUS)  # what a full /dev/shm does to a worker writing a batch
            time.sleep(5)
        return torch.ones(4) * i


def shm() -> None:
    fake().init()
    pid = os.fork()  # a forked child inherits the hooks: it must never capture or send
    if pid == 0:
        fake().oom()  # uncaught in the child (its own excepthook path)
    _, status = os.waitpid(pid, 0)
    print(f"CHILD_EXIT={os.waitstatus_to_exitcode(status)}", flush=True)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(BusErrorDataset(), batch_size=8, num_workers=2)
    for x in loader:
        model(x).sum().backward()
        opt.step()


def thread() -> None:
    fake().init()
    t = threading.Thread(target=forward_that_ooms, args=(fake(),), name="prefetch-gpu")
    t.start()
    t.join()
    print("MAIN_CONTINUES", flush=True)


def next_start() -> None:
    spool = os.environ["TRIAGE_SPOOL"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        left = [n for n in os.listdir(spool) if n.endswith(".json.gz")] if os.path.isdir(spool) else []
        if not left:
            break
        time.sleep(0.05)
    print(f"SPOOL_LEFT={len(left)}", flush=True)


def check_nothing() -> None:
    import threading as th

    import torch.optim.optimizer as oo
    import torch.utils.data.dataloader as dl

    problems = []
    if sys.excepthook is not sys.__excepthook__:
        problems.append("sys.excepthook replaced")
    if th.excepthook is not th.__excepthook__:
        problems.append("threading.excepthook replaced")
    if any(type(f).__name__ == "_TorchWatcher" for f in sys.meta_path):
        problems.append("import watcher installed")
    if oo._global_optimizer_post_hooks:
        problems.append("optimizer hook registered")
    if getattr(dl._SingleProcessDataLoaderIter._next_data, "_oom_triage", False):
        problems.append("DataLoader patched")
    if MODE == "check-nothing" and any(m == "collector" or m.startswith("collector.") for m in sys.modules):
        problems.append("collector imported")
    print("PROBLEMS=" + ";".join(problems), flush=True)


if MODE == "oom":
    train()
elif MODE == "thread":
    thread()
elif MODE == "shm":
    shm()
elif MODE == "next-start":
    next_start()
elif MODE in ("check-nothing", "check-inert"):
    check_nothing()
    if MODE == "check-inert":
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.10 GiB of which 3.00 MiB is free."
        )
elif MODE == "torchrun":
    train(steps_before_oom=2 + int(os.environ.get("RANK", "0")))
else:
    raise SystemExit(f"unknown mode {MODE}")
