"""Incident bundles (docs/bundle.md, oom-triage/incident@1), built on sim.Sim so every number agrees."""

from __future__ import annotations

import uuid

from tests.independent.sim import OOM, GiB, MiB, Sim, fmt

TORCH = "/usr/local/lib/python3.11/dist-packages/torch"
W = "/workspace/proj"


def F(name, filename, line):
    return {"name": name, "filename": filename, "line": line}


MOD = [
    F("_call_impl", TORCH + "/nn/modules/module.py", 1747),
    F("_wrapped_call_impl", TORCH + "/nn/modules/module.py", 1736),
]
MAIN = [F("main", W + "/train.py", 160), F("<module>", W + "/train.py", 171)]
PARAM_FR = [
    F("convert", TORCH + "/nn/modules/module.py", 1333),
    F("_apply", TORCH + "/nn/modules/module.py", 942),
    F("to", TORCH + "/nn/modules/module.py", 1340),
    F("main", W + "/train.py", 52),
    F("<module>", W + "/train.py", 171),
]
GRAD_FR = [
    F("_engine_run_backward", TORCH + "/autograd/graph.py", 825),
    F("backward", TORCH + "/autograd/__init__.py", 347),
    F("backward", TORCH + "/_tensor.py", 581),
    F("train_step", W + "/train.py", 91),
    *MAIN,
]
STATE_FR = [
    F("_init_group", TORCH + "/optim/adamw.py", 122),
    F("step", TORCH + "/optim/adamw.py", 209),
    F("wrapper", TORCH + "/optim/optimizer.py", 487),
    F("train_step", W + "/train.py", 93),
    *MAIN,
]
OPT_TMP_FR = [
    F("_multi_tensor_adamw", TORCH + "/optim/adamw.py", 573),
    F("adamw", TORCH + "/optim/adamw.py", 767),
    F("step", TORCH + "/optim/adamw.py", 220),
    F("wrapper", TORCH + "/optim/optimizer.py", 487),
    F("train_step", W + "/train.py", 93),
    *MAIN,
]
LOSS_FR = [F("cross_entropy", TORCH + "/nn/functional.py", 3104), F("train_step", W + "/train.py", 89), *MAIN]
ZERO_FR = [F("zero_grad", TORCH + "/optim/optimizer.py", 955), F("train_step", W + "/train.py", 86), *MAIN]


def act_fr(k):
    lib = (
        F("forward", TORCH + "/nn/modules/linear.py", 125)
        if k % 2 == 0
        else F("gelu", TORCH + "/nn/functional.py", 1546)
    )
    return [
        lib,
        *MOD,
        F("forward", W + "/model.py", 40 + k),
        *MOD,
        F("train_step", W + "/train.py", 88),
        *MAIN,
    ]


class Trainer:
    def __init__(self, sim: Sim, params, acts_per_sample):
        self.sim = sim
        self.params = params
        self.acts = acts_per_sample
        self.P, self.G, self.S = [], [], []

    def init(self):
        self.P = [self.sim.malloc(p, PARAM_FR) for p in self.params]

    def step(self, i, bs, scale=1.0, after_fwd=None, sample=True):
        s = self.sim
        for g in self.G:
            s.free(g, ZERO_FR)
        self.G = []
        A = [s.malloc(int(a * bs * scale), act_fr(k)) for k, a in enumerate(self.acts)]
        if after_fwd:
            after_fwd(i, A)
        L = s.malloc(4, LOSS_FR)
        self.G = [s.malloc(p, GRAD_FR) for p in self.params]
        prev = None
        for a in reversed(A):
            t = s.malloc(a.req, GRAD_FR)
            s.free(a, GRAD_FR)
            if prev is not None:
                s.free(prev, GRAD_FR)
            prev = t
        if prev is not None:
            s.free(prev, GRAD_FR)
        if not self.S:
            self.S = [s.malloc(p, STATE_FR) for p in self.params for _ in range(2)]
        t = s.malloc(max(self.params), OPT_TMP_FR)
        s.free(t, OPT_TMP_FR)
        s.free(L, LOSS_FR)
        if sample:
            s.sample(i, bs)


# ---------------------------------------------------------------------------------------------------- messages
HINT_22 = (
    " If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    " to avoid fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
HINT_OLD = (
    " If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  "
    "See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)


def msg_v22(sim: Sim, oom: OOM, proc_lines: str, allowed=None):
    alloc, res = sim.allocated, sim.reserved
    cap = f"{fmt(allowed)} allowed; " if allowed else ""
    return (
        f"CUDA out of memory. Tried to allocate {fmt(oom.segsize)}. GPU {sim.device} has a total capacity of "
        f"{fmt(sim.total)} of which {fmt(oom.device_free)} is free. {proc_lines}{cap}Of the allocated memory "
        f"{fmt(alloc)} is allocated by PyTorch, and {fmt(res - alloc)} is reserved by PyTorch but unallocated."
        + HINT_22
    )


def msg_old(sim: Sim, oom: OOM, allowed=None):
    cap = f"{fmt(allowed)} allowed; " if allowed else ""
    return (
        f"CUDA out of memory. Tried to allocate {fmt(oom.segsize)} (GPU {sim.device}; {fmt(sim.total)} total "
        f"capacity; {fmt(sim.allocated)} already allocated; {fmt(oom.device_free)} free; {cap}"
        f"{fmt(sim.reserved)} reserved in total by PyTorch)" + HINT_OLD
    )


def self_line(sim):
    return f"Including non-PyTorch memory, this process has {fmt(sim.nvml_used())} memory in use. "


def pid_line(pid, used):
    return f"Process {pid} has {fmt(used)} memory in use. "


def tb(err):
    return (
        "Traceback (most recent call last):\n"
        f'  File "{W}/train.py", line 171, in <module>\n    main()\n'
        f'  File "{W}/train.py", line 160, in main\n    loss = train_step(model, batch, opt)\n'
        f'  File "{W}/train.py", line 88, in train_step\n    out = model(batch["x"])\n'
        f"{err}\n"
    )


# ---------------------------------------------------------------------------------------------------- bundle
def make_bundle(
    name,
    kind,
    *,
    sim=None,
    message=None,
    err_type="torch.OutOfMemoryError",
    exit_code=1,
    workload=None,
    device=None,
    allocator=None,
    host=None,
    env=None,
    snapshot=True,
    legacy=False,
    settings=None,
    timeline=True,
    traceback=None,
):
    b = {
        "schema": "oom-triage/incident@1",
        "incident_id": str(uuid.uuid5(uuid.NAMESPACE_URL, "indep/" + name)),
        "occurred_at": "2024-11-05T14:03:25.118000Z",
        "kind": kind,
        "error": {
            "type": err_type,
            "message": message,
            "traceback": traceback
            if traceback is not None
            else (tb(f"{err_type}: {message}") if message else None),
            "exit_code": exit_code,
        },
        "workload": {
            "namespace": "research",
            "pod": f"{name.lower().replace('_', '-')}-worker-0",
            "node": "gpu-node-17",
            "container": "pytorch",
            "job": name.lower().replace("_", "-"),
            "owner_kind": "PyTorchJob",
            "owner_name": name.lower().replace("_", "-"),
            "rank": 0,
            "local_rank": 0,
            "world_size": 1,
            "restart_count": 0,
            "pid": 4242,
            "pids": [4242],
        },
        "environment": {
            "CUDA_VISIBLE_DEVICES": "0",
            "PYTORCH_CUDA_ALLOC_CONF": None,
            "torch_version": "2.5.1+cu124",
            "cuda_version": "12.4",
            "driver_version": "550.90.07",
            "python_version": "3.11.9",
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
        },
        "collector": {
            "version": "0.1.0",
            "history_max_entries": 100000,
            "capture_ms": 412,
            "snapshot_ms": 61,
            "observer_calls": 1,
            "peak_scope": "run",
            "source": "excepthook",
        },
    }
    if workload:
        b["workload"].update(workload)
    if env:
        b["environment"].update(env)
    if sim is not None:
        dev = {
            "index": sim.device,
            "name": "NVIDIA A100-SXM4-80GB",
            "uuid": "GPU-5d1f0c3e-2b7a-4f5e-9c1d-0a7e3b9d2f11",
            "total_bytes": sim.total,
            "free_bytes": sim.dev_free(),
            "mig_mode": False,
            "mig_profile": None,
            "processes": [{"pid": b["workload"]["pid"], "used_bytes": sim.nvml_used(), "name": "python"}],
        }
        if device:
            dev.update(device)
        b["device"] = dev
        al = {
            "memory_stats": sim.memory_stats(),
            "settings": settings
            or {
                "PYTORCH_CUDA_ALLOC_CONF": "",
                "max_split_size": -1,
                "expandable_segments": False,
                "garbage_collection_threshold": 0.0,
                "roundup_power2_divisions": {"1": 0},
            },
            "fraction": None,
            "fraction_cap_bytes": None,
            "observer": sim.observer,
        }
        if allocator:
            al.update(allocator)
        b["allocator"] = al
        b["timeline"] = sim.timeline if timeline else []
        b["snapshot"] = (
            sim.snapshot(legacy=legacy, settings=None if legacy else al["settings"]) if snapshot else None
        )
    else:
        if device:
            b["device"] = device
        if allocator:
            b["allocator"] = allocator
        b["snapshot"] = None
    hst = {
        "shm_total_bytes": 64 * GiB,
        "shm_used_bytes": 310 * MiB,
        "cgroup": {
            "version": 2,
            "memory_limit_bytes": 256 * GiB,
            "memory_usage_bytes": 41 * GiB,
            "oom_kill_count": 0,
        },
        "rss_bytes": 18 * GiB,
        "cpu_count": 16,
        "cpu_affinity": list(range(16)),
        "dataloader_workers": 8,
        "dead_dataloader_workers": [],
    }
    if host:
        hst.update(host)
    b["host"] = hst
    return b


# name -> (build: a callable returning a fresh bundle dict, acceptable, soft, why, leak_sites).
# Building runs the allocator model (seconds), so it is deferred until a test asks for the bundles.
BUNDLES = {}


def add(name, build, acceptable, why, soft=(), leak_sites=None):
    BUNDLES[name] = (build, list(acceptable), list(soft), why, leak_sites)


def run_until_oom(fn):
    try:
        fn()
    except OOM as e:
        return e
    raise AssertionError("scenario did not OOM")


A100_80 = 81050 * MiB  # 79.15 GiB as torch reports it
A100_40 = 40337 * MiB  # 39.39 GiB
RTX_24 = 24217 * MiB  # 23.65 GiB

# ------------------------------------------------------------------ B01: distillation KL kept in a list (loss w/o .item())
KL_FR = [F("log_softmax", TORCH + "/nn/functional.py", 2248), F("train_step", W + "/train.py", 95), *MAIN]
KLS_FR = [F("kl_div", TORCH + "/nn/functional.py", 3394), F("train_step", W + "/train.py", 95), *MAIN]


def b01():
    sim = Sim(A100_80, ctx=530 * MiB)
    tr = Trainer(sim, [2 * GiB] * 4, [256 * MiB, 256 * MiB, 512 * MiB, 512 * MiB, 256 * MiB])
    tr.init()
    history = []

    def leak(
        i, A
    ):  # kl = F.kl_div(F.log_softmax(s_logits, -1), t_probs); kl_history.append(kl)  (graph kept alive)
        history.append(sim.malloc(524_288_000, KL_FR))
        history.append(sim.malloc(4, KLS_FR))

    e = run_until_oom(lambda: [tr.step(i, 8, after_fwd=leak) for i in range(1000)])
    msg = msg_v22(sim, e, self_line(sim))
    return (
        sim,
        e,
        make_bundle(
            "B01_leak_kl_history",
            "cuda_oom",
            sim=sim,
            message=msg,
            workload={"step": len(sim.timeline), "batch_size": 8},
        ),
    )


add(
    "B01_leak_kl_history",
    lambda: b01()[2],
    ["tensor_leak"],
    "KL loss appended to a list without .item(): its graph keeps a 500 MiB log_softmax output alive each step; "
    "timeline grows linearly at constant batch",
    leak_sites=["train.py:95"],
)

# ------------------------------------------------------------------ B02: logits list, last request looks big
LOGITS_FR = [
    F("forward", TORCH + "/nn/modules/linear.py", 125),
    *MOD,
    F("forward", W + "/model.py", 58),
    *MOD,
    F("train_step", W + "/train.py", 88),
    *MAIN,
]


def b02(frames=True, name="B02_leak_logits_list"):
    sim = Sim(A100_40, ctx=480 * MiB, frames=frames)
    tr = Trainer(sim, [1 * GiB] * 4, [128 * MiB, 128 * MiB, 256 * MiB])
    tr.init()
    kept = []

    def leak(i, A):  # epoch_logits.append(logits.detach())
        kept.append(sim.malloc(64 * MiB, LOGITS_FR))

    e = run_until_oom(lambda: [tr.step(i, 16, after_fwd=leak) for i in range(2000)])
    msg = msg_v22(sim, e, self_line(sim))
    return (
        sim,
        e,
        make_bundle(
            name,
            "cuda_oom",
            sim=sim,
            message=msg,
            workload={"step": len(sim.timeline), "batch_size": 16},
            device={"name": "NVIDIA A100-SXM4-40GB"},
        ),
    )


add(
    "B02_leak_logits_list",
    lambda: b02()[2],
    ["tensor_leak"],
    "logits.detach() appended every step (64 MiB each); the failing request is a big activation (looks like a big batch)",
    leak_sites=["model.py:58", "train.py:88"],
)

add(
    "B03_leak_no_stacks",
    lambda: b02(frames=False, name="B03_leak_no_stacks")[2],
    ["tensor_leak"],
    "same leak recorded with no stacks: timeline and block population still show linear growth; leak_site must be null",
    soft=["inconclusive"],
    leak_sites=[None],
)


# ------------------------------------------------------------------ B04: batch too large at step 0
def b04():
    sim = Sim(RTX_24, ctx=460 * MiB)
    tr = Trainer(sim, [768 * MiB] * 4, [96 * MiB, 96 * MiB, 192 * MiB, 192 * MiB])
    tr.init()
    e = run_until_oom(lambda: tr.step(0, 32))
    msg = msg_v22(sim, e, self_line(sim))
    return make_bundle(
        "B04_too_large_step0",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": 0, "batch_size": 32},
        device={"name": "NVIDIA GeForce RTX 4090", "uuid": "GPU-11111111-2222-3333-4444-555555555555"},
    )


add(
    "B04_too_large_step0",
    b04,
    ["workload_too_large"],
    "step 0: 18 GiB of activations for bs 32 on a 24 GiB card; OOM at the first grad in backward; no step ever completed",
    soft=["inconclusive"],
)


# ------------------------------------------------------------------ B05: variable length; flat timeline then long batch
def b05():
    sim = Sim(A100_40, ctx=480 * MiB, max_entries=2500)
    tr = Trainer(sim, [1 * GiB] * 4, [96 * MiB, 96 * MiB, 192 * MiB, 96 * MiB])
    tr.init()
    scales = [1.0, 0.7, 1.3, 0.9, 1.1, 0.8, 1.2, 1.0, 0.95, 1.25]

    def go():
        for i in range(180):
            tr.step(i, 16, scale=scales[i % len(scales)])
        tr.step(180, 16, scale=5.5)  # a 5.5x longer sequence batch

    e = run_until_oom(go)
    msg = msg_v22(sim, e, self_line(sim))
    return make_bundle(
        "B05_too_large_long_sequence",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": 180, "batch_size": 16},
        device={"name": "NVIDIA A100-SXM4-40GB"},
    )


add(
    "B05_too_large_long_sequence",
    b05,
    ["workload_too_large"],
    "180 steps with flat end-of-step memory (scale 0.7..1.3), then a 5.5x longer batch: workload peak, not a leak",
    soft=["inconclusive"],
)

# ------------------------------------------------------------------ B06: fragmentation
FRAG_FR = [
    F("forward", TORCH + "/nn/modules/linear.py", 125),
    *MOD,
    F("forward", W + "/model.py", 71),
    *MOD,
    F("generate", W + "/serve.py", 133),
    F("main", W + "/serve.py", 201),
]
KV_FR = [
    F("_grow_cache", W + "/kvcache.py", 44),
    F("append", W + "/kvcache.py", 61),
    F("generate", W + "/serve.py", 140),
    F("main", W + "/serve.py", 201),
]


def b06():
    sim = Sim(A100_40, ctx=480 * MiB)
    # weights
    for _ in range(10):
        sim.malloc(2 * GiB, PARAM_FR)
    big = [sim.malloc(256 * MiB, FRAG_FR) for _ in range(40)]
    for x in big:
        sim.free(x, FRAG_FR)
    kept, tmp = [], []
    for _i in range(40):
        tmp.append(sim.malloc(200 * MiB, FRAG_FR))
        kept.append(sim.malloc(40 * MiB, KV_FR))
    for t in tmp:
        sim.free(t, FRAG_FR)
    # fill most of what is left on the device with steady-state buffers
    while sim.dev_free() > 1200 * MiB:
        sim.malloc(512 * MiB, KV_FR)
    e = run_until_oom(lambda: sim.malloc(1536 * MiB, FRAG_FR))
    msg = msg_v22(sim, e, self_line(sim))
    return make_bundle(
        "B06_fragmentation",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": None, "batch_size": 4},
        device={"name": "NVIDIA A100-SXM4-40GB"},
    )


add(
    "B06_fragmentation",
    b06,
    ["fragmentation"],
    "serving job (no optimizer steps, empty timeline): 8.4 GiB free inside 40 split segments (largest hole 200 MiB); "
    "request 1.5 GiB; device has 945 MiB free",
)


# ------------------------------------------------------------------ B07: neighbour appears mid-run
def b07():
    sim = Sim(A100_80, ctx=530 * MiB)
    tr = Trainer(sim, [2 * GiB] * 4, [256 * MiB, 256 * MiB, 512 * MiB])
    tr.init()

    def go():
        for i in range(50):
            tr.step(i, 8)
        sim.others = (sim.dev_free() - 200 * MiB) // MiB * MiB  # another job grabs all the free memory
        tr.step(50, 8, scale=1.5)  # a slightly longer batch needs a little more than the cache holds

    e = run_until_oom(go)
    msg = msg_v22(sim, e, pid_line(9911, sim.others) + self_line(sim))
    return make_bundle(
        "B07_other_process",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": 50, "batch_size": 8, "pid": 4242, "pids": [4242, 4250, 4251]},
        device={
            "processes": [
                {"pid": 4242, "used_bytes": sim.nvml_used(), "name": "python"},
                {"pid": 9911, "used_bytes": sim.others, "name": "python3"},
            ]
        },
    )


add(
    "B07_other_process",
    b07,
    ["other_process"],
    "flat 50 steps, then pid 9911 (not in the job's pids) grabs all free memory (~43 GiB) and the next step OOMs",
)


# ------------------------------------------------------------------ B08: zombie from a previous restart
def b08():
    sim = Sim(A100_40, ctx=480 * MiB, others=20 * GiB)
    tr = Trainer(sim, [1 * GiB] * 4, [128 * MiB, 128 * MiB, 256 * MiB])
    tr.init()
    e = run_until_oom(lambda: [tr.step(i, 16) for i in range(5)])
    msg = msg_v22(sim, e, pid_line(77120, 20 * GiB) + self_line(sim))
    return make_bundle(
        "B08_zombie_previous_restart",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": 0, "batch_size": 16, "restart_count": 1, "pid": 80311, "pids": [80311]},
        device={
            "name": "NVIDIA A100-SXM4-40GB",
            "processes": [
                {"pid": 77120, "used_bytes": 20 * GiB, "name": ""},
                {"pid": 80311, "used_bytes": sim.nvml_used(), "name": "python"},
            ],
        },
    )


add(
    "B08_zombie_previous_restart",
    b08,
    ["other_process"],
    "restart 1; pid 77120 (unnamed, not in pids) still holds 20 GiB of a 40 GiB card; the same config ran before",
)


# ------------------------------------------------------------------ B09: hard negative: self shows as 'Process N' (PID namespace)
def b09():
    sim = Sim(A100_80, ctx=530 * MiB)
    tr = Trainer(sim, [4 * GiB] * 4, [1 * GiB, 1 * GiB, 2 * GiB, 2 * GiB])
    tr.init()
    e = run_until_oom(lambda: tr.step(0, 8))
    host_pid = 3141592
    msg = msg_v22(sim, e, pid_line(host_pid, sim.nvml_used()))
    return make_bundle(
        "B09_hardneg_self_in_pid_namespace",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": 0, "batch_size": 8, "pid": 7, "pids": [7, 45, 46]},
        device={"processes": [{"pid": host_pid, "used_bytes": sim.nvml_used(), "name": "python"}]},
    )


add(
    "B09_hardneg_self_in_pid_namespace",
    b09,
    ["workload_too_large"],
    "the only NVML process (host pid) is the job itself (used == reserved + context); step-0 failure => too large",
    soft=["inconclusive"],
)


# ------------------------------------------------------------------ B10: hard negative: own pid named in 'Process N has'
def b10():
    sim = Sim(A100_40, ctx=480 * MiB)
    tr = Trainer(sim, [1 * GiB] * 4, [128 * MiB, 128 * MiB, 256 * MiB])
    tr.init()
    kept = []

    def leak(i, A):
        kept.append(sim.malloc(64 * MiB, LOGITS_FR))

    e = run_until_oom(lambda: [tr.step(i, 16, after_fwd=leak) for i in range(2000)])
    msg = msg_v22(sim, e, pid_line(51260, sim.nvml_used()))
    return make_bundle(
        "B10_hardneg_own_pid_line_leak",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": len(sim.timeline), "batch_size": 16, "pid": 51260, "pids": [51260, 51301]},
        device={
            "name": "NVIDIA A100-SXM4-40GB",
            "processes": [{"pid": 51260, "used_bytes": sim.nvml_used(), "name": "python"}],
        },
    )


add(
    "B10_hardneg_own_pid_line_leak",
    b10,
    ["tensor_leak"],
    "'Process 51260 has ...' is the job's own pid (workload.pid); the real cause is the logits leak",
    leak_sites=["model.py:58", "train.py:88"],
)


# ------------------------------------------------------------------ B11: fraction cap
def b11():
    cap = int(A100_80 * 0.5)
    sim = Sim(A100_80, ctx=530 * MiB, cap=cap)
    tr = Trainer(sim, [3 * GiB] * 4, [512 * MiB, 512 * MiB, 1 * GiB])
    tr.init()
    e = run_until_oom(lambda: tr.step(0, 8))
    msg = msg_v22(sim, e, self_line(sim), allowed=cap)
    return make_bundle(
        "B11_fraction_cap",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": 0, "batch_size": 8},
        allocator={"fraction": 0.5, "fraction_cap_bytes": cap},
    )


add(
    "B11_fraction_cap",
    b11,
    ["gpu_quota"],
    "set_per_process_memory_fraction(0.5): rejected at the 39.6 GiB cap while ~40 GiB is free on the device",
)


# ------------------------------------------------------------------ B12: MIG slice
def b12():
    total = 19968 * MiB  # 2g.20gb as cudaMemGetInfo reports it
    sim = Sim(total, ctx=420 * MiB)
    tr = Trainer(sim, [2 * GiB] * 2, [256 * MiB, 256 * MiB, 512 * MiB])
    tr.init()
    run_until_oom(lambda: [tr.step(i, 8) for i in range(3)])
    msg = 'NVML_SUCCESS == r INTERNAL ASSERT FAILED at "../c10/cuda/CUDACachingAllocator.cpp":1123, please report a bug to PyTorch. '
    return make_bundle(
        "B12_mig_slice",
        "cuda_oom",
        sim=sim,
        message=msg,
        err_type="RuntimeError",
        workload={"step": 0, "batch_size": 8, "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
        device={
            "name": "NVIDIA A100-SXM4-80GB MIG 2g.20gb",
            "mig_mode": True,
            "mig_profile": "2g.20gb",
            "declared_total_bytes": 80 * GiB,
            "uuid": "MIG-8c2b6f0e-1d3a-5e7b-a9c4-2f0d1e3b4a5c",
            "processes": [],
        },
        env={"CUDA_VISIBLE_DEVICES": "MIG-8c2b6f0e-1d3a-5e7b-a9c4-2f0d1e3b4a5c"},
    )


add(
    "B12_mig_slice",
    b12,
    ["gpu_quota"],
    "MIG 2g.20gb slice (19.5 GiB) where 80 GiB was declared; NVML assert instead of the normal message",
)


# ------------------------------------------------------------------ B13: smaller GPU than declared (pre-2.1 message)
def b13():
    total = 16151 * MiB  # V100-16GB: 15.77 GiB
    sim = Sim(total, ctx=380 * MiB)
    tr = Trainer(sim, [1 * GiB] * 4, [192 * MiB, 192 * MiB, 384 * MiB])
    tr.init()
    e = run_until_oom(lambda: tr.step(0, 12))
    msg = msg_old(sim, e)
    return make_bundle(
        "B13_smaller_gpu_than_declared",
        "cuda_oom",
        sim=sim,
        message=msg,
        err_type="torch.cuda.OutOfMemoryError",
        workload={"step": 0, "batch_size": 12},
        device={"name": "Tesla V100-SXM2-16GB", "declared_total_bytes": 32 * GiB},
        env={"torch_version": "2.0.1+cu118", "cuda_version": "11.8"},
    )


add(
    "B13_smaller_gpu_than_declared",
    b13,
    ["gpu_quota"],
    "the pod was promised a 32 GiB card and landed on a 16 GiB V100; the job's step-0 need (~17 GiB) fits 32",
    soft=["workload_too_large", "inconclusive"],
)

# ------------------------------------------------------------------ B14: shm
add(
    "B14_shm_exhausted",
    lambda: make_bundle(
        "B14_shm_exhausted",
        "shm_exhausted",
        message="DataLoader worker (pid 7781) is killed by signal: Bus error. It is possible that dataloader's workers are "
        "out of shared memory. Please try to raise your shared memory limit.",
        err_type="RuntimeError",
        traceback=(
            "Traceback (most recent call last):\n"
            f'  File "{W}/train.py", line 84, in train_epoch\n    for batch in loader:\n'
            '  File "/usr/local/lib/python3.11/dist-packages/torch/utils/data/dataloader.py", line 1133, in _try_get_data\n'
            "    data = self._data_queue.get(timeout=timeout)\n"
            "RuntimeError: DataLoader worker (pid 7781) is killed by signal: Bus error. It is possible that dataloader's "
            "workers are out of shared memory. Please try to raise your shared memory limit.\n"
        ),
        host={
            "shm_total_bytes": 64 * MiB,
            "shm_used_bytes": 64 * MiB - 12288,
            "dataloader_workers": 8,
            "dead_dataloader_workers": [{"pid": 7781, "exitcode": -7, "signal": "SIGBUS"}],
        },
        workload={"step": 0, "batch_size": 64},
    ),
    ["shm_exhausted"],
    "64 MiB /dev/shm full, worker died of SIGBUS",
)

# ------------------------------------------------------------------ B15: cgroup limit
add(
    "B15_host_oom_cgroup",
    lambda: make_bundle(
        "B15_host_oom_cgroup",
        "host_oom",
        message="Killed",
        err_type="OOMKilled",
        exit_code=137,
        traceback="",
        host={
            "cgroup": {
                "version": 2,
                "memory_limit_bytes": 32 * GiB,
                "memory_usage_bytes": 32 * GiB - 4 * MiB,
                "oom_kill_count": 1,
            },
            "rss_bytes": 30 * GiB,
        },
        workload={"step": 1200, "batch_size": 32, "restart_count": 1},
    ),
    ["host_memory_limit"],
    "cgroup usage at limit, oom_kill_count 1, exit 137",
)

# ------------------------------------------------------------------ B16: worker SIGKILL via cgroup
add(
    "B16_worker_sigkill_cgroup",
    lambda: make_bundle(
        "B16_worker_sigkill_cgroup",
        "crash",
        message="DataLoader worker (pid(s) 3321) exited unexpectedly",
        err_type="RuntimeError",
        traceback=(
            "Traceback (most recent call last):\n"
            '  File "/usr/local/lib/python3.11/dist-packages/torch/utils/data/dataloader.py", line 1133, in _try_get_data\n'
            "    data = self._data_queue.get(timeout=timeout)\n"
            "RuntimeError: DataLoader worker (pid 3321) is killed by signal: Killed.\n\n"
            "The above exception was the direct cause of the following exception:\n\n"
            "Traceback (most recent call last):\n"
            f'  File "{W}/train.py", line 84, in train_epoch\n    for batch in loader:\n'
            "RuntimeError: DataLoader worker (pid(s) 3321) exited unexpectedly\n"
        ),
        host={
            "cgroup": {
                "version": 2,
                "memory_limit_bytes": 48 * GiB,
                "memory_usage_bytes": 47 * GiB + 900 * MiB,
                "oom_kill_count": 2,
            },
            "rss_bytes": 12 * GiB,
            "dataloader_workers": 16,
            "dead_dataloader_workers": [{"pid": 3321, "exitcode": -9, "signal": "SIGKILL"}],
        },
        workload={"step": 310, "batch_size": 32},
    ),
    ["host_memory_limit"],
    "worker SIGKILLed; cgroup oom_kill_count 2 and usage at the 48 GiB limit",
)

# ------------------------------------------------------------------ B17: hard negative: bounded LRU cache then long batch
CACHE_FR = [
    F("put", W + "/cache.py", 33),
    F("forward", W + "/model.py", 77),
    *MOD,
    F("train_step", W + "/train.py", 88),
    *MAIN,
]


def b17():
    sim = Sim(A100_40, ctx=480 * MiB, max_entries=4000)
    tr = Trainer(sim, [1 * GiB] * 4, [96 * MiB, 96 * MiB, 192 * MiB])
    tr.init()
    cache = []

    def lru(i, A):  # embedding cache bounded at 20 entries of 100 MiB
        cache.append(sim.malloc(100 * MiB, CACHE_FR))
        if len(cache) > 20:
            sim.free(cache.pop(0), CACHE_FR)

    def go():
        for i in range(300):
            tr.step(i, 16, after_fwd=lru)
        tr.step(300, 16, scale=7.0, after_fwd=lru)

    e = run_until_oom(go)
    msg = msg_v22(sim, e, self_line(sim))
    return make_bundle(
        "B17_hardneg_bounded_cache",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": 300, "batch_size": 16},
        device={"name": "NVIDIA A100-SXM4-40GB"},
    )


add(
    "B17_hardneg_bounded_cache",
    b17,
    ["workload_too_large", "inconclusive"],
    "a 20-entry cache grows for 20 steps then plateaus for 280; the OOM is a 7x-long batch; NOT a leak",
)

# ------------------------------------------------------------------ B18: hard negative: big free block cached on another stream
SIDE_FR = [
    F("prefetch", W + "/prefetch.py", 29),
    F("__next__", W + "/prefetch.py", 51),
    F("main", W + "/train.py", 158),
    F("<module>", W + "/train.py", 171),
]


def b18():
    sim = Sim(A100_80, ctx=530 * MiB)
    side = 94557488  # stream handle of a side CUDA stream
    # a side-stream staging buffer: 2 GiB segment, a small block stays active at its end so it is split (not releasable)
    big = sim.malloc(2 * GiB, SIDE_FR, stream=side)
    sim.free(big, SIDE_FR)
    pin = sim.malloc(
        24 * MiB, SIDE_FR, stream=side
    )  # splits the cached 2 GiB segment: it can no longer be released
    tr = Trainer(sim, [2 * GiB] * 4, [1 * GiB, 1 * GiB, 2 * GiB])
    tr.init()

    def go():
        for i in range(40):
            tr.step(i, 6)
        sim.release_cached()  # torch.cuda.empty_cache() after warm-up
        # steady state: a long-lived buffer set eats the rest of the default-stream headroom
        while sim.dev_free() > 12 * MiB:
            sim.malloc(min(256 * MiB, max(20 * MiB, sim.dev_free() - 12 * MiB) // (2 * MiB) * 2 * MiB), KV_FR)
        sim.malloc(4 * MiB, LOSS_FR)  # a 4 MiB request -> 20 MiB segment

    e = run_until_oom(go)
    msg = msg_v22(sim, e, self_line(sim))
    _ = pin
    return make_bundle(
        "B18_hardneg_other_stream_hole",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": 40, "batch_size": 6},
    )


add(
    "B18_hardneg_other_stream_hole",
    b18,
    ["inconclusive", "fragmentation"],
    "tiny (4 MiB -> 20 MiB segment) request fails while a ~2 GiB hole sits cached on a side stream; "
    "must not be tensor_leak/other_process/quota",
    soft=["workload_too_large"],
)


# ------------------------------------------------------------------ B19: HAMi vGPU limit
def b19():
    limit = 20 * GiB
    sim = Sim(limit, ctx=450 * MiB)  # HAMi reports the limit as the device total
    tr = Trainer(sim, [2 * GiB] * 2, [256 * MiB, 256 * MiB, 512 * MiB])
    tr.init()
    run_until_oom(lambda: [tr.step(i, 8) for i in range(3)])
    msg = (
        "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call, so "
        "the stacktrace below might be incorrect."
    )
    return make_bundle(
        "B19_vgpu_hami_limit",
        "cuda_oom",
        sim=sim,
        message=msg,
        err_type="RuntimeError",
        traceback=(
            "[HAMI-core ERROR (pid:31 thread=140245118764864 allocator.c:54)]: Device 0 OOM "
            f"{limit} / {limit}\n" + tb("RuntimeError: " + msg)
        ),
        workload={"step": 0, "batch_size": 8},
        device={"declared_total_bytes": 80 * GiB, "processes": []},
        env={"CUDA_DEVICE_MEMORY_LIMIT_0": "20480m", "CUDA_DEVICE_SM_LIMIT": "50"},
    )


add(
    "B19_vgpu_hami_limit",
    b19,
    ["gpu_quota"],
    "HAMi vGPU 20 GiB limit on an 80 GiB A100 (declared 80); HAMi's OOM line in the traceback",
    soft=["inconclusive"],
)


# ------------------------------------------------------------------ B20: torch 2.0 legacy snapshot, neighbour
def b20():
    sim = Sim(A100_40, ctx=480 * MiB, others=18 * GiB, time_us=False)
    tr = Trainer(sim, [1 * GiB] * 4, [128 * MiB, 128 * MiB, 256 * MiB])
    tr.init()
    e = run_until_oom(lambda: [tr.step(i, 16) for i in range(3)])
    msg = msg_old(sim, e)
    return make_bundle(
        "B20_legacy_torch20_other_process",
        "cuda_oom",
        sim=sim,
        message=msg,
        legacy=True,
        err_type="torch.cuda.OutOfMemoryError",
        workload={"step": 0, "batch_size": 16},
        device={
            "name": "NVIDIA A100-SXM4-40GB",
            "processes": [
                {"pid": 4242, "used_bytes": sim.nvml_used(), "name": "python"},
                {"pid": 1300, "used_bytes": 18 * GiB, "name": "jupyter-kernel"},
            ],
        },
        env={"torch_version": "2.0.1+cu118", "cuda_version": "11.8"},
    )


add(
    "B20_legacy_torch20_other_process",
    b20,
    ["other_process"],
    "torch 2.0 legacy block format; a jupyter kernel holds 18 GiB of a 40 GiB card",
)


# ------------------------------------------------------------------ B21: no snapshot, neighbour in NVML list
def b21():
    sim = Sim(A100_40, ctx=480 * MiB, others=30 * GiB)
    tr = Trainer(sim, [1 * GiB] * 2, [128 * MiB, 128 * MiB, 256 * MiB])
    tr.init()
    e = run_until_oom(lambda: [tr.step(i, 16) for i in range(3)])
    msg = msg_v22(sim, e, pid_line(8812, 30 * GiB) + self_line(sim))
    return make_bundle(
        "B21_no_snapshot_other_process",
        "cuda_oom",
        sim=sim,
        message=msg,
        snapshot=False,
        workload={"step": 0, "batch_size": 16},
        device={
            "name": "NVIDIA A100-SXM4-40GB",
            "processes": [
                {"pid": 4242, "used_bytes": sim.nvml_used(), "name": "python"},
                {"pid": 8812, "used_bytes": 30 * GiB, "name": "python"},
            ],
        },
    )


add(
    "B21_no_snapshot_other_process",
    b21,
    ["other_process"],
    "no snapshot; NVML and the message show pid 8812 with 30 GiB of a 40 GiB card",
)


# ------------------------------------------------------------------ B22: leak, timeline only (no snapshot)
def b22():
    _sim, _e, b = b02(frames=True, name="B22_leak_timeline_only")
    b["snapshot"] = None
    return b


add(
    "B22_leak_timeline_only",
    b22,
    ["tensor_leak"],
    "snapshot missing but the per-step timeline grows +64 MiB/step at constant batch size",
    soft=["inconclusive"],
    leak_sites=[None],
)


# ============================================================================================ round 2: harder probes
MON_FR = [
    F("mean", TORCH + "/_tensor.py", 1512),
    F("_hook", W + "/monitor.py", 27),
    F("_call_impl", TORCH + "/nn/modules/module.py", 1790),
    *MOD,
    F("forward", W + "/model.py", 44),
    *MOD,
    F("train_step", W + "/train.py", 88),
    *MAIN,
]


def b23():  # forward hook keeps out.mean(0) per layer: many small-pool blocks
    sim = Sim(A100_40, ctx=480 * MiB, max_entries=5000)
    tr = Trainer(sim, [1 * GiB] * 4, [128 * MiB, 128 * MiB, 256 * MiB])
    tr.init()
    kept = []

    def leak(i, A):
        for _ in range(96):
            kept.append(sim.malloc(1_000_000, MON_FR))

    e = run_until_oom(lambda: [tr.step(i, 16, after_fwd=leak) for i in range(5000)])
    msg = msg_v22(sim, e, self_line(sim))
    return make_bundle(
        "B23_leak_small_pool_hook",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": len(sim.timeline), "batch_size": 16},
        device={"name": "NVIDIA A100-SXM4-40GB"},
    )


add(
    "B23_leak_small_pool_hook",
    b23,
    ["tensor_leak"],
    "forward hook appends out.mean(0) (~1 MB, small pool) for 96 layers every step: ~92 MiB/step growth in 2 MiB segments",
    leak_sites=["monitor.py:27"],
)

EVAL_FR = [
    F("forward", TORCH + "/nn/modules/linear.py", 125),
    *MOD,
    F("forward", W + "/model.py", 58),
    *MOD,
    F("validate", W + "/eval.py", 40),
    F("main", W + "/train.py", 165),
    F("<module>", W + "/train.py", 171),
]


def b24():  # validation outputs list never cleared -> staircase
    sim = Sim(A100_40, ctx=480 * MiB)
    tr = Trainer(sim, [1 * GiB] * 4, [128 * MiB, 128 * MiB, 256 * MiB])
    tr.init()
    val_outputs = []

    def go():
        for i in range(10000):
            tr.step(i, 16)
            if i % 25 == 24:
                for _ in range(10):
                    val_outputs.append(sim.malloc(128 * MiB, EVAL_FR))

    e = run_until_oom(go)
    msg = msg_v22(sim, e, self_line(sim))
    return make_bundle(
        "B24_leak_eval_staircase",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": len(sim.timeline), "batch_size": 16},
        device={"name": "NVIDIA A100-SXM4-40GB"},
    )


add(
    "B24_leak_eval_staircase",
    b24,
    ["tensor_leak"],
    "every 25 steps validation appends 10 x 128 MiB outputs to a list never cleared: staircase growth",
    leak_sites=["eval.py:40", "model.py:58"],
)

LAST_FR = [
    F("forward", TORCH + "/nn/modules/linear.py", 125),
    *MOD,
    F("forward", W + "/model.py", 58),
    *MOD,
    F("train_step", W + "/train.py", 88),
    *MAIN,
]


def b25():  # batch-size ramp; last outputs kept (replaced each step) -> end-of-step memory rises with batch size
    sim = Sim(A100_40, ctx=480 * MiB)
    tr = Trainer(sim, [1 * GiB] * 4, [64 * MiB, 64 * MiB, 128 * MiB])
    tr.init()
    state = {"last": None}

    def keep_last(i, A):
        if state["last"] is not None:
            sim.free(state["last"], LAST_FR)
        state["last"] = sim.malloc(A[-1].req // 2, LAST_FR)

    sched = [8] * 40 + [16] * 40 + [32] * 40 + [64] * 40

    def go():
        for i, bs in enumerate(sched):
            tr.step(i, bs, after_fwd=keep_last)

    e = run_until_oom(go)
    step = len(sim.timeline)
    msg = msg_v22(sim, e, self_line(sim))
    return make_bundle(
        "B25_hardneg_batch_ramp",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": step, "batch_size": sched[step]},
        device={"name": "NVIDIA A100-SXM4-40GB"},
    )


add(
    "B25_hardneg_batch_ramp",
    b25,
    ["workload_too_large"],
    "curriculum doubles batch size every 40 steps (8->16->32->64); end-of-step memory rises with batch size "
    "(last outputs kept, replaced each step), then bs 64 OOMs: NOT a leak",
    soft=["inconclusive"],
)


def b27():  # B02's leak, ring buffer kept only the last 300 events
    sim = Sim(A100_40, ctx=480 * MiB, max_entries=300)
    tr = Trainer(sim, [1 * GiB] * 4, [128 * MiB, 128 * MiB, 256 * MiB])
    tr.init()
    kept = []
    e = run_until_oom(
        lambda: [
            tr.step(i, 16, after_fwd=lambda i, A: kept.append(sim.malloc(64 * MiB, LOGITS_FR)))
            for i in range(2000)
        ]
    )
    msg = msg_v22(sim, e, self_line(sim))
    b = make_bundle(
        "B27_leak_short_ring",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": len(sim.timeline), "batch_size": 16},
        device={"name": "NVIDIA A100-SXM4-40GB"},
    )
    b["collector"]["history_max_entries"] = 300
    return b


add(
    "B27_leak_short_ring",
    b27,
    ["tensor_leak"],
    "B02's leak but the trace ring holds only the last 300 events (~8 steps); blocks still carry their stacks",
    leak_sites=["model.py:58", "train.py:88"],
)


def b28():  # enabled="state": blocks with frames, one trace entry, no timeline (collector without step hook)
    sim = Sim(A100_40, ctx=480 * MiB, max_entries=1)
    tr = Trainer(sim, [1 * GiB] * 4, [128 * MiB, 128 * MiB, 256 * MiB])
    tr.init()
    kept = []
    e = run_until_oom(
        lambda: [
            tr.step(i, 16, after_fwd=lambda i, A: kept.append(sim.malloc(64 * MiB, LOGITS_FR)))
            for i in range(2000)
        ]
    )
    msg = msg_v22(sim, e, self_line(sim))
    b = make_bundle(
        "B28_leak_state_only_snapshot",
        "cuda_oom",
        sim=sim,
        message=msg,
        timeline=False,
        workload={"step": None, "batch_size": 16},
        device={"name": "NVIDIA A100-SXM4-40GB"},
    )
    b["collector"]["history_max_entries"] = 1
    return b


add(
    "B28_leak_state_only_snapshot",
    b28,
    ["tensor_leak", "inconclusive"],
    "no timeline, 1 trace entry; 140 live 64 MiB blocks from one line (model.py:58) = 8.8 GiB: strongly suggests a leak",
    leak_sites=["model.py:58", "train.py:88"],
)


def b29():  # leak + a small static neighbour
    sim = Sim(A100_80, ctx=530 * MiB, others=10 * GiB)
    tr = Trainer(sim, [2 * GiB] * 4, [256 * MiB, 256 * MiB, 512 * MiB, 512 * MiB, 256 * MiB])
    tr.init()
    hist = []

    def leak(i, A):
        hist.append(sim.malloc(524_288_000, KL_FR))
        hist.append(sim.malloc(4, KLS_FR))

    e = run_until_oom(lambda: [tr.step(i, 8, after_fwd=leak) for i in range(1000)])
    msg = msg_v22(sim, e, pid_line(6001, 10 * GiB) + self_line(sim))
    return make_bundle(
        "B29_leak_with_static_neighbour",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": len(sim.timeline), "batch_size": 8},
        device={
            "processes": [
                {"pid": 4242, "used_bytes": sim.nvml_used(), "name": "python"},
                {"pid": 6001, "used_bytes": 10 * GiB, "name": "tritonserver"},
            ]
        },
    )


add(
    "B29_leak_with_static_neighbour",
    b29,
    ["tensor_leak"],
    "a 10 GiB neighbour was there from step 0 (constant); the job leaked 500 MiB/step for ~40 steps: root cause is the leak",
    soft=["inconclusive"],
    leak_sites=["train.py:95"],
)


def b30():  # a non-binding fraction cap + a big neighbour
    cap = int(A100_80 * 0.95)
    sim = Sim(A100_80, ctx=530 * MiB, others=30 * GiB, cap=cap)
    tr = Trainer(sim, [2 * GiB] * 4, [512 * MiB, 512 * MiB, 1 * GiB])
    tr.init()
    e = run_until_oom(lambda: [tr.step(i, 8) for i in range(5)])
    msg = msg_v22(sim, e, pid_line(9100, 30 * GiB) + self_line(sim), allowed=cap)
    return make_bundle(
        "B30_cap_not_binding_neighbour",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": len(sim.timeline), "batch_size": 8},
        allocator={"fraction": 0.95, "fraction_cap_bytes": cap},
        device={
            "processes": [
                {"pid": 4242, "used_bytes": sim.nvml_used(), "name": "python"},
                {"pid": 9100, "used_bytes": 30 * GiB, "name": "python"},
            ]
        },
    )


add(
    "B30_cap_not_binding_neighbour",
    b30,
    ["other_process"],
    "fraction cap 0.95 (75 GiB) is far from reached (reserved ~46 GiB); CUDA itself ran out because pid 9100 holds 30 GiB",
)


def b31():  # MIG slice exactly as declared, and a leak
    total = 19968 * MiB
    sim = Sim(total, ctx=420 * MiB)
    tr = Trainer(sim, [512 * MiB] * 2, [64 * MiB, 64 * MiB, 128 * MiB])
    tr.init()
    kept = []
    run_until_oom(
        lambda: [
            tr.step(i, 8, after_fwd=lambda i, A: kept.append(sim.malloc(64 * MiB, LOGITS_FR)))
            for i in range(2000)
        ]
    )
    msg = 'NVML_SUCCESS == r INTERNAL ASSERT FAILED at "../c10/cuda/CUDACachingAllocator.cpp":1123, please report a bug to PyTorch. '
    return make_bundle(
        "B31_mig_as_declared_leak",
        "cuda_oom",
        sim=sim,
        message=msg,
        err_type="RuntimeError",
        workload={"step": len(sim.timeline), "batch_size": 8},
        device={
            "name": "NVIDIA A100-SXM4-80GB MIG 2g.20gb",
            "mig_mode": True,
            "mig_profile": "2g.20gb",
            "declared_total_bytes": 19968 * MiB,
            "processes": [],
        },
        env={"CUDA_VISIBLE_DEVICES": "MIG-8c2b6f0e-1d3a-5e7b-a9c4-2f0d1e3b4a5c"},
    )


add(
    "B31_mig_as_declared_leak",
    b31,
    ["tensor_leak"],
    "the job got exactly the 2g.20gb slice it asked for (declared 19968 MiB); it leaked 64 MiB/step for ~200 steps",
    soft=["inconclusive"],
    leak_sites=["model.py:58", "train.py:88"],
)

add(
    "B34_crash_too_many_open_files",
    lambda: make_bundle(
        "B34_crash_too_many_open_files",
        "crash",
        message="Too many open files. Communication with the workers is no longer possible. Please increase the limit "
        "using `ulimit -n` in the shell or change the sharing strategy by calling "
        "`torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning of your code",
        err_type="RuntimeError",
        host={"shm_total_bytes": 64 * GiB, "shm_used_bytes": 2 * GiB, "dataloader_workers": 16},
        workload={"step": 5123, "batch_size": 64},
    ),
    ["inconclusive"],
    "fd ulimit; /dev/shm is 64 GiB with 2 GiB used: not shm_exhausted, not memory",
)


def b36():  # the job's own eval subprocess (listed in workload.pids) sits on the same GPU with 30 GiB
    sim = Sim(A100_80, ctx=530 * MiB, others=30 * GiB)
    tr = Trainer(sim, [3 * GiB] * 4, [512 * MiB, 512 * MiB, 1 * GiB])
    tr.init()
    e = run_until_oom(lambda: [tr.step(i, 8) for i in range(3)])
    msg = msg_v22(sim, e, pid_line(4260, 30 * GiB) + self_line(sim))
    return make_bundle(
        "B36_own_subprocess_holds_gpu",
        "cuda_oom",
        sim=sim,
        message=msg,
        workload={"step": len(sim.timeline), "batch_size": 8, "pid": 4242, "pids": [4242, 4250, 4251, 4260]},
        device={
            "processes": [
                {"pid": 4242, "used_bytes": sim.nvml_used(), "name": "python"},
                {"pid": 4260, "used_bytes": 30 * GiB, "name": "python"},
            ]
        },
    )


add(
    "B36_own_subprocess_holds_gpu",
    b36,
    ["inconclusive", "workload_too_large"],
    "the 30 GiB 'other' process is pid 4260, listed in workload.pids (the job's own eval subprocess on the same GPU): "
    "a code/config bug; other_process (owner platform) would page the wrong team -- debatable, so soft",
    soft=["other_process"],
)


# ============================================================================================ round 3: contract edges
def _min():
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": str(uuid.uuid5(uuid.NAMESPACE_URL, "indep/B37")),
        "occurred_at": "2024-11-05T14:03:25Z",
        "kind": "cuda_oom",
    }


add(
    "B37_minimal_required_only",
    _min,
    ["inconclusive"],
    "only the four required fields (docs/bundle.md: everything else may be absent)",
)


def _nulls():
    b = dict(_min(), incident_id=str(uuid.uuid5(uuid.NAMESPACE_URL, "indep/B38")))
    b.update(
        {
            k: None
            for k in (
                "error",
                "workload",
                "device",
                "allocator",
                "timeline",
                "host",
                "environment",
                "snapshot",
                "collector",
            )
        }
    )
    return b


add("B38_all_optional_null", _nulls, ["inconclusive"], "every optional section explicitly null")


def _nested_nulls():
    b = make_bundle(
        "B39_nested_nulls_unknown_keys",
        "cuda_oom",
        message="CUDA error: out of memory",
        err_type="RuntimeError",
    )
    b["error"].update({"traceback": None, "exit_code": None, "thread": None})
    b["workload"] = {k: None for k in b["workload"]}
    b["host"] = {
        "shm_total_bytes": None,
        "shm_used_bytes": None,
        "cgroup": None,
        "rss_bytes": None,
        "cpu_count": None,
        "cpu_affinity": None,
        "dataloader_workers": None,
        "dead_dataloader_workers": None,
    }
    b["device"] = {"index": 0, "name": None, "total_bytes": None, "free_bytes": None, "processes": None}
    b["allocator"] = {
        "memory_stats": None,
        "settings": None,
        "fraction": None,
        "fraction_cap_bytes": None,
        "observer": None,
    }
    b["future_field"] = {"x": 1}
    return b


add(
    "B39_nested_nulls_unknown_keys",
    _nested_nulls,
    ["inconclusive"],
    "nested fields null, plus an unknown top-level key (must be kept and ignored)",
)
