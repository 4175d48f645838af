"""What around the OOM in a log decides it:

- a serving launcher's own memory fraction (TGI's ``--cuda-memory-fraction``) is the job's budget, not a
  platform's cap;
- a message printed before its traceback (ComfyUI's "!!! Exception during processing !!!" line): the progress
  bar above it still tells the first step had not finished;
- a size printed beside each memory print under a bare ``size`` key (a progressive GAN's resolution), with the
  print's own rounding as noise: memory that rose only with it is the input's growth, not a leak;
- nvidia-smi printed after the crash lists the job's Python beside its neighbours: the interpreter in the
  folder (or its virtual environment) of the job's own traced files is the job.

Message formats follow SNAPSHOT_FORMAT.md §4 and §5; the tools' lines follow their documented output (TGI's
launcher Args, ComfyUI's execution messages, nvidia-smi 550's table). No tool runs here.
"""

from __future__ import annotations

from triage.pipeline import diagnose_text

MSG_2_2 = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req}. GPU 0 has a total capacity of {total} "
    "of which {free} is free. {procs}{allowed}Of the allocated memory {alloc} is allocated by PyTorch, and {ru} is "
    "reserved by PyTorch but unallocated.\n"
)


def test_a_servers_own_memory_fraction_is_its_budget() -> None:
    oom = MSG_2_2.format(
        req="2.00 GiB",
        total="79.15 GiB",
        free="41.60 GiB",
        procs="Process 71 has 37.51 GiB memory in use. ",
        allowed="37.20 GiB allowed; ",
        alloc="36.40 GiB",
        ru="500.00 MiB",
    )
    head = 'INFO text_generation_launcher: Args { model_id: "/data/m", cuda_memory_fraction: 0.47, .. }\n'
    d, ev = diagnose_text(head + "Warming up model\n" + oom)
    assert ev.cap_set_by_job is not None
    assert d.verdict != "gpu_quota", d.headline
    d2, ev2 = diagnose_text("Warming up model\n" + oom)
    assert ev2.cap_set_by_job is None and d2.verdict == "gpu_quota", d2.headline


def test_a_message_printed_before_its_traceback_keeps_the_bar_above_it() -> None:
    oom = MSG_2_2.format(
        req="9.80 GiB",
        total="11.76 GiB",
        free="3.70 GiB",
        procs="Including non-PyTorch memory, this process has 8.04 GiB memory in use. ",
        allowed="",
        alloc="7.21 GiB",
        ru="310.00 MiB",
    )
    text = (
        "got prompt\nRequested to load SDXL\n  0%|          | 0/25 [00:00<?, ?it/s]\n"
        "!!! Exception during processing !!! " + oom + "Traceback (most recent call last):\n"
        '  File "/srv/ui/execution.py", line 310, in execute\n    output = run(node)\n'
        "torch.OutOfMemoryError: " + oom.split(": ", 1)[1]
    )
    d, ev = diagnose_text(text)
    assert ev.first_step_bar == "0/25"
    assert d.verdict == "workload_too_large", d.headline


def _stages(last_oom: str) -> str:
    lines = []
    level = {8: 0.41, 16: 0.58, 32: 0.97, 64: 1.9, 128: 3.04, 256: 6.71}
    jitter = [0.0, 0.02, -0.01, 0.01, 0.0, 0.02]
    for size, base in level.items():
        for k in range(6):
            step = (len(lines) + 1) * 5000
            lines.append(f"[mem] step {step} size {size} batch 16 allocated {base + jitter[k]:.2f}G\n")
    return "".join(lines) + last_oom


def test_memory_that_rose_only_with_a_printed_size_is_the_input_not_a_leak() -> None:
    oom = (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 10.92 GiB total "
        "capacity; 10.01 GiB already allocated; 220.00 MiB free; 10.09 GiB reserved in total by PyTorch)\n"
    )
    d, ev = diagnose_text(_stages("size 256 -> 512\n" + oom))
    assert ev.growth_with_input is not None and ev.growth_with_input[0] == "size"
    assert d.verdict != "tensor_leak", d.headline


def test_a_byte_count_under_a_size_key_is_no_input_size() -> None:
    from triage.messages import _RE_SIZE_KEY

    assert [m.group(2) for m in _RE_SIZE_KEY.finditer("size 256 cache size 3 GiB size=12M res 512")] == [
        "256",
        "512",
    ]


def test_the_jobs_python_in_a_listing_printed_after_the_crash() -> None:
    oom = MSG_2_2.format(
        req="640.00 MiB",
        total="9.78 GiB",
        free="14.00 MiB",
        procs="",  # NVML listed nothing to torch (as in a container)
        allowed="",
        alloc="6.30 GiB",
        ru="0 bytes",
    )
    smi = (
        "|    0   N/A  N/A      1874      G   /usr/lib/xorg/Xorg                            412MiB |\n"
        "|    0   N/A  N/A     14120    C+G   /opt/render/bin/render                       2821MiB |\n"
        "|    0   N/A  N/A     20918      C   /home/ana/studio/venv/bin/python              166MiB |\n"
    )
    trace = (
        "Traceback (most recent call last):\n"
        '  File "/home/ana/studio/execution.py", line 88, in run\n    out = model(x)\n'
    )
    d, ev = diagnose_text(trace + oom + "after the crash:\n" + smi)
    own = [p for p in ev.processes if p.own]
    assert [p.pid for p in own] == [20918]
    assert {p.pid for p in ev.processes if not p.own} == {1874, 14120}
    assert d.verdict == "other_process", d.headline
    # the same listing without the job's source in the log: no line is known to be the job's, none a neighbour
    _, ev2 = diagnose_text(oom + "after the crash:\n" + smi)
    assert not ev2.processes


def test_nvidia_smi_run_from_the_shell_after_the_job_exited_lists_only_others() -> None:
    """CTranslate2 (faster-whisper) says "CUDA failed with error out of memory" while loading its model; the
    user then ran nvidia-smi at the prompt: the job's process was gone, so every row is another's."""
    log = (
        "$ python transcribe.py rec/ --model large-v3\n"
        "loading model on cuda:0\n"
        "Traceback (most recent call last):\n"
        '  File "/home/u/transcribe.py", line 12, in <module>\n    model = WhisperModel(name, device="cuda")\n'
        "RuntimeError: CUDA failed with error out of memory\n"
        "\n$ nvidia-smi\n"
        "|    0   N/A  N/A      1102      G   /usr/lib/xorg/Xorg                            341MiB |\n"
        "|    0   N/A  N/A      2741      C   /usr/local/bin/llm-server                    5214MiB |\n"
    )
    d, ev = diagnose_text(log)
    assert ev.is_cuda_oom and ev.log_smi_after_exit
    assert {p.pid for p in ev.processes if not p.own} == {1102, 2741}
    assert d.verdict == "other_process", d.headline
    # the same listing printed by the job's own code after the traceback (no prompt): its rows may hold the
    # job (a process still alive, another rank): none is known to be a neighbour
    _, ev2 = diagnose_text(log.replace("$ nvidia-smi\n", "listing:\n"))
    assert not ev2.log_smi_after_exit and not ev2.processes


def test_live_memory_printed_after_each_request() -> None:
    from triage.messages import _sample_on

    s = _sample_on("[req 011] bucket=2048 prompt=9618 | alloc_after=22.41GiB")
    assert s is not None and s["allocated_bytes"] == round(22.41 * (1 << 30)) and "peak_only" not in s


def test_a_notebook_that_ran_its_load_cell_again_has_no_fresh_first_step() -> None:
    """Reloading the model in a second cell of the same kernel keeps the first copy while anything references
    it; the OOM in the first step of training then says nothing about the step alone."""
    oom = MSG_2_2.format(
        req="1.25 GiB",
        total="79.10 GiB",
        free="449.28 MiB",
        procs="Including non-PyTorch memory, this process has 78.66 GiB memory in use. ",
        allowed="",
        alloc="77.40 GiB",
        ru="700.00 MiB",
    )
    cells = (
        'In [3]: model = AutoModelForCausalLM.from_pretrained(CKPT).to("cuda")\n'
        "In [9]: trainer.train()\nValueError: Attempting to unscale FP16 gradients.\n"
        'In [15]: model = AutoModelForCausalLM.from_pretrained(CKPT).to("cuda")\n'
        "In [16]: trainer.train()\n  0%|          | 0/3000 [00:00<?, ?it/s]\n"
    )
    d, ev = diagnose_text(cells + "OutOfMemoryError: " + oom.split(": ", 1)[1])
    assert ev.first_step_bar is None
    assert any("again (cells 3, 15)" in n for n in ev.notes)
    assert d.verdict == "inconclusive"
    # one run of each cell: the bar still says the first step
    once = cells.replace("In [15]: model", "In [15]: tokenizer").replace(
        "In [9]: trainer.train()", "In [9]: x = 1"
    )
    d2, ev2 = diagnose_text(once + "OutOfMemoryError: " + oom.split(": ", 1)[1])
    assert ev2.first_step_bar == "0/3000" and d2.verdict == "workload_too_large"


def test_a_rate_per_step_is_no_step_number() -> None:
    from triage.messages import _first_step_line

    assert _first_step_line("[03:17:01] step 0 starting; tokens/step=65536")
    assert not _first_step_line("[03:17:01] step 4 done; tokens/step=65536")
    # a step counter after a slash is still one ("micro_step=10/global_step=10")
    assert not _first_step_line("epoch=0/micro_step=10/global_step=10")


def test_an_oom_the_loop_says_it_skipped_did_not_end_the_job() -> None:
    """The OOM was caught ("skipping eval batch", then training went on); a host kill ended the job."""
    oom = MSG_2_2.format(
        req="4.00 GiB",
        total="79.10 GiB",
        free="3.59 GiB",
        procs="",
        allowed="",
        alloc="74.10 GiB",
        ru="800.00 MiB",
    )
    log = (
        "step 6000 loss 2.25\n"
        f"WARNING eval batch 58 raised torch.OutOfMemoryError: {oom.split(': ', 1)[1]}"
        "WARNING skipping eval batch 58, torch.cuda.empty_cache()\n"
        "step 7000 loss 2.19\nstep 8000 loss 2.13\n"
        "Memory cgroup out of memory: Killed process 3310 (python3) total-vm:150000000kB, anon-rss:134000000kB\n"
    )
    d, ev = diagnose_text(log)
    assert ev.survived_oom is not None
    assert d.verdict != "workload_too_large", d.headline
    # without the loop's word, two lines of progress are not enough to say it went on
    _, ev2 = diagnose_text(log.replace("WARNING skipping eval batch 58, torch.cuda.empty_cache()\n", ""))
    assert ev2.survived_oom is None


def test_a_slurm_gpu_type_that_states_its_memory_is_what_the_job_asked_for() -> None:
    oom = MSG_2_2.format(
        req="2.50 GiB",
        total="39.39 GiB",
        free="563.20 MiB",
        procs="Including non-PyTorch memory, this process has 38.84 GiB memory in use. ",
        allowed="",
        alloc="36.40 GiB",
        ru="1.80 GiB",
    )
    log = "requested: --nodes=2 --gres=gpu:a100_80gb:4 --mem=480G\n[rank 0] step 0 starting\n" + oom
    d, ev = diagnose_text(log)
    assert ev.log_asked_gpu == ("a100_80gb", 80 << 30)
    assert d.verdict == "gpu_quota", d.headline


def _eval_tb(gather: bool) -> str:
    frames = [
        ("/app/run_clm.py", 655, "main"),
        ("/opt/conda/lib/python3.10/site-packages/transformers/trainer.py", 3666, "evaluate"),
        ("/opt/conda/lib/python3.10/site-packages/transformers/trainer.py", 3882, "evaluation_loop"),
    ]
    if gather:
        frames += [
            (
                "/opt/conda/lib/python3.10/site-packages/transformers/trainer_pt_utils.py",
                127,
                "nested_concat",
            ),
            (
                "/opt/conda/lib/python3.10/site-packages/transformers/trainer_pt_utils.py",
                88,
                "torch_pad_and_concatenate",
            ),
        ]
    else:
        frames += [("/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py", 1739, "_call_impl")]
    lines = ["Traceback (most recent call last):"]
    lines += [f'  File "{f}", line {n}, in {fn}\n    pass' for f, n, fn in frames]
    return "\n".join(lines) + "\n"


def test_an_oom_while_the_evaluation_loop_gathers_its_predictions() -> None:
    """HF Trainer without eval_accumulation_steps concatenates every batch's predictions on the GPU: an OOM in
    that gathering is kept predictions as much as a large batch, whatever the steps before peaked at."""
    oom = MSG_2_2.format(
        req="36.10 GiB",
        total="79.15 GiB",
        free="35.00 GiB",
        procs="",
        allowed="",
        alloc="42.30 GiB",
        ru="1.40 GiB",
    )
    steps = "".join(f"step {k * 100} loss 1.{k} mem_allocated=8.2GiB\n" for k in range(1, 9))
    d, ev = diagnose_text(steps + _eval_tb(True) + oom)
    assert ev.eval_gather == "trainer_pt_utils.py:88 in torch_pad_and_concatenate"
    assert d.verdict == "inconclusive" and "tensor_leak" in d.candidates
    assert any("eval_accumulation_steps" in a for a in d.actions)
    _, ev2 = diagnose_text(steps + _eval_tb(False) + oom)
    assert ev2.eval_gather is None
