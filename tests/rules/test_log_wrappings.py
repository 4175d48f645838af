"""What training and serving frameworks wrap around an OOM in their logs: memory printed in a progress
bar's postfix or under a key that names its unit, a bar redrawn after carriage returns, a bar that never
left 0/N, an inference server sizing itself at start-up; and a MIG slice or a memory cap of the job's own
beside a first step that does not fit. Each is pinned on both sides.

The log lines follow what tqdm, JSON log shippers, Slurm and vLLM print (no framework runs here).
"""

from __future__ import annotations

import pytest

from triage.messages import first_step_bar, memory_samples, size_change_before, went_on_after
from triage.pipeline import diagnose_bundle, diagnose_text

GiB = 1 << 30

OOM_A100 = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 703.04 MiB is free. Process 2841771 has 78.46 GiB memory in use. Of the allocated "
    "memory 77.36 GiB is allocated by PyTorch, and 580.12 MiB is reserved by PyTorch but unallocated."
)
TRACEBACK = (
    'Traceback (most recent call last):\n  File "/w/train.py", line 97, in train_step\n    loss.backward()\n'
)


# ---------------------------------------------------------------- memory printed per step
def test_a_progress_bar_postfix_redrawn_after_carriage_returns_is_one_sample_per_redraw() -> None:
    bar = "\r".join(
        f"train:  {i}%|   | {s}/10000 [00:{i:02d}<53:29, 3.10it/s, loss=0.68, mem_alloc={19 + s / 100:.2f}G]"
        for i, s in enumerate(range(50, 550, 50))
    )
    samples = memory_samples(bar + "\n" + TRACEBACK + OOM_A100 + "\n")
    assert [s["step"] for s in samples] == list(range(50, 550, 50))
    assert samples[0]["allocated_bytes"] == round(19.5 * GiB)
    assert samples[-1]["allocated_bytes"] == round(24.0 * GiB)


def test_a_key_that_names_its_unit_and_a_max_beside_it() -> None:
    line = '{{"msg": "epoch={e} cuda_mem_allocated_gb={a:.2f} cuda_max_mem_allocated_gb={p:.2f}"}}'
    text = "\n".join(line.format(e=e, a=4.42 + 1.71 * e, p=7.52 + 1.71 * e) for e in range(6))
    samples = memory_samples(text)
    assert len(samples) == 6
    assert samples[0] == {"allocated_bytes": 4_420_000_000, "peak_allocated_bytes": 7_520_000_000, "step": 0}


def test_allocated_and_reserved_printed_as_a_pair() -> None:
    text = "\n".join(
        f"it {50 * k:5d}  loss 6.88  mem(alloc/reserved) {10.75 + k:.2f}/{16.65 + k:.2f} GB" for k in range(5)
    )
    samples = memory_samples(text)
    assert [s["allocated_bytes"] for s in samples] == [round((10.75 + k) * 1e9) for k in range(5)]
    assert [s["step"] for s in samples] == [0, 50, 100, 150, 200]
    # a reserved-only figure is not an allocated one: the reservation, read as a peak printed alone
    alone = memory_samples("step 5 mem reserved 16.65 GB\nstep 6 mem reserved 17.1 GB\n")
    assert [(s["allocated_bytes"], s["peak_only"], s["reserved"]) for s in alone] == [
        (16_650_000_000, 1, 1),
        (17_100_000_000, 1, 1),
    ]


def test_steady_growth_printed_in_a_json_log_is_a_leak() -> None:
    line = '{{"level":"info","msg":"epoch={e} train_loss=0.5 cuda_mem_allocated_gb={a:.2f}"}}'
    text = (
        "\n".join(line.format(e=e, a=4.42 + 1.71 * e) for e in range(9)) + "\n" + TRACEBACK + OOM_A100 + "\n"
    )
    d, _ = diagnose_text(text)
    assert d.verdict == "tensor_leak", d.headline
    flat = "\n".join(line.format(e=e, a=4.42) for e in range(9)) + "\n" + TRACEBACK + OOM_A100 + "\n"
    assert diagnose_text(flat)[0].verdict != "tensor_leak"


# ---------------------------------------------------------------- a bar redrawn after an OOM the job survived
def test_redraws_of_a_bar_after_a_caught_oom_count_as_progress() -> None:
    caught = "[eval] batch 118/640 skipped after CUDA OOM: " + OOM_A100 + "\n"
    bar = "\r".join(f"train e5:  {k}%|   | {150 * k}/2400 [01:08<17:02, 2.20it/s]" for k in range(1, 13))
    died = "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n"
    text = caught + bar + "\n" + died
    progress, _ = went_on_after(text, 1)
    assert progress == 12
    d, _ = diagnose_text(text)
    assert d.verdict == "shm_exhausted", d.headline
    # one redraw only: the OOM may still have ended the job
    assert went_on_after(caught + bar.split("\r")[0] + "\n" + died, 1)[0] == 1


# ---------------------------------------------------------------- a first step that never finished
def _bar_log(before: str) -> str:
    return before + TRACEBACK + OOM_A100 + "\n"


@pytest.mark.parametrize(
    ("before", "first"),
    [
        ("  0%|          | 0/9750 [00:00<?, ?it/s]\n", "0/9750"),
        ("Epoch 0:   0%|          | 0/500 [00:00<?, ?it/s]\n", "0/500"),
        (
            "  0%|          | 0/9750 [00:00<?, ?it/s]\r  0%|          | 1/9750 [00:03<8:00:00, 3.0s/it]\n",
            None,
        ),
        ("Epoch 3:   0%|          | 0/500 [00:00<?, ?it/s]\n", None),  # a later epoch's bar
        # the first epoch's name printed on a line of its own, its bar on the next (Lightning's, tqdm's desc)
        ("Epoch 0: \n  0%|          | 0/2502 [00:00<?, ?it/s]\n", "0/2502"),
        ("Epoch 1: \n  0%|          | 0/2502 [00:00<?, ?it/s]\n", None),
        ("step 100 loss 2.1\n  0%|          | 0/50 [00:00<?, ?it/s]\n", None),  # training ran before
        ("loading shards\n", None),  # no bar at all
        # bars of preparing the data and loading the weights are not training steps
        (
            "Running tokenizer on train dataset: 100%|██████████| 88/88 [01:12<00:00,  1.21ba/s]\n"
            "Map (num_proc=8): 100%|██████████| 5000/5000 [00:03<00:00, 1500.00 examples/s]\n"
            "Loading checkpoint shards: 100%|██████████| 4/4 [00:41<00:00, 10.33s/it]\n"
            "  0%|          | 0/3694 [00:00<?, ?it/s]\n",
            "0/3694",
        ),
        # whatever came before the HF Trainer's banner was the setup's
        (
            "100%|██████████| 88/88 [01:12<00:00,  1.21it/s]\n***** Running training *****\n"
            "  Num examples = 88641\n  0%|          | 0/312 [00:00<?, ?it/s]\n",
            "0/312",
        ),
        (
            "***** Running training *****\n  0%|          | 0/312 [00:00<?, ?it/s]\r  2%|▏         | 5/312 "
            "[00:09<09:00,  1.8s/it]\n",
            None,
        ),
    ],
)
def test_a_bar_still_at_zero_means_the_first_step(before: str, first: str | None) -> None:
    text = _bar_log(before)
    line_no = text.count("\n")
    assert first_step_bar(text, line_no) == first


def test_a_first_step_that_did_not_fit_is_too_large() -> None:
    d, ev = diagnose_text(_bar_log("  0%|          | 0/9750 [00:00<?, ?it/s]\n"))
    assert ev.step == 0
    assert d.verdict == "workload_too_large", d.headline
    d, ev = diagnose_text(_bar_log("step 100 loss 2.1\n"))
    assert ev.step is None and d.verdict == "inconclusive"  # a leak and a big batch look the same


VLLM = (
    "ERROR [core.py:340] Traceback (most recent call last):\n"
    'ERROR [core.py:340]   File "/usr/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", '
    "line 1912, in {fn}\n"
    "ERROR [core.py:340]     sampler_output = self.sampler(logits=dummy_logits)\n"
    "ERROR [core.py:340] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 594.00 MiB. GPU 0 has a "
    "total capacity of 79.19 GiB of which 145.06 MiB is free. Process 3183 has 79.04 GiB memory in use. Of the "
    "allocated memory 77.24 GiB is allocated by PyTorch, and 189.34 MiB is reserved by PyTorch but unallocated.\n"
)


@pytest.mark.parametrize(
    ("fn", "setup"), [("_dummy_sampler_run", True), ("profile_run", True), ("execute_model", False)]
)
def test_an_inference_server_sizing_itself_at_start_up(fn: str, setup: bool) -> None:
    d, ev = diagnose_text(VLLM.format(fn=fn))
    assert (ev.setup_call is not None) is setup
    assert (d.verdict == "workload_too_large") is setup, d.headline


VLLM_FREE = (
    "INFO 07-14 09:31:20 [gpu_worker.py:140] init_device\n"
    "ERROR 07-14 09:31:23 [core.py:586] ValueError: Free memory on device ({free}/79.19 GiB) on startup is less "
    "than desired GPU memory utilization ({util}, {want} GiB). Decrease GPU memory utilization or reduce GPU "
    "memory used by other processes.\n"
)


@pytest.mark.parametrize(
    ("free", "util", "want", "verdict"),
    [("31.52", "0.9", "71.27", "other_process"), ("72.10", "0.95", "75.23", "other_process")],
)
def test_vllm_finding_the_device_taken_at_start_up_is_another_process(
    free: str, util: str, want: str, verdict: str
) -> None:
    """vLLM measures the device before it loads anything: what is in use then, but for its context, is
    other processes'. Its budget is its own setting, not a tensor it needed: no too-large verdict."""
    d, ev = diagnose_text(VLLM_FREE.format(free=free, util=util, want=want))
    assert ev.step == 0  # a server's start-up: nothing could have leaked
    assert d.verdict == verdict, d.headline
    assert "tensor_leak" not in d.candidates


SERVING_CONFIG = [
    "INFO 12-18 10:44:39 worker.py:241] model weights take 65.72GiB; non_torch_memory takes 1.19GiB; PyTorch "
    "activation peak memory takes 5.31GiB; the rest of the memory reserved for KV Cache is -0.98GiB.\n"
    "ERROR 12-18 10:44:40 engine.py:366] ValueError: No available memory for the cache blocks. Try increasing "
    "`gpu_memory_utilization` when initializing the engine.\n",
    "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be stored "
    "in KV cache (28752). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing "
    "the engine.\n",
    "2024-05-14T08:05:01.667214Z ERROR warmup{max_input_length=30000 max_prefill_tokens=32000}:warmup: "
    "text_generation_client: router/client/src/lib.rs:33: Server error: Not enough memory to handle 32000 prefill "
    "tokens. You need to decrease `--max-batch-prefill-tokens`\n",
]


@pytest.mark.parametrize("log", SERVING_CONFIG)
def test_a_server_whose_own_budget_cannot_hold_its_configuration_is_too_large(log: str) -> None:
    d, _ = diagnose_text(log)
    assert d.verdict == "workload_too_large", d.headline
    assert d.owner == "algorithm"
    assert any("--max-model-len" in a or "--max-batch-prefill-tokens" in a for a in d.actions)


def test_tgis_warm_up_failing_in_torch_is_its_start_up() -> None:
    tb = (
        "Traceback (most recent call last):\n"
        '  File "/opt/conda/lib/python3.11/site-packages/text_generation_server/models/flash_causal_lm.py", '
        "line 912, in warmup\n    _, batch, _ = self.generate_token(batch)\n"
    )
    d, ev = diagnose_text(tb + OOM_A100)
    assert ev.setup_call is not None and "warmup" in ev.setup_call
    assert d.verdict == "workload_too_large", d.headline


# ---------------------------------------------------------------- a slice or a cap of the job's own
MIG_LOG = (
    "device: NVIDIA A100-SXM4-80GB MIG 2g.20gb\n"
    "  0%|          | 0/3000 [00:00<?, ?it/s]\n"
    + TRACEBACK
    + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of "
    "19.50 GiB of which 812.00 MiB is free. Of the allocated memory 18.31 GiB is allocated by PyTorch, and "
    "201.00 MiB is reserved by PyTorch but unallocated.\n"
)


MIG_ASKED = (
    '[entrypoint] chart values: resources.limits["nvidia.com/mig-{asked}"]=1\n'
    "[entrypoint] nvidia-smi -L\nGPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5b1e0f3a)\n"
    "  MIG 1g.10gb     Device  0: (UUID: MIG-0f6a2c71)\n"
    "Traceback (most recent call last):\n"
    '  File "/srv/embed.py", line 41, in main\n    model.to("cuda")\n'
    'RuntimeError: NVML_SUCCESS == r INTERNAL ASSERT FAILED at "../c10/cuda/CUDACachingAllocator.cpp":830, '
    "please report a bug to PyTorch.\n"
)


@pytest.mark.parametrize(("asked", "quota"), [("3g.40gb", True), ("1g.10gb", False)])
def test_a_pod_that_asked_for_a_larger_slice_than_it_runs_on(asked: str, quota: bool) -> None:
    """The log shows the MIG resource the pod asked for and the slice it got (nvidia-smi -L): a smaller
    slice than asked is the platform's; the slice it asked for, with nothing saying how full it was, is
    not decided."""
    d, ev = diagnose_text(MIG_ASKED.format(asked=asked))
    assert ev.mig_profile == "1g.10gb"
    assert (d.verdict == "gpu_quota") is quota, d.headline


def test_a_first_step_that_does_not_fit_a_mig_slice_nothing_says_it_asked_for_is_the_slice() -> None:
    d, ev = diagnose_text(MIG_LOG)
    assert ev.step == 0 and ev.mig_profile == "2g.20gb"
    assert d.verdict == "gpu_quota", d.headline
    assert "workload_too_large" in d.candidates


def _capped_bundle(set_by: dict[str, object] | None, declared: int | None) -> dict[str, object]:
    total = 84_987_740_160
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": "00000000-0000-4000-8000-00000000c0de",
        "occurred_at": "2026-11-30T10:00:00+00:00",
        "kind": "cuda_oom",
        "error": {
            "type": "torch.OutOfMemoryError",
            "message": (
                "CUDA out of memory. Tried to allocate 1.56 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
                "39.73 GiB is free. Including non-PyTorch memory, this process has 39.42 GiB memory in use. 39.58 "
                "GiB allowed; Of the allocated memory 38.85 GiB is allocated by PyTorch, and 47.82 MiB is reserved "
                "by PyTorch but unallocated."
            ),
        },
        "workload": {"pid": 1207, "pids": [1207], "step": 0, "batch_size": 32},
        "device": {
            "index": 0,
            "name": "NVIDIA A100-SXM4-80GB",
            "total_bytes": total,
            "free_bytes": 42_658_824_192,
            "declared_total_bytes": declared,
            "processes": [{"pid": 1207, "used_bytes": 42_328_915_968}],
        },
        "allocator": {"fraction": 0.5, "fraction_set_by": set_by},
    }


def test_a_cap_the_job_set_itself_is_its_own_limit_whatever_gpu_it_was_declared_for() -> None:
    own = {
        "fraction": 0.5,
        "device": 0,
        "filename": "/workspace/train.py",
        "line": 47,
        "function": "setup_device",
    }
    d, ev = diagnose_bundle(_capped_bundle(own, declared=80 * GiB))
    assert ev.cap_set_by_job and ev.promised_bytes is None
    assert d.verdict == "workload_too_large", d.headline
    # a cap of unknown origin under a whole-GPU declaration is the platform's
    d, ev = diagnose_bundle(_capped_bundle(None, declared=80 * GiB))
    assert ev.promised_bytes == 80 * GiB
    assert d.verdict == "gpu_quota", d.headline


def test_a_cap_set_outside_the_folders_the_jobs_traceback_runs_through_is_not_the_jobs() -> None:
    """A site's launcher outside site-packages is user code by its path; the job's own traceback says where
    the job's source is."""
    site = {
        "fraction": 0.5,
        "device": 0,
        "filename": "/opt/gpushare/lib/gpushare/launch.py",
        "line": 88,
        "function": "_apply_share",
    }
    traceback = 'Traceback (most recent call last):\n  File "/workspace/proj/train.py", line 120, in main\n    loss = model(x)\n'
    bundle = _capped_bundle(site, declared=80 * GiB)
    bundle["error"]["traceback"] = traceback
    d, ev = diagnose_bundle(bundle)
    assert ev.cap_set_by_job is None
    assert d.verdict == "gpu_quota", d.headline
    # the job's own utilities under its source folder are its own
    bundle = _capped_bundle({**site, "filename": "/workspace/proj/utils/gpu.py"}, declared=80 * GiB)
    bundle["error"]["traceback"] = traceback
    d, ev = diagnose_bundle(bundle)
    assert ev.cap_set_by_job == "gpu.py:88 in _apply_share"
    assert d.verdict == "workload_too_large", d.headline


CAPPED = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.20 GiB. GPU 3 has a total capacity of "
    "79.15 GiB of which 3.14 GiB is free. Including non-PyTorch memory, this process has 55.64 GiB memory in use. "
    "Process 5123 has 20.37 GiB memory in use. 55.41 GiB allowed; Of the allocated memory 53.90 GiB is allocated "
    "by PyTorch, and 1.12 GiB is reserved by PyTorch but unallocated.\n"
)
PPO_TRACEBACK = (
    'Traceback (most recent call last):\n  File "/opt/rlhf/train_ppo.py", line 351, in main\n'
    "    stats = trainer.step(rollouts)\n"
)


@pytest.mark.parametrize(
    ("setter", "platform"),
    [
        (
            "[ppo] train_ppo.py:88 co-locating the rollout engine: torch.cuda.set_per_process_memory_fraction(0.70, device=3)",
            False,
        ),
        (
            "[gpu-share] /etc/python3/sitecustomize.py: policy 'shared-a100-70'; applying torch.cuda.set_per_process_memory_fraction(0.7)",
            True,
        ),
        (
            "[ppo] train_ppo.py:88 torch.cuda.set_per_process_memory_fraction(0.50, device=3)",
            True,
        ),  # not this cap
    ],
)
def test_a_cap_the_log_shows_the_jobs_own_code_setting(setter: str, platform: bool) -> None:
    """The log shows a fraction being set: from a file the job's own traceback runs through, it is the job's
    choice (a co-located rollout engine), not the platform's quota; from a platform hook that logs what it
    applied, or a fraction that is not this cap, the cap stays the platform's."""
    d, ev = diagnose_text(
        "\n".join([setter, "[ppo] iter 100 reward 0.24", PPO_TRACEBACK.rstrip("\n"), CAPPED])
    )
    assert bool(ev.cap_set_by_job) is not platform
    if platform:
        assert d.verdict == "gpu_quota", d.headline
    else:
        assert d.verdict != "gpu_quota" and "gpu_quota" not in d.candidates[:1], d.headline


# ---------------------------------------------------------------- process lines NVML could not fill
WSL = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacty of "
    "24.00 GiB of which 0 bytes is free. Including non-PyTorch memory, this process has 17179869184.00 GiB memory "
    "in use. Process 2954422 has {other} memory in use. Of the allocated memory 23.01 GiB is allocated by PyTorch, "
    "and 121.23 MiB is reserved by PyTorch but unallocated.\n"
)


def test_a_process_line_larger_than_the_device_is_usage_nvml_could_not_report() -> None:
    """Windows (WDDM) and WSL report 2^64 bytes for every process: no neighbour is known from that."""
    d, ev = diagnose_text(WSL.format(other="17179869184.00 GiB"))
    assert ev.message is not None and ev.message.processes == []
    assert ev.message.extra.get("process_usage_unknown") == "1"
    assert d.verdict != "other_process", d.headline
    # a real neighbour's line beside the sentinel still counts
    d, ev = diagnose_text(
        WSL.format(other="12.00 GiB").replace("23.01 GiB is allocated", "11.01 GiB is allocated")
    )
    assert [p.used_bytes for p in ev.message.processes] == [12 * GiB]


RANKS = (
    "deepspeed --include localhost:0,1,2,3,4 src/train_bash.py\n"
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 136.00 MiB. GPU 0 has a total capacty of "
    "23.65 GiB of which 93.81 MiB is free. Process {a} has 398.00 MiB memory in use. Process {b} has 398.00 MiB "
    "memory in use. Process 62200 has 21.98 GiB memory in use. Of the allocated memory 21.51 GiB is allocated by "
    "PyTorch, and 72.34 MiB is reserved by PyTorch but unallocated.\n"
)


def test_bare_contexts_of_processes_started_beside_the_job_are_its_other_ranks() -> None:
    d, ev = diagnose_text(RANKS.format(a=62201, b=62203))
    assert ev.other_process_bytes == 0
    assert any("its other ranks" in e.fact for e in d.evidence)
    assert d.verdict != "other_process"
    # far-off pids holding as much are someone else's: they stay neighbours
    _, ev = diagnose_text(RANKS.format(a=1201, b=88703))
    assert ev.other_process_bytes == 2 * 398 * (1 << 20)


# ---------------------------------------------------------------- other spellings of a platform limit
def test_hamis_earlier_name_reports_the_vgpu_limit() -> None:
    log = (
        " [4pdvGPU ERROR (pid:99 thread=139987068696320 multiprocess_memory_limit.c:277)]: device OOM "
        "encountered: usage=9502195712 limit=8388608000\n"
        " python: /libcuda_override/src/multiprocess/multiprocess_memory_limit.c:277: "
        "set_gpu_device_memory_monitor: Assertion `0' failed.\n"
    )
    d, ev = diagnose_text(log)
    assert ev.message is not None and ev.message.vgpu_limit_bytes == 8388608000
    assert d.verdict == "gpu_quota", d.headline


SEMLOCK = (
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.10/dist-packages/torch/utils/data/dataloader.py", line 1024, in __init__\n'
    "    index_queue = multiprocessing_context.Queue()\n"
    '  File "/usr/lib/python3.10/multiprocessing/synchronize.py", line 57, in __init__\n'
    "    sl = self._semlock = _multiprocessing.SemLock(\n"
    "OSError: [Errno 28] No space left on device\n"
)


def test_a_dataloader_queue_semaphore_without_room_is_a_full_dev_shm() -> None:
    d, _ = diagnose_text(SEMLOCK)
    assert d.verdict == "shm_exhausted", d.headline
    # the same error writing a checkpoint is the disk's, not /dev/shm's
    disk = SEMLOCK.replace(
        "sl = self._semlock = _multiprocessing.SemLock(", "torch.save(state, path)"
    ).replace("synchronize.py", "checkpoint.py")
    assert diagnose_text(disk)[0].verdict != "shm_exhausted"


def test_a_worker_bus_error_wrapped_by_the_paste_is_still_one() -> None:
    log = (
        "RuntimeError: DataLoader worker (pid 47) is killed by signal: Bus\n"
        "error. It is possible that dataloader's workers are out of shared\n"
        "memory. Please try to raise your shared memory limit.\n"
    )
    assert diagnose_text(log)[0].verdict == "shm_exhausted"
    killed = "RuntimeError: DataLoader worker (pid 47) is killed by signal: Killed.\n"
    assert diagnose_text(killed)[0].verdict != "shm_exhausted"


# ---------------------------------------------------------------- long logs of several attempts
def _megatron(it: int, mb: float, rank: int = 0) -> str:
    return (
        f"[default{rank}]:[Rank {rank}] (after {it} iterations) memory (MB) | allocated: {mb:.1f} | max allocated: "
        f"{mb + 1400:.1f} | reserved: {mb + 2200:.1f} | max reserved: {mb + 2200:.1f}"
    )


def test_megatrons_memory_report_prints_its_unit_once_for_the_line() -> None:
    samples = memory_samples("\n".join(_megatron(500 * k, 20121.6 + 1500 * k) for k in range(1, 6)))
    assert [s["allocated_bytes"] for s in samples] == [
        round((20121.6 + 1500 * k) * 2**20) for k in range(1, 6)
    ]
    # "max allocated" is the peak: the word stands apart from the key
    assert [s["peak_allocated_bytes"] for s in samples] == [
        round((21521.6 + 1500 * k) * 2**20) for k in range(1, 6)
    ]


def test_live_memory_printed_between_steps_is_not_their_peak() -> None:
    """A loop that prints only ``memory_allocated()`` between batches shows the floor: nothing says how
    high its steps went, so a failing step far above the floor is not "unlike every earlier step"."""
    prints = "\n".join(
        f"[asr] INFO: {1200 * k}/8641 files, allocated {11.9 + 0.05 * (k % 2):.2f} GiB, reserved {31.4 + 4 * k:.2f} GiB"
        for k in range(1, 6)
    )
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.52 GiB. GPU 0 has a total capacity of "
        "47.54 GiB of which 1.16 GiB is free. Including non-PyTorch memory, this process has 46.37 GiB memory in "
        "use. Of the allocated memory 29.94 GiB is allocated by PyTorch, and 15.93 GiB is reserved by PyTorch but "
        "unallocated.\n"
    )
    d, ev = diagnose_text(prints + "\n" + TRACEBACK + oom)
    assert len(ev.steps) == 5 and not ev.peaks_sampled
    assert ev.earlier_peaks == []
    assert not any("peaked at" in e.fact for e in d.evidence), [e.fact for e in d.evidence]


@pytest.mark.parametrize(("request_gib", "decided"), [(58.61, True), (40.00, False)])
def test_a_request_that_cannot_fit_beside_what_the_job_held_after_loading(
    request_gib: float, decided: bool
) -> None:
    """One generate() call asks for a buffer that does not fit beside the weights the log showed loaded:
    nothing released (a leak's blocks, a neighbour's) would have made room. A request that would fit
    beside them is not decided by the message."""
    log = (
        "INFO run_generation: model loaded: 13.02B params, dtype=torch.float16, "
        "torch.cuda.memory_allocated()=24.24 GiB\n"
        + TRACEBACK
        + f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {request_gib:.2f} GiB. GPU 0 has a total "
        "capacity of 79.15 GiB of which 21.39 GiB is free. Including non-PyTorch memory, this process has 57.76 GiB "
        "memory in use. Of the allocated memory 56.96 GiB is allocated by PyTorch, and 318.41 MiB is reserved by "
        "PyTorch but unallocated.\n"
    )
    d, ev = diagnose_text(log)
    assert ev.log_floor_bytes == round(24.24 * GiB)
    assert ev.request_beyond_floor is decided
    if decided:
        assert d.verdict == "workload_too_large", d.headline
    else:
        assert d.verdict == "inconclusive", d.headline


@pytest.mark.parametrize(
    ("prints", "unallocated_gib", "want"),
    [(30, 18.6, "fragmentation"), (5, 18.6, "inconclusive"), (30, 4.0, "inconclusive")],
)
def test_a_long_flat_run_that_failed_with_large_holes(prints: int, unallocated_gib: float, want: str) -> None:
    """Only the floor between steps printed, flat over a long run: nothing leaked and steps like this one
    ran that long. Holes the allocator could not release that are a large share of what the job could hold
    and the request many times over decided it. A short run, or holes that are a small share, do not."""
    floors = "\n".join(
        f"step {30 * k:5d} | loss 1.{k % 7} | mem_alloc {43.3 + 0.05 * (k % 3):.2f} GiB"
        for k in range(prints)
    )
    held = 44.03
    reserved = held + unallocated_gib
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.20 GiB. GPU 0 has a total capacity of "
        f"{reserved + 0.5 + 0.9:.2f} GiB of which 0.90 GiB is free. Including non-PyTorch memory, this process "
        f"has {reserved + 0.5:.2f} GiB memory in use. Of the allocated memory {held:.2f} GiB is allocated by "
        f"PyTorch, and {unallocated_gib:.2f} GiB is reserved by PyTorch but unallocated.\n"
    )
    d, _ = diagnose_text(floors + "\n" + TRACEBACK + oom)
    assert d.verdict == want, d.headline


def test_deepspeeds_timer_prints_gib_as_gb() -> None:
    line = (
        "[INFO] [timer.py:198:stop] epoch=0/micro_step={k}/global_step={k}, RunningAvgSamplesPerSec=17.9, "
        "CurrSamplesPerSec=18.1, MemAllocated=22.1GB, MaxMemAllocated=31.5GB"
    )
    samples = memory_samples("\n".join(line.format(k=k) for k in (10, 30, 50)))
    assert [s["step"] for s in samples] == [10, 30, 50]
    assert samples[0]["allocated_bytes"] == round(22.1 * GiB)
    assert samples[0]["peak_allocated_bytes"] == round(31.5 * GiB)
    # a key that only ends in "unallocated" is reserved memory, not allocated
    assert memory_samples("step 5 unallocated: 3.2 GiB\nstep 6 unallocated: 3.4 GiB\n") == []


FRAG_OLD = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 640.00 MiB. GPU 0 has a total capacty "
    "of 79.15 GiB of which 378.19 MiB is free. Including non-PyTorch memory, this process has 78.77 GiB memory "
    "in use. Of the allocated memory 51.36 GiB is allocated by PyTorch, and 26.67 GiB is reserved by PyTorch but "
    "unallocated.\n"
)


@pytest.mark.parametrize(
    ("rise_mb", "peak_extra_mb", "want"), [(0, 15300, "fragmentation"), (0, 12000, None), (900, 15300, None)]
)
def test_flat_reports_whose_peak_passed_the_failing_moment_make_it_the_holes(
    rise_mb: float, peak_extra_mb: float, want: str | None
) -> None:
    """Megatron's reports: live memory flat for thousands of iterations and a peak above what the failing
    moment needed (51.36 GiB held + 640 MiB asked): the step fits, and 26.67 GiB left in split segments
    decided it. A peak below that moment, or live memory climbing, does not show it."""
    reports = [
        f"[Rank 0] (after {1000 * k} iterations) memory (MB) | allocated: {38112.5 + rise_mb * k:.1f} | max "
        f"allocated: {38112.5 + rise_mb * k + peak_extra_mb:.1f} | reserved: 55296.0 | max reserved: 55296.0"
        for k in range(1, 5)
    ]
    d, _ = diagnose_text("\n".join([*reports, TRACEBACK.rstrip("\n"), FRAG_OLD]))
    if want:
        assert d.verdict == want, d.headline
    else:
        assert d.verdict != "fragmentation", d.headline


def test_the_samples_are_the_last_attempts() -> None:
    """Live memory rose in both attempts from the same baseline; the launcher restarted the workers in
    between, or the count started again with memory back at its first level: only the last attempt's
    samples are read (the drop at the restart is not a fall of the job's memory)."""
    first = [_megatron(500 * k, 18600 + 1500 * k) for k in range(1, 30)]
    second = [_megatron(500 * k, 18600 + 1500 * k) for k in range(1, 25)]
    restart = "torch.distributed.elastic.agent.server.api: [INFO] [default] Restarting worker group"
    samples = memory_samples("\n".join([*first, restart, *second]))
    assert len(samples) == 24 and samples[0]["allocated_bytes"] == (18600 + 1500) * 2**20
    samples = memory_samples("\n".join([*first, "starting job attempt=1", *second]))
    assert len(samples) == 24  # no restart line: the count started again at the first level
    # a count per epoch that starts again while memory stays up is not a new attempt
    per_epoch = [
        f"epoch {e} step {k} mem_allocated {10 + e * 5 + k * 0.01:.2f} GiB"
        for e in range(3)
        for k in range(5)
    ]
    assert len(memory_samples("\n".join(per_epoch))) == 15


# ---------------------------------------------------------------- the input grew just before the OOM
STEPS_AT_2048 = "".join(
    f" iteration {k:6d}/ 200000 | lm loss: 3.9 | grad norm: 0.8 |\n" for k in range(6000, 8000, 500)
)
CURRICULUM_OOM = (
    'Traceback (most recent call last):\n  File "/w/pretrain_gpt.py", line 212, in <module>\n'
    "    pretrain()\n"
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 39.39 GiB total "
    "capacity; 38.19 GiB already allocated; 418.72 MiB free; 38.47 GiB reserved in total by PyTorch)\n"
)


@pytest.mark.parametrize(
    ("between", "change"),
    [
        ("[curriculum] step 8000: seq_len 2048 -> 4096\n", ("seq_len", 2048, 4096)),
        ("progressive resize: image_size from 224 to 384\n", ("image_size", 224, 384)),
        ("[curriculum] seq_len 4096 -> 2048\n", None),  # shrank
        # a step at the new size ran and printed before the failure: not the first at its size
        ("[curriculum] step 8000: seq_len 2048 -> 4096\n iteration   8010/ 200000 | lm loss: 3.9 |\n", None),
        ("", None),
    ],
)
def test_the_input_grew_just_before_the_oom(between: str, change: tuple[str, int, int] | None) -> None:
    text = STEPS_AT_2048 + between + CURRICULUM_OOM
    assert size_change_before(text, text.count("\n")) == change


def test_a_first_step_at_a_larger_input_that_did_not_fit_is_too_large() -> None:
    d, ev = diagnose_text(STEPS_AT_2048 + "[curriculum] step 8000: seq_len 2048 -> 4096\n" + CURRICULUM_OOM)
    assert ev.log_size_change == ("seq_len", 2048, 4096)
    assert d.verdict == "workload_too_large"
    assert any("seq_len 2048 -> 4096" in e.fact for e in d.evidence)
    # without the log's word, a leak and a too-large step look the same here
    d, _ = diagnose_text(STEPS_AT_2048 + CURRICULUM_OOM)
    assert d.verdict == "inconclusive"
    # nothing ran before the change: the size of the first step says nothing of a change
    d, ev = diagnose_text("[curriculum] seq_len 2048 -> 4096\n" + CURRICULUM_OOM)
    assert ev.log_size_change is None


def test_vllm_killing_its_own_process_tree_after_the_error_is_not_a_memory_kill() -> None:
    """vLLM's front end, told its engine died (the error above), SIGKILLs its own process tree: the shell's
    ``Killed`` after that line is its teardown, not the kernel's OOM killer. A ``Killed`` with nothing before
    it to say who sent it is still read as the kernel's."""
    start = VLLM_FREE.format(free="11.87", util="0.9", want="71.27")
    teardown = (
        "CRITICAL 07-14 09:31:23 [core_client.py:361] Got fatal signal from worker processes, shutting down. See "
        "stack trace above for root cause issue.\nKilled\n"
    )
    d, ev = diagnose_text(start + teardown)
    assert ev.other_killer is not None and "fatal signal" in ev.other_killer
    assert d.verdict == "other_process"
    _, ev = diagnose_text(start + "Killed\n")
    assert ev.other_killer is None
