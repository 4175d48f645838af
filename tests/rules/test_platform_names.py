"""What a log says about the GPU the job asked for and the one it got, beyond nvidia.com labels:

- a node selector on a site's own GPU-type label (``gpu-type: a100-80gb``) is what the job asked for, and
  outranks the GPU feature discovery label of the node it landed on (a node labelled for another GPU than it
  has is what sent the job there);
- a pod that asked for the MIG slice it runs on was sized for that slice: the slice is no quota below it;
- an NVIDIA vGPU (GRID) profile in the device's name (``GRID A100D-20C``) is a share of a larger physical GPU,
  and a profile the VM asked for (``requested_vgpu_profile=A100D-80C``) is the size it was declared for;
- a desktop GPU's name (``NVIDIA GeForce RTX 3080``) says the device is no MIG slice, whatever its size.

Message formats follow SNAPSHOT_FORMAT.md §4; the label, resource and profile spellings follow the Kubernetes
device plugin's, GPU feature discovery's and NVIDIA's vGPU guide's documented forms (none runs here).
"""

from __future__ import annotations

from triage.pipeline import diagnose_text

PRE_2_1 = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate {req} (GPU 0; {total} total capacity; "
    "{alloc} already allocated; {free} free; {res} reserved in total by PyTorch)\n"
)
BAR = "Epoch 0:   0%|          | 0/800 [00:00<?, ?it/s]\n"


def test_a_site_gpu_type_selector_outranks_the_label_of_the_node_it_got() -> None:
    text = (
        "    nodeSelector:\n      lab.example.org/gpu-type: h100-80gb\n"
        "node labels: lab.example.org/gpu-type=h100-80gb nvidia.com/gpu.memory=40960\n"
        + BAR
        + PRE_2_1.format(
            req="2.10 GiB", total="39.39 GiB", alloc="36.02 GiB", free="1.10 GiB", res="37.70 GiB"
        )
    )
    d, ev = diagnose_text(text)
    assert ev.log_asked_gpu == ("h100-80gb", 80 << 30)
    assert ev.declared_total_bytes == 80 << 30
    assert d.verdict == "gpu_quota", d.headline


def test_the_mig_slice_the_pod_asked_for_is_no_quota() -> None:
    limits = '{"cpu":"8","memory":"64Gi","nvidia.com/mig-3g.40gb":"1"}\n'
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 5.50 GiB. GPU 0 has a total capacity of "
        "39.25 GiB of which 1.60 GiB is free. Of the allocated memory 36.90 GiB is allocated by PyTorch, and "
        "210.00 MiB is reserved by PyTorch but unallocated.\n"
    )
    text = limits + "device: NVIDIA H100 80GB HBM3 MIG 3g.40gb\n" + BAR + oom
    d, ev = diagnose_text(text)
    assert ev.mig_profile == "3g.40gb" and ev.declared_total_bytes == 40 << 30
    assert d.verdict != "gpu_quota", d.headline
    # the same job with nothing saying which slice it asked for: the slice is a candidate
    d2, ev2 = diagnose_text("device: NVIDIA H100 80GB HBM3 MIG 3g.40gb\n" + BAR + oom)
    assert ev2.declared_total_bytes is None and "gpu_quota" in [*d2.candidates, d2.verdict]


def test_a_grid_vgpu_profile_is_a_share_of_a_larger_gpu() -> None:
    oom = PRE_2_1.format(
        req="1.50 GiB", total="15.50 GiB", alloc="13.40 GiB", free="1.02 GiB", res="14.05 GiB"
    )
    smi = "name, memory.total [MiB]\nGRID L40S-16C, 16384 MiB\n"
    asked = "provision: requested_vgpu_profile=L40S-48C, placed with L40S-16C\n"
    d, ev = diagnose_text(asked + smi + BAR + oom)
    assert ev.vgpu_limit_bytes is not None and ev.physical_bytes == 48 << 30
    assert ev.declared_total_bytes == 48 << 30
    assert d.verdict == "gpu_quota", d.headline
    # a profile the VM was given with nothing asked: the share is read, what it was sized for is not known
    _, ev2 = diagnose_text(smi + BAR + oom)
    assert ev2.vgpu_limit_bytes is not None and ev2.declared_total_bytes is None
    # a board the table does not know: not read
    _, ev3 = diagnose_text("GRID Z900-16C, 16384 MiB\n" + BAR + oom)
    assert ev3.vgpu_limit_bytes is None


def test_a_desktop_gpu_is_no_mig_slice() -> None:
    oom = PRE_2_1.format(
        req="640.00 MiB", total="9.78 GiB", alloc="8.91 GiB", free="14.00 MiB", res="9.10 GiB"
    )
    _, bare = diagnose_text(BAR + oom)
    assert bare.slice_sized is not None  # a 10 GiB device with nothing saying what it is: a slice's size
    d, ev = diagnose_text("Device: cuda:0 NVIDIA GeForce RTX 3080 : native\n" + BAR + oom)
    assert ev.device_name == "NVIDIA GeForce RTX 3080"
    assert ev.slice_sized is None
    assert not any("MIG" in e.fact for e in d.evidence)
