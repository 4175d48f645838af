"""Simulated training incidents with ground-truth labels.

Every scenario is ``fn(seed, **params) -> ScenarioResult``: a training program (files, functions,
lines, torch internals, all drawn from the seed) runs on :class:`~triage.simulate.allocator.CachingAllocator`
until it crashes (or finishes), and the result carries the torch snapshot, the message the job
printed, an incident bundle (``docs/bundle.md``) and the truth: verdict, owner, leak site, the
largest batch size that really fits (found by re-running the loop, never by a formula), family,
and whether the case is a hard negative.

Labels are decided from what the simulation did, not from what the family intended: a candidate
run that does not show what the family is about is discarded and the next attempt (a sub-seed)
is tried, so each label is honest.
"""

from __future__ import annotations

import json
import random
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from triage.errors import InputError
from triage.simulate.allocator import (
    EMPTY_FRAMES,
    CachingAllocator,
    Frame,
    FrameList,
    GiB,
    MiB,
    SimulatedOOM,
    format_size,
)

SCHEMA = "oom-triage/incident@1"
_NS = uuid.UUID("6c1f6f0e-3b7a-4c55-9d0e-6f2a0c9e4b11")


@dataclass
class ScenarioResult:
    name: str
    seed: int
    snapshot: dict[str, Any] | None
    message: str | None
    bundle: dict[str, Any]
    truth: dict[str, Any]
    # fits(batch_size) -> bool: re-runs the loop at that batch size (families with a max_batch_size)
    probe: Callable[[int], bool] | None = field(default=None, repr=False, compare=False)
    # the allocator the run ended with (snapshots in other layouts, memory_stats)
    allocator: CachingAllocator | None = field(default=None, repr=False, compare=False)


def legacy_snapshot(result: ScenarioResult) -> dict[str, Any] | None:
    """The run's snapshot in torch 2.0's layout (blocks with ``history``, no trace ``time_us``)."""
    if result.allocator is None:
        return None
    return result.allocator.snapshot(legacy=True)


class _Retry(Exception):
    """This attempt did not show what the family is about; try the next sub-seed."""


# --------------------------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    key: str
    name: str
    total_bytes: int
    ctx_range: tuple[int, int]  # non-PyTorch memory of a process (CUDA context, cuBLAS workspaces)


def _gib(g: float) -> int:
    return round(g * 1024) * MiB


GPUS: dict[str, Gpu] = {
    "A100-40GB": Gpu("A100-40GB", "NVIDIA A100-SXM4-40GB", _gib(39.39), (400, 640)),
    "A100-80GB": Gpu("A100-80GB", "NVIDIA A100-SXM4-80GB", _gib(79.15), (420, 680)),
    "H100-80GB": Gpu("H100-80GB", "NVIDIA H100 80GB HBM3", _gib(79.10), (500, 760)),
    "L4-24GB": Gpu("L4-24GB", "NVIDIA L4", _gib(22.17), (300, 480)),
    "A10G-24GB": Gpu("A10G-24GB", "NVIDIA A10G", _gib(21.99), (300, 460)),
    "V100-32GB": Gpu("V100-32GB", "Tesla V100-SXM2-32GB", _gib(31.75), (320, 500)),
}

# MIG slices: (profile, device total as cudaMemGetInfo reports it)
MIG_PROFILES: dict[str, list[tuple[str, int]]] = {
    "A100-80GB": [("1g.10gb", _gib(9.50)), ("2g.20gb", _gib(19.50)), ("3g.40gb", _gib(39.25))],
    "H100-80GB": [("1g.10gb", _gib(9.75)), ("2g.20gb", _gib(19.75)), ("3g.40gb", _gib(39.62))],
    "A100-40GB": [("1g.5gb", _gib(4.75)), ("2g.10gb", _gib(9.75)), ("3g.20gb", _gib(19.62))],
}


# --------------------------------------------------------------------------------------------
# The training program: files, functions, lines, and the frames of every call site
# --------------------------------------------------------------------------------------------

_PY_ENVS = [
    # (site-packages, python version, stdlib dir, interpreter source dir or None)
    ("/usr/local/lib/python3.10/dist-packages", "3.10", "/usr/lib/python3.10", None),
    ("/opt/conda/lib/python3.11/site-packages", "3.11", "/opt/conda/lib/python3.11", "3.11.9"),
    ("/usr/lib/python3/dist-packages", "3.12", "/usr/lib/python3.12", None),
    ("/workspace/.venv/lib/python3.12/site-packages", "3.12", "/usr/lib/python3.12", None),
    (
        "/root/miniconda3/envs/train/lib/python3.11/site-packages",
        "3.11",
        "/root/miniconda3/envs/train/lib/python3.11",
        "3.11.7",
    ),
    ("/usr/local/lib/python3.11/site-packages", "3.11", "/usr/local/lib/python3.11", None),
]
_USERS = ["alice", "bwu", "chen", "dpatel", "eva", "fkim", "gsantos", "hiro", "ines", "jmartin"]
_PROJECTS = ["llm-ft", "vision", "speech", "recsys", "nanogpt", "mmpretrain", "seg", "rlhf", "dino", "asr"]
_PKGS = ["trainlib", "mlcore", "lmtrain", "visionkit", "fastexp", "research", "nn_exp", "pipeline"]

# torch's own Python frames per op, innermost first: (function, path under torch/, line)
_TORCH_PY: dict[str, list[tuple[str, str, int]]] = {
    "linear": [("forward", "nn/modules/linear.py", 125)],
    "conv2d": [("_conv_forward", "nn/modules/conv.py", 543), ("forward", "nn/modules/conv.py", 548)],
    "layer_norm": [
        ("layer_norm", "nn/functional.py", 2910),
        ("forward", "nn/modules/normalization.py", 217),
    ],
    "rms_norm": [("rms_norm", "nn/functional.py", 2929), ("forward", "nn/modules/normalization.py", 402)],
    "batch_norm": [("batch_norm", "nn/functional.py", 2813), ("forward", "nn/modules/batchnorm.py", 193)],
    "gelu": [("forward", "nn/modules/activation.py", 734)],
    "relu": [("relu", "nn/functional.py", 1704), ("forward", "nn/modules/activation.py", 133)],
    "embedding": [("embedding", "nn/functional.py", 2551), ("forward", "nn/modules/sparse.py", 190)],
    "cross_entropy": [("cross_entropy", "nn/functional.py", 3494)],
    "cross_entropy_module": [
        ("cross_entropy", "nn/functional.py", 3494),
        ("forward", "nn/modules/loss.py", 1310),
    ],
    "avg_pool": [
        ("adaptive_avg_pool2d", "nn/functional.py", 1381),
        ("forward", "nn/modules/pooling.py", 1454),
    ],
    "adam_state": [
        ("_init_group", "optim/adam.py", 166),
        ("step", "optim/adam.py", 236),
        ("_use_grad", "optim/optimizer.py", 79),
        ("wrapper", "optim/optimizer.py", 485),
    ],
    "adam_foreach": [
        ("_multi_tensor_adam", "optim/adam.py", 654),
        ("maybe_fallback", "optim/optimizer.py", 154),
        ("adam", "optim/adam.py", 899),
        ("step", "optim/adam.py", 247),
        ("_use_grad", "optim/optimizer.py", 79),
        ("wrapper", "optim/optimizer.py", 485),
    ],
    "sgd_state": [
        ("_multi_tensor_sgd", "optim/sgd.py", 405),
        ("sgd", "optim/sgd.py", 293),
        ("step", "optim/sgd.py", 125),
        ("_use_grad", "optim/optimizer.py", 79),
        ("wrapper", "optim/optimizer.py", 485),
    ],
    "sgd_foreach": [
        ("_multi_tensor_sgd", "optim/sgd.py", 382),
        ("sgd", "optim/sgd.py", 293),
        ("step", "optim/sgd.py", 125),
        ("_use_grad", "optim/optimizer.py", 79),
        ("wrapper", "optim/optimizer.py", 485),
    ],
    "clip_norm": [
        ("_get_total_norm", "nn/utils/clip_grad.py", 95),
        ("_no_grad_wrapper", "nn/utils/clip_grad.py", 35),
        ("clip_grad_norm_", "nn/utils/clip_grad.py", 225),
        ("_no_grad_wrapper", "nn/utils/clip_grad.py", 35),
    ],
    "module_to": [
        ("convert", "nn/modules/module.py", 1355),
        ("_apply", "nn/modules/module.py", 942),
        ("_apply", "nn/modules/module.py", 915),
        ("_apply", "nn/modules/module.py", 915),
        ("to", "nn/modules/module.py", 1369),
    ],
    "zero_grad": [("zero_grad", "optim/optimizer.py", 1005)],
    "backward": [
        ("_engine_run_backward", "autograd/graph.py", 824),
        ("backward", "autograd/__init__.py", 353),
        ("backward", "_tensor.py", 648),
    ],
}
_MODULE_OPS = {
    "linear",
    "conv2d",
    "layer_norm",
    "rms_norm",
    "batch_norm",
    "gelu",
    "relu",
    "embedding",
    "cross_entropy_module",
    "avg_pool",
}
_MODULE_WRAP = [
    ("_call_impl", "nn/modules/module.py", 1762),
    ("_wrapped_call_impl", "nn/modules/module.py", 1751),
]

# aten kernel and Python binding per op, for C++ frames (stacks="all")
_ATEN: dict[str, tuple[str, str, str]] = {
    "linear": ("addmm", "THPVariable_linear", "python_nn_functions.cpp"),
    "conv2d": ("cudnn_convolution", "THPVariable_conv2d", "python_torch_functions_0.cpp"),
    "layer_norm": ("native_layer_norm", "THPVariable_layer_norm", "python_torch_functions_2.cpp"),
    "rms_norm": ("_fused_rms_norm", "THPVariable_rms_norm", "python_torch_functions_2.cpp"),
    "batch_norm": ("cudnn_batch_norm", "THPVariable_batch_norm", "python_torch_functions_1.cpp"),
    "gelu": ("gelu", "THPVariable_gelu", "python_nn_functions.cpp"),
    "relu": ("relu", "THPVariable_relu", "python_torch_functions_2.cpp"),
    "embedding": ("index_select", "THPVariable_embedding", "python_torch_functions_1.cpp"),
    "cross_entropy": ("_log_softmax", "THPVariable_cross_entropy_loss", "python_nn_functions.cpp"),
    "cross_entropy_module": ("_log_softmax", "THPVariable_cross_entropy_loss", "python_nn_functions.cpp"),
    "avg_pool": ("mean", "THPVariable_adaptive_avg_pool2d", "python_nn_functions.cpp"),
    "sdpa": (
        "_scaled_dot_product_flash_attention",
        "THPVariable_scaled_dot_product_attention",
        "python_nn_functions.cpp",
    ),
    "add": (
        "add_Tensor",
        "TypeError_to_NotImplemented_<&torch::autograd::THPVariable_add>",
        "python_variable_methods.cpp",
    ),
    "to": ("_to_copy", "THPVariable_to", "python_variable_methods.cpp"),
    "adam_state": ("zeros_like", "THPVariable_zeros_like", "python_torch_functions_2.cpp"),
    "adam_foreach": ("_foreach_sqrt", "THPVariable__foreach_sqrt", "python_torch_functions_0.cpp"),
    "sgd_state": ("clone", "THPVariable_clone", "python_torch_functions_1.cpp"),
    "sgd_foreach": ("_foreach_mul_Scalar", "THPVariable__foreach_mul", "python_torch_functions_1.cpp"),
    "clip_norm": ("_foreach_norm_Scalar", "THPVariable__foreach_norm", "python_torch_functions_0.cpp"),
    "module_to": ("_to_copy", "THPVariable_to", "python_variable_methods.cpp"),
    "clone": ("clone", "THPVariable_clone", "python_variable_methods.cpp"),
    "float": ("_to_copy", "THPVariable_float", "python_variable_methods.cpp"),
    "mean": ("mean_dim", "THPVariable_mean", "python_variable_methods.cpp"),
    "cat": ("cat", "THPVariable_cat", "python_torch_functions_1.cpp"),
    "softmax": ("_softmax", "THPVariable_softmax", "python_variable_methods.cpp"),
    "histc": ("histc", "THPVariable_histc", "python_torch_functions_1.cpp"),
    "none": ("empty_strided", "THPVariable_empty_strided", "python_torch_functions_0.cpp"),
}
_CPP_HEAD = [
    ("torch::unwind::unwind()", "??"),
    ("torch::CapturedTraceback::gather(bool, bool, bool)", "??"),
    ("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp"),
]
_CPP_MALLOC = [
    (
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)",
        "CUDACachingAllocator.cpp",
    ),
    (
        "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)",
        "",
    ),
    ("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)", ""),
    (
        "at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)",
        "",
    ),
    (
        "at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)",
        "??",
    ),
    (
        "at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, std::optional<c10::Device>, std::optional<c10::MemoryFormat>)",
        "??",
    ),
]
_CPP_FREE = [
    (
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free(c10::cuda::CUDACachingAllocator::Native::(anonymous namespace)::Block*)",
        "CUDACachingAllocator.cpp",
    ),
    ("c10::cuda::CUDACachingAllocator::Native::local_raw_delete(void*)", ""),
    ("c10::StorageImpl::~StorageImpl()", ""),
    ("c10::TensorImpl::~TensorImpl()", "??"),
    ("c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reset_()", "??"),
]
_CPP_ENGINE_TAIL = [
    ("torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)", ""),
    (
        "torch::autograd::call_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&)",
        "engine.cpp",
    ),
    (
        "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)",
        "??",
    ),
    ("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", "??"),
    (
        "torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)",
        "??",
    ),
    (
        "torch::autograd::python::PythonEngine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)",
        "??",
    ),
    ("execute_native_thread_routine", "thread48.o"),
    ("start_thread", "??"),
    ("clone", "??"),
]
_ENGINE_ATEN = {
    "MmBackward0": "mm",
    "AddmmBackward0": "mm",
    "NativeLayerNormBackward0": "native_layer_norm_backward",
    "GeluBackward0": "gelu_backward",
    "ScaledDotProductFlashAttentionBackward0": "_scaled_dot_product_flash_attention_backward",
    "LogSoftmaxBackward0": "_log_softmax_backward_data",
    "NllLossBackward0": "nll_loss_backward",
    "EmbeddingBackward0": "embedding_dense_backward",
    "ConvolutionBackward0": "convolution_backward",
    "CudnnBatchNormBackward0": "cudnn_batch_norm_backward",
    "ReluBackward0": "threshold_backward",
    "MeanBackward1": "expand",
    "AccumulateGrad": "clone",
}


def _lines(rng: random.Random, start: int, names: list[str], gap: tuple[int, int] = (1, 6)) -> dict[str, int]:
    out: dict[str, int] = {}
    line = start
    for n in names:
        line += rng.randint(*gap)
        out[n] = line
    return out


class Program:
    """A user's training program and its environment; builds (shared) frames for every site."""

    def __init__(self, rng: random.Random, *, style: str, arch: str, record_frames: bool = True) -> None:
        self.style = style  # "python" (stacks="python") or "all" (C++ and Python)
        self.arch = arch
        self.record_frames = record_frames
        self._frames: dict[tuple[str, str, int], Frame] = {}
        self._stacks: dict[tuple[int, ...], FrameList] = {}
        self._site_cache: dict[tuple[str, ...], FrameList] = {}
        site, pyver, stdlib, src = rng.choice(_PY_ENVS)
        self.python_version = pyver
        self.torch_dir = f"{site}/torch"
        self.stdlib = stdlib
        self.cpython_src = f"/usr/local/src/conda/python-{src}" if src else None
        user = rng.choice(_USERS)
        proj = rng.choice(_PROJECTS)
        pkg = rng.choice(_PKGS)
        root = rng.choice(
            [
                "/workspace",
                "/app",
                f"/home/{user}/{proj}",
                f"/mnt/code/{proj}",
                "/opt/ml/code",
                f"/data/{user}/{proj}",
            ]
        )
        self.root = root
        layout = rng.choice(["single", "single", "trainer", "package"])
        self.layout = layout
        arch_mod = "gpt" if arch == "transformer" else rng.choice(["resnet", "convnet", "backbone"])
        if layout == "single":
            self.loop_file = (
                f"{root}/{rng.choice(['train.py', 'train.py', 'finetune.py', 'run_train.py', 'pretrain.py'])}"
            )
            self.entry_file = self.loop_file
            self.model_file = (
                self.loop_file
                if rng.random() < 0.3
                else f"{root}/{rng.choice(['model.py', 'models.py', 'net.py'])}"
            )
            self.launch = rng.choice(["python", "python", "torchrun"])
        elif layout == "trainer":
            self.loop_file = f"{root}/{rng.choice(['trainer.py', 'engine.py', 'loop.py'])}"
            self.entry_file = f"{root}/{rng.choice(['train.py', 'main.py', 'run.py'])}"
            self.model_file = f"{root}/{rng.choice(['model.py', f'models/{arch_mod}.py', 'modeling.py'])}"
            self.launch = rng.choice(["python", "torchrun"])
        else:
            self.loop_file = f"{root}/src/{pkg}/{rng.choice(['engine.py', 'training/loop.py', 'trainer.py'])}"
            self.entry_file = f"{root}/src/{pkg}/{rng.choice(['train.py', 'cli.py', '__main__.py'])}"
            self.model_file = f"{root}/src/{pkg}/{rng.choice([f'models/{arch_mod}.py', f'nets/{arch_mod}.py', 'modeling.py'])}"
            self.launch = rng.choice(["module", "module", "torchrun"])
        self.metrics_file = f"{root}/{rng.choice(['metrics.py', 'utils/metrics.py', 'evaluation.py'])}"
        self.data_file = f"{root}/{rng.choice(['data.py', 'utils/prefetch.py', 'dataloader.py'])}"
        self.record_wrapper = self.launch == "torchrun" and rng.random() < 0.6
        self.has_step_fn = rng.random() < 0.75
        self.step_fn = rng.choice(
            ["train_step", "training_step", "step", "_run_step", "forward_backward", "_train_batch"]
        )
        self.loop_fn = rng.choice(
            ["train", "train_one_epoch", "run_epoch", "fit", "_train_loop", "train_epoch"]
        )
        self.main_fn = rng.choice(["main", "main", "run", "cli_main", "launch"])
        s0 = rng.randint(30, 420)
        self.step_lines = _lines(
            rng,
            s0,
            [
                "data",
                "forward",
                "loss",
                "leak",
                "cache",
                "metrics",
                "backward",
                "clip",
                "opt",
                "zero",
                "empty_cache",
                "log",
            ],
            (1, 5),
        )
        l0 = self.step_lines["log"] + rng.randint(6, 60)
        self.loop_lines = _lines(rng, l0, ["next", "call", "eval"], (2, 9))
        m0 = (
            rng.randint(20, 200)
            if self.entry_file != self.loop_file
            else self.loop_lines["eval"] + rng.randint(10, 80)
        )
        self.main_lines = _lines(rng, m0, ["model_to", "call"], (3, 40))
        self.module_line = self.main_lines["call"] + rng.randint(4, 30)
        self.metrics_line = rng.randint(20, 160)
        self.prefetch_lines = _lines(rng, rng.randint(15, 120), ["preload", "next"], (3, 25))
        self.attn_helper = rng.random() < 0.4
        # model lines
        a0 = rng.randint(20, 140)
        self.attn_lines = _lines(rng, a0, ["qkv", "sdpa", "proj", "helper_call"], (1, 8))
        self.mlp_lines = _lines(
            rng, self.attn_lines["helper_call"] + rng.randint(8, 40), ["fc1", "act", "fc2"], (1, 3)
        )
        self.block_lines = _lines(rng, self.mlp_lines["fc2"] + rng.randint(8, 40), ["attn", "mlp"], (1, 3))
        self.model_lines = _lines(
            rng,
            self.block_lines["mlp"] + rng.randint(10, 80),
            ["embed", "mem", "blocks", "norm", "head"],
            (1, 5),
        )
        c0 = rng.randint(20, 120)
        self.conv_lines = _lines(rng, c0, ["conv", "bn", "relu"], (1, 2))
        self.net_lines = _lines(
            rng, self.conv_lines["relu"] + rng.randint(10, 60), ["stem", "stages", "pool", "fc"], (1, 4)
        )
        self.ce_module = rng.random() < 0.5
        self.gelu_module = rng.random() < 0.5
        self.norm_op = "layer_norm"
        # a validation function between the step function and the loop (no draws: the rest stays as it was)
        self.eval_fn = "evaluate"
        self.eval_lines = {"data": self.step_lines["log"] + 3, "call": self.step_lines["log"] + 4}
        self.ctx = "forward"  # who calls the model: the training step, or "eval" (the validation function)

    # ------------------------------------------------------------------ frames
    def f(self, name: str, filename: str, line: int = 0) -> Frame:
        key = (name, filename, line)
        fr = self._frames.get(key)
        if fr is None:
            fr = self._frames[key] = {"name": name, "filename": filename, "line": line}
        return fr

    def _intern(self, frames: list[Frame]) -> FrameList:
        if not self.record_frames or not frames:
            return EMPTY_FRAMES
        key = tuple(id(x) for x in frames)
        st = self._stacks.get(key)
        if st is None:
            st = self._stacks[key] = frames
        return st

    def torch_frames(self, op: str) -> list[Frame]:
        out = [self.f(n, f"{self.torch_dir}/{p}", ln) for n, p, ln in _TORCH_PY.get(op, [])]
        if op in _MODULE_OPS:
            out += self.wrap()
        return out

    def wrap(self) -> list[Frame]:
        return [self.f(n, f"{self.torch_dir}/{p}", ln) for n, p, ln in _MODULE_WRAP]

    def _interp_tail(self) -> list[Frame]:
        src = self.cpython_src
        if src is None:
            return [
                self.f("_PyEval_EvalFrameDefault", "??"),
                self.f("PyEval_EvalCode", "??"),
                self.f("run_eval_code_obj", ""),
                self.f("run_mod", ""),
                self.f("pyrun_file", ""),
                self.f("_PyRun_SimpleFileObject", "??"),
                self.f("Py_RunMain", "??"),
                self.f("Py_BytesMain", "??"),
                self.f("__libc_start_main", "??"),
                self.f("_start", "??"),
            ]
        return [
            self.f("_PyEval_EvalFrameDefault", f"{src}/Python/generated_cases.c.h", 3728),
            self.f("PyEval_EvalCode", f"{src}/Python/ceval.c", 578),
            self.f("run_eval_code_obj", f"{src}/Python/pythonrun.c", 1722),
            self.f("run_mod", f"{src}/Python/pythonrun.c", 1743),
            self.f("pyrun_file", f"{src}/Python/pythonrun.c", 1643),
            self.f("_PyRun_SimpleFileObject", f"{src}/Python/pythonrun.c", 433),
            self.f("_PyRun_AnyFileObject", f"{src}/Python/pythonrun.c", 78),
            self.f("pymain_run_file_obj", f"{src}/Modules/main.c", 360),
            self.f("Py_BytesMain", f"{src}/Modules/main.c", 763),
            self.f("__libc_start_main", "??"),
            self.f("_start", "??"),
        ]

    def _cpp_op(self, op: str) -> list[Frame]:
        aten, binding, bfile = _ATEN.get(op, _ATEN["none"])
        vt = 1 + (sum(map(ord, aten)) % 4)
        return [
            self.f(
                f"at::(anonymous namespace)::wrapper_CUDA_{aten}(at::Tensor const&, at::Tensor const&)",
                "RegisterCUDA.cpp",
            ),
            self.f(
                f"at::_ops::{aten}::redispatch(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&)",
                "??",
            ),
            self.f(
                f"torch::autograd::VariableType::(anonymous namespace)::{aten}(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&)",
                f"VariableType_{vt}.cpp",
            ),
            self.f(f"at::_ops::{aten}::call(at::Tensor const&, at::Tensor const&)", "??"),
            self.f(f"torch::autograd::{binding}(_object*, _object*, _object*)", bfile),
            self.f(
                "cfunction_call",
                f"{self.cpython_src}/Objects/methodobject.c" if self.cpython_src else "",
                537 if self.cpython_src else 0,
            ),
            self.f(
                "_PyObject_MakeTpCall",
                f"{self.cpython_src}/Objects/call.c" if self.cpython_src else "??",
                240 if self.cpython_src else 0,
            ),
        ]

    def compose(self, op: str, py: list[Frame], *, free: bool = False) -> FrameList:
        """A full stack: C++ frames (style "all"), then Python frames innermost first, then the interpreter."""
        if self.style == "python":
            return self._intern(py)
        head = [self.f(n, fn) for n, fn in _CPP_HEAD]
        mid = [self.f(n, fn) for n, fn in (_CPP_FREE if free else _CPP_MALLOC)]
        return self._intern(head + mid + self._cpp_op(op) + py + self._interp_tail())

    def engine(self, node: str, *, free: bool = False) -> FrameList:
        """An allocation on the autograd engine's device thread: no Python frames there."""
        if self.style == "python":
            return EMPTY_FRAMES
        aten = _ENGINE_ATEN.get(node, "empty")
        frames = [self.f(n, fn) for n, fn in _CPP_HEAD]
        frames += [self.f(n, fn) for n, fn in (_CPP_FREE if free else _CPP_MALLOC)]
        frames += [
            self.f(f"at::_ops::{aten}::call(at::Tensor const&, at::Tensor const&)", "??"),
            self.f(
                f"torch::autograd::generated::{node}::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)",
                "??",
            ),
        ]
        frames += [self.f(n, fn) for n, fn in _CPP_ENGINE_TAIL]
        return self._intern(frames)

    # ------------------------------------------------------------------ user chains (innermost first)
    def outer(self) -> list[Frame]:
        out: list[Frame] = []
        if self.record_wrapper:
            out.append(
                self.f(
                    "wrapper", f"{self.torch_dir}/distributed/elastic/multiprocessing/errors/__init__.py", 355
                )
            )
        out.append(self.f("<module>", self.entry_file, self.module_line))
        if self.launch == "module":
            out.append(self.f("_run_code", f"{self.stdlib}/runpy.py", 88))
            out.append(self.f("_run_module_as_main", f"{self.stdlib}/runpy.py", 198))
        return out

    def loop(self, phase: str) -> list[Frame]:
        main = [self.f(self.main_fn, self.entry_file, self.main_lines["call"]), *self.outer()]
        if phase == "setup":
            return [self.f(self.main_fn, self.entry_file, self.main_lines["model_to"]), *self.outer()]
        if phase == "next":
            return [self.f(self.loop_fn, self.loop_file, self.loop_lines["next"]), *main]
        if phase in ("eval", "eval.data"):
            line = self.eval_lines["call" if phase == "eval" else "data"]
            return [
                self.f(self.eval_fn, self.loop_file, line),
                self.f(self.loop_fn, self.loop_file, self.loop_lines["eval"]),
                *main,
            ]
        if self.has_step_fn:
            return [
                self.f(self.step_fn, self.loop_file, self.step_lines[phase]),
                self.f(self.loop_fn, self.loop_file, self.loop_lines["call"]),
                *main,
            ]
        return [self.f(self.loop_fn, self.loop_file, self.step_lines[phase]), *main]

    def _model_chain(self, site: str) -> list[Frame]:
        mf = self.model_file
        W = self.wrap
        if self.arch == "transformer":
            blocks = [self.f("forward", mf, self.model_lines["blocks"]), *W(), *self.loop(self.ctx)]
            battn = [self.f("forward", mf, self.block_lines["attn"]), *W(), *blocks]
            bmlp = [self.f("forward", mf, self.block_lines["mlp"]), *W(), *blocks]
            if site == "sdpa":
                if self.attn_helper:
                    return [
                        self.f("_attn", mf, self.attn_lines["sdpa"]),
                        self.f("forward", mf, self.attn_lines["helper_call"]),
                        *W(),
                        *battn,
                    ]
                return [self.f("forward", mf, self.attn_lines["sdpa"]), *W(), *battn]
            table: dict[str, list[Frame]] = {
                "embed": [self.f("forward", mf, self.model_lines["embed"]), *W(), *self.loop(self.ctx)],
                "mem": [self.f("forward", mf, self.model_lines["mem"]), *W(), *self.loop(self.ctx)],
                "final_norm": [self.f("forward", mf, self.model_lines["norm"]), *W(), *self.loop(self.ctx)],
                "head": [self.f("forward", mf, self.model_lines["head"]), *W(), *self.loop(self.ctx)],
                "ln1": battn,
                "res1": battn,
                "qkv": [self.f("forward", mf, self.attn_lines["qkv"]), *W(), *battn],
                "proj": [self.f("forward", mf, self.attn_lines["proj"]), *W(), *battn],
                "ln2": bmlp,
                "res2": bmlp,
                "fc1": [self.f("forward", mf, self.mlp_lines["fc1"]), *W(), *bmlp],
                "act": [self.f("forward", mf, self.mlp_lines["act"]), *W(), *bmlp],
                "fc2": [self.f("forward", mf, self.mlp_lines["fc2"]), *W(), *bmlp],
            }
            return table[site]
        stages = [self.f("forward", mf, self.net_lines["stages"]), *W(), *self.loop(self.ctx)]
        table = {
            "conv": [self.f("forward", mf, self.conv_lines["conv"]), *W(), *stages],
            "bn": [self.f("forward", mf, self.conv_lines["bn"]), *W(), *stages],
            "relu": [self.f("forward", mf, self.conv_lines["relu"]), *W(), *stages],
            "stem": [self.f("forward", mf, self.net_lines["stem"]), *W(), *self.loop(self.ctx)],
            "pool": [self.f("forward", mf, self.net_lines["pool"]), *W(), *self.loop(self.ctx)],
            "head": [self.f("forward", mf, self.net_lines["fc"]), *W(), *self.loop(self.ctx)],
        }
        return table[site]

    # site -> (op, user chain)
    def _site(self, site: str) -> tuple[str, list[Frame]]:
        model_ops = {
            "embed": "embedding",
            "ln1": self.norm_op,
            "ln2": self.norm_op,
            "final_norm": self.norm_op,
            "qkv": "linear",
            "proj": "linear",
            "fc1": "linear",
            "fc2": "linear",
            "head": "linear",
            "act": "gelu" if self.gelu_module else "none",
            "sdpa": "sdpa",
            "res1": "add",
            "res2": "add",
            "mem": "clone",
            "conv": "conv2d",
            "stem": "conv2d",
            "bn": "batch_norm",
            "relu": "relu",
            "pool": "avg_pool",
        }
        if site in model_ops:
            return model_ops[site], self._model_chain(site)
        if site == "loss":
            return ("cross_entropy_module" if self.ce_module else "cross_entropy"), self.loop("loss")
        if site == "data.to":
            return "to", self.loop("eval.data" if self.ctx == "eval" else "data")
        if site == "init.to":
            return "module_to", self.loop("setup")
        if site in ("adam_state", "adam_foreach", "sgd_state", "sgd_foreach"):
            return site, self.loop("opt")
        if site == "clip":
            return "clip_norm", self.loop("clip")
        if site == "metrics":
            return "mean", [self.f("update", self.metrics_file, self.metrics_line), *self.loop("metrics")]
        if site == "prefetch":
            return "to", [
                self.f("preload", self.data_file, self.prefetch_lines["preload"]),
                self.f("__next__", self.data_file, self.prefetch_lines["next"]),
                *self.loop("next"),
            ]
        if site.startswith("leak."):
            return site.split(".", 1)[1], self.loop("leak")
        if site.startswith("cache."):
            return site.split(".", 1)[1], self.loop("cache")
        if site.startswith("log."):
            return site.split(".", 1)[1], self.loop("log")
        raise KeyError(site)

    def stack(self, site: str) -> FrameList:
        """Frames of an allocation at a site (interned: the same list object every time)."""
        key = ("m", site, self.ctx)
        st = self._site_cache.get(key)
        if st is None:
            op, chain = self._site(site)
            st = self._site_cache[key] = self.compose(op, self.torch_frames(op) + chain)
        return st

    def python_frames(self, site: str) -> list[Frame]:
        """The Python part of a site's stack (for tracebacks and truth), whatever the style."""
        op, chain = self._site(site)
        return self.torch_frames(op) + chain

    def free_stack(self, phase: str) -> FrameList:
        key = ("f", phase)
        st = self._site_cache.get(key)
        if st is None:
            if phase == "engine":
                st = self.engine("AccumulateGrad", free=True)
            elif phase == "zero":
                st = self.compose("none", self.torch_frames("zero_grad") + self.loop("zero"), free=True)
            elif phase == "opt":
                st = self.compose("none", self.torch_frames("adam_foreach") + self.loop("opt"), free=True)
            else:
                st = self.compose("none", self.loop(phase), free=True)
            self._site_cache[key] = st
        return st

    def backward_python(self) -> list[Frame]:
        return self.torch_frames("backward") + self.loop("backward")

    def is_user(self, fr: Frame) -> bool:
        fn = str(fr.get("filename", ""))
        if not fn or fn == "??" or not fn.startswith("/") or fn.endswith((".c", ".h", ".cpp")):
            return False
        return not (fn.startswith(self.torch_dir) or fn.startswith(self.stdlib) or "/site-packages/" in fn)

    def innermost_user(self, frames: list[Frame]) -> dict[str, Any] | None:
        for fr in frames:
            if self.is_user(fr):
                return {"filename": fr["filename"], "line": fr["line"], "name": fr["name"]}
        return None


# --------------------------------------------------------------------------------------------
# The model and one training step
# --------------------------------------------------------------------------------------------


@dataclass
class ModelSpec:
    arch: str
    n_layers: int
    act_bytes: int  # 2 (bf16 autocast) or 4
    optimizer: str  # adamw | adam | sgd_momentum | sgd
    foreach: bool
    set_to_none: bool
    clip: bool
    params: list[tuple[str, int, int]]  # (name, bytes, layer or -1)
    # transformer
    hidden: int = 0
    heads: int = 0
    vocab: int = 0
    seq: int = 0
    # cnn
    image: int = 0
    classes: int = 0
    channels: list[int] = field(default_factory=list)
    spatial: list[int] = field(default_factory=list)
    relu_inplace: bool = True
    norm: str = "layer_norm"

    def index(self) -> dict[str, int]:
        return {p[0]: i for i, p in enumerate(self.params)}

    @property
    def weight_bytes(self) -> int:
        return sum(p[1] for p in self.params)

    def per_sample_bytes(self, seq: int | None = None) -> int:
        """Rough activation bytes per sample (for sizing; the simulation decides what fits)."""
        d = self.act_bytes
        if self.arch == "transformer":
            s = seq or self.seq
            return self.n_layers * 17 * s * self.hidden * d + s * self.vocab * (2 * d + 8)
        tot = 0
        for c, sp in zip(self.channels, self.spatial, strict=True):
            tot += c * sp * sp * d * (2 if self.relu_inplace else 3)
        return tot * 2 + self.image * self.image * 12


def _transformer_spec(
    rng: random.Random, weight_budget: int, *, layers: tuple[int, int] = (2, 6)
) -> ModelSpec:
    L = rng.randint(*layers)
    V = rng.choice([32000, 32768, 50257, 50304, 65024, 128256])
    tied = rng.random() < 0.5
    k = 1 if tied else 2
    W = max(weight_budget, 64 * MiB)
    # 4 bytes/param: 48 L H^2 + 4 k V H = W
    disc = (4 * k * V) ** 2 + 4 * 48 * L * W
    H = int((-(4 * k * V) + disc**0.5) / (2 * 48 * L))
    H = max(256, H - H % 128)
    d = 2 if rng.random() < 0.8 else 4
    llama = rng.random() < 0.45  # RMSNorm, no biases; else GPT-style LayerNorm with biases
    params: list[tuple[str, int, int]] = [("tok_emb.weight", V * H * 4, -1)]
    for layer in range(L):
        b = f"blocks.{layer}"
        params += [(f"{b}.ln1.weight", H * 4, layer)]
        if not llama:
            params += [(f"{b}.ln1.bias", H * 4, layer)]
        params += [(f"{b}.attn.qkv.weight", 3 * H * H * 4, layer)]
        if not llama:
            params += [(f"{b}.attn.qkv.bias", 3 * H * 4, layer)]
        params += [(f"{b}.attn.proj.weight", H * H * 4, layer)]
        if not llama:
            params += [(f"{b}.attn.proj.bias", H * 4, layer)]
        params += [(f"{b}.ln2.weight", H * 4, layer)]
        if not llama:
            params += [(f"{b}.ln2.bias", H * 4, layer)]
        params += [(f"{b}.mlp.fc1.weight", 4 * H * H * 4, layer)]
        if not llama:
            params += [(f"{b}.mlp.fc1.bias", 4 * H * 4, layer)]
        params += [(f"{b}.mlp.fc2.weight", 4 * H * H * 4, layer)]
        if not llama:
            params += [(f"{b}.mlp.fc2.bias", H * 4, layer)]
    params.append(("norm.weight", H * 4, -1))
    if not llama:
        params.append(("norm.bias", H * 4, -1))
    if not tied:
        params.append(("lm_head.weight", V * H * 4, -1))
    opt = rng.choice(["adamw", "adamw", "adam", "sgd_momentum"])
    return ModelSpec(
        arch="transformer",
        n_layers=L,
        act_bytes=d,
        optimizer=opt,
        foreach=rng.random() < 0.6,
        set_to_none=rng.random() < 0.85,
        clip=rng.random() < 0.6,
        params=params,
        hidden=H,
        heads=max(1, H // 128),
        vocab=V,
        seq=rng.choice([256, 512, 1024, 2048, 4096]),
        norm="rms_norm" if llama else "layer_norm",
    )


def _cnn_spec(rng: random.Random, weight_budget: int, *, layers: tuple[int, int] = (4, 10)) -> ModelSpec:
    L = rng.randint(*layers)
    image = rng.choice([224, 224, 256, 320, 384])
    stages = [min(3, i * 4 // L) for i in range(L)]
    unit = sum(9 * (2 ** stages[i]) * (2 ** stages[i - 1] if i else 3 / 64) for i in range(L)) * 4
    c0 = int((max(weight_budget, 8 * MiB) / unit) ** 0.5)
    c0 = max(64, min(384, c0 - c0 % 16))
    chans = [c0 * 2**s for s in stages]
    spatial = [image // 2 // 2**s for s in stages]
    classes = rng.choice([10, 100, 1000, 21843])
    params: list[tuple[str, int, int]] = []
    prev = 3
    for i, c in enumerate(chans):
        params += [
            (f"layers.{i}.conv.weight", c * prev * 9 * 4, i),
            (f"layers.{i}.bn.weight", c * 4, i),
            (f"layers.{i}.bn.bias", c * 4, i),
        ]
        prev = c
    params += [("fc.weight", classes * prev * 4, -1), ("fc.bias", classes * 4, -1)]
    return ModelSpec(
        arch="cnn",
        n_layers=L,
        act_bytes=2 if rng.random() < 0.6 else 4,
        optimizer=rng.choice(["sgd_momentum", "sgd_momentum", "adamw", "sgd"]),
        foreach=rng.random() < 0.6,
        set_to_none=rng.random() < 0.85,
        clip=rng.random() < 0.3,
        params=params,
        image=image,
        classes=classes,
        channels=chans,
        spatial=spatial,
        relu_inplace=rng.random() < 0.7,
    )


@dataclass
class Leak:
    """Something the loop keeps a reference to (a leak), or keeps a bounded number of (a cache)."""

    kind: str  # logits | hidden | pooled | last_logits | metrics | features
    every: int = 1
    per_sample: int = 0  # bytes per sample (features)
    count: int = 1  # tensors per event (metrics)
    maxlen: int | None = None  # a bounded cache when set


class Job:
    """One training process: model setup and training steps, allocating through the allocator."""

    def __init__(self, spec: ModelSpec, prog: Program, alloc: CachingAllocator, op_us: int = 400) -> None:
        self.spec = spec
        self.prog = prog
        self.a = alloc
        self.op_us = op_us
        self.weights: list[int] = []
        self.grads: dict[int, int] = {}
        self.state: list[int] = []
        self.kept: list[int] = []
        self.cache: deque[int] = deque()
        self.prev_locals: list[int] = []
        self.mems: list[int] = []
        self.use_mems = False
        self.leak: Leak | None = None
        self.cache_spec: Leak | None = None
        self.empty_cache_every = 0
        self.log_every = 0
        self.retain_graph = (
            False  # backward(retain_graph=True) with the graph still referenced: nothing saved is freed
        )
        self.site = "init.to"
        self.leak_site: str | None = None
        self._pidx = spec.index()

    def m(self, site: str, nbytes: int, stream: int = 0) -> int:
        self.site = site
        addr = self.a.malloc(nbytes, self.prog.stack(site), stream)
        self.a.advance(self.op_us)
        return addr

    def e(self, node: str, nbytes: int) -> int:
        self.site = "engine"
        addr = self.a.malloc(nbytes, self.prog.engine(node))
        self.a.advance(self.op_us)
        return addr

    def fr(self, addr: int, phase: str = "engine") -> None:
        self.a.free(addr, self.prog.free_stack(phase))

    def fs(self, addr: int) -> None:
        """The backward is done with a saved activation: freed, unless the graph is retained and still
        referenced (then it stays, with every other saved tensor of that step)."""
        if self.retain_graph:
            self.kept.append(addr)
        else:
            self.fr(addr)

    def setup(self) -> None:
        for _name, n, _layer in self.spec.params:
            self.weights.append(self.m("init.to", n))

    def _grad(self, idx: int, node: str) -> None:
        if idx not in self.grads:
            self.grads[idx] = self.e(node, self.spec.params[idx][1])

    def _grads(self, prefix: str, node: str) -> None:
        """Gradients of ``prefix.weight`` and ``prefix.bias`` (when the model has one)."""
        for suffix in ("weight", "bias"):
            idx = self._pidx.get(f"{prefix}.{suffix}")
            if idx is not None:
                self._grad(idx, node if suffix == "weight" else "AddmmBackward0")

    def step(self, k: int, B: int, S: int | None = None) -> None:
        self.a.tag = k
        if self.spec.arch == "transformer":
            self._step_transformer(k, B, S or self.spec.seq)
        else:
            self._step_cnn(k, B)
        self._optimizer(k)
        if self.empty_cache_every and (k + 1) % self.empty_cache_every == 0:
            self.a.empty_cache()

    def eval_pass(self, B: int, kept: list[list[int]], *, keep: bool) -> None:
        """One validation batch run through the model from the validation function. With gradients on
        (no ``torch.no_grad()``) every saved activation belongs to the output's autograd graph; ``keep``
        appends the output to a list, which keeps the whole graph alive; else it all dies with the output."""
        self.prog.ctx = "eval"
        if self.spec.arch == "transformer":
            # the embedding is the first layer's input: in ``layers``
            batch, _, layers, mems, last, xf, stf, logits = self._forward_transformer(B, self.spec.seq)
            graph = [*(t for layer in layers for t in layer), *mems, last, xf, stf, logits]
        else:
            batch, saved, pooled, logits = self._forward_cnn(B)
            graph = [*(t for row in saved for t in row), pooled, logits]
        for t in batch:
            self.fr(t, "forward")
        if keep:
            kept.append(graph)
        else:
            for t in graph:
                self.fr(t, "forward")

    # -- the pieces shared by both architectures
    def _keep(self, k: int, B: int, S: int, logits: int, hidden_bytes: int) -> bool:
        """Apply the leak / cache after the forward pass; True when ``logits`` is kept."""
        kept_logits = False
        for spec, store in ((self.leak, self.kept), (self.cache_spec, None)):
            if spec is None or k % spec.every:
                continue
            if spec.kind == "logits":
                t = [logits]
                kept_logits = True
                self.site = "head"
            elif spec.kind == "hidden":
                t = [self.m("leak.clone" if store is not None else "cache.clone", hidden_bytes)]
            elif spec.kind == "last_logits":
                t = [self.m("leak.float", B * max(self.spec.vocab, self.spec.classes) * 4)]
            elif spec.kind == "pooled":
                t = [self.m("leak.mean" if store is not None else "cache.mean", B * spec.per_sample)]
            elif spec.kind == "features":
                t = [self.m("leak.clone" if store is not None else "cache.clone", B * spec.per_sample)]
            else:  # metrics
                t = [self.m("metrics", spec.per_sample or 4) for _ in range(spec.count)]
            if store is not None:
                store.extend(t)
                self.leak_site = self.site
            else:
                self.cache.extend(t)
                while spec.maxlen is not None and len(self.cache) > spec.maxlen:
                    self.fr(self.cache.popleft(), "cache")
        return kept_logits

    def _optimizer(self, _k: int) -> None:
        sp = self.spec
        n = len(sp.params)
        if sp.clip:
            norms = [self.m("clip", 4) for _ in range(n)]
            total = self.m("clip", 4)
            coef = self.m("clip", 4)
            for t in norms:
                self.fr(t, "clip")
            self.fr(coef, "clip")
            self.fr(total, "clip")
        adam = sp.optimizer in ("adam", "adamw")
        if not self.state and sp.optimizer != "sgd":
            site = "adam_state" if adam else "sgd_state"
            for _name, nb, _l in sp.params:
                self.state.append(self.m(site, nb))
                if adam:
                    self.state.append(self.m(site, nb))
        if sp.foreach and sp.optimizer != "sgd":
            site = "adam_foreach" if adam else "sgd_foreach"
            tmp = [self.m(site, nb) for _name, nb, _l in sp.params]
            for t in tmp:
                self.fr(t, "opt")
        if sp.set_to_none:
            for g in self.grads.values():
                self.fr(g, "zero")
            self.grads.clear()

    def _forward_transformer(
        self, B: int, S: int
    ) -> tuple[list[int], int, list[list[int]], list[int], int, int, int, int]:
        """The forward pass: (batch tensors, embedding, saved activations per layer, new memories, last
        residual, final norm and its stats, logits)."""
        sp = self.spec
        H, V, d, L = sp.hidden, sp.vocab, sp.act_bytes, sp.n_layers
        bsh = B * S * H * d
        ids = self.m("data.to", B * S * 8)
        tgt = self.m("data.to", B * S * 8)
        x = self.m("embed", bsh)
        layers: list[list[int]] = []
        new_mems: list[int] = []
        prev = x
        for _layer in range(L):
            ln1 = self.m("ln1", bsh)
            st1 = self.m("ln1", B * S * 8)
            qkv = self.m("qkv", 3 * bsh)
            att = self.m("sdpa", bsh)
            lse = self.m("sdpa", B * sp.heads * S * 4)
            proj = self.m("proj", bsh)
            r1 = self.m("res1", bsh)
            self.fr(proj, "forward")
            ln2 = self.m("ln2", bsh)
            st2 = self.m("ln2", B * S * 8)
            fc1 = self.m("fc1", 4 * bsh)
            act = self.m("act", 4 * bsh)
            fc2 = self.m("fc2", bsh)
            r2 = self.m("res2", bsh)
            self.fr(fc2, "forward")
            if self.use_mems:
                new_mems.append(self.m("mem", bsh))
            layers.append([prev, ln1, st1, qkv, att, lse, r1, ln2, st2, fc1, act])
            prev = r2
        xf = self.m("final_norm", bsh)
        stf = self.m("final_norm", B * S * 8)
        logits = self.m("head", B * S * V * d)
        return [ids, tgt], x, layers, new_mems, prev, xf, stf, logits

    def _step_transformer(self, k: int, B: int, S: int) -> None:
        sp = self.spec
        H, V, d, L = sp.hidden, sp.vocab, sp.act_bytes, sp.n_layers
        bsh = B * S * H * d
        (ids, tgt), x, layers, new_mems, prev, xf, stf, logits = self._forward_transformer(B, S)
        for t in self.prev_locals:  # last step's `logits`, `loss`, batch die on rebinding
            self.fr(t, "forward")
        self.prev_locals = []
        logp = self.m("loss", B * S * V * 4)
        loss = self.m("loss", 4)
        kept_logits = self._keep(k, B, S, logits, bsh)
        for t in self.mems:
            self.fr(t, "forward")
        self.mems = new_mems
        # backward on the engine thread
        gl = self.e("NllLossBackward0", B * S * V * 4)
        glog = self.e("LogSoftmaxBackward0", B * S * V * d)
        self.fr(gl)
        self.fs(logp)
        self._grads("lm_head", "MmBackward0")
        gx = self.e("MmBackward0", bsh)
        self.fr(glog)
        self._grads("norm", "NativeLayerNormBackward0")
        g = self.e("NativeLayerNormBackward0", bsh)
        self.fr(gx)
        self.fs(xf)
        self.fs(stf)
        self.fs(prev)
        gx = g
        for layer in reversed(range(L)):
            pb = f"blocks.{layer}"
            inp, ln1, st1, qkv, att, lse, r1, ln2, st2, fc1, act = layers[layer]
            self._grads(f"{pb}.mlp.fc2", "MmBackward0")
            g_act = self.e("MmBackward0", 4 * bsh)
            self.fs(act)
            g_fc1 = self.e("GeluBackward0", 4 * bsh)
            self.fr(g_act)
            self._grads(f"{pb}.mlp.fc1", "MmBackward0")
            g_ln2 = self.e("MmBackward0", bsh)
            self.fr(g_fc1)
            self.fs(fc1)
            self._grads(f"{pb}.ln2", "NativeLayerNormBackward0")
            g_r1 = self.e("NativeLayerNormBackward0", bsh)
            self.fr(g_ln2)
            self.fs(ln2)
            self.fs(st2)
            self.fr(gx)
            self._grads(f"{pb}.attn.proj", "MmBackward0")
            g_att = self.e("MmBackward0", bsh)
            g_qkv = self.e("ScaledDotProductFlashAttentionBackward0", 3 * bsh)
            self.fr(g_att)
            self.fs(att)
            self.fs(lse)
            self._grads(f"{pb}.attn.qkv", "MmBackward0")
            g_ln1 = self.e("MmBackward0", bsh)
            self.fr(g_qkv)
            self.fs(qkv)
            self._grads(f"{pb}.ln1", "NativeLayerNormBackward0")
            g_in = self.e("NativeLayerNormBackward0", bsh)
            self.fr(g_ln1)
            self.fs(ln1)
            self.fs(st1)
            self.fs(r1)
            self.fr(g_r1)
            if layer:
                self.fs(inp)
            gx = g_in
        self._grad(0, "EmbeddingBackward0")
        self.fr(gx)
        self.fs(x)
        locals_ = [ids, tgt, loss]
        if not kept_logits:
            locals_.append(logits)
        self.prev_locals = locals_

    def _forward_cnn(self, B: int) -> tuple[list[int], list[list[int]], int, int]:
        """The forward pass: (batch tensors, saved activations per layer, pooled features, logits)."""
        sp = self.spec
        d = sp.act_bytes
        ims = self.m("data.to", B * 3 * sp.image * sp.image * 4)
        tgt = self.m("data.to", B * 8)
        saved: list[list[int]] = []
        for i, (c, s) in enumerate(zip(sp.channels, sp.spatial, strict=True)):
            n = B * c * s * s * d
            conv = self.m("stem" if i == 0 else "conv", n)
            bn = self.m("bn", n)
            stats = self.m("bn", c * 8)
            row = [conv, bn, stats]
            if not sp.relu_inplace:
                row.append(self.m("relu", n))
            saved.append(row)
        pooled = self.m("pool", B * sp.channels[-1] * d)
        logits = self.m("head", B * sp.classes * d)
        return [ims, tgt], saved, pooled, logits

    def _step_cnn(self, k: int, B: int) -> None:
        sp = self.spec
        d = sp.act_bytes
        (ims, tgt), saved, pooled, logits = self._forward_cnn(B)
        for t in self.prev_locals:
            self.fr(t, "forward")
        self.prev_locals = []
        logp = self.m("loss", B * sp.classes * 4)
        loss = self.m("loss", 4)
        kept_logits = self._keep(k, B, 0, logits, B * sp.channels[-1] * sp.spatial[-1] ** 2 * d)
        gl = self.e("NllLossBackward0", B * sp.classes * 4)
        self.fs(logp)
        self._grad(len(sp.params) - 2, "MmBackward0")
        self._grad(len(sp.params) - 1, "AddmmBackward0")
        gp = self.e("MmBackward0", B * sp.channels[-1] * d)
        self.fr(gl)
        self.fs(pooled)
        g = self.e("MeanBackward1", B * sp.channels[-1] * sp.spatial[-1] ** 2 * d)
        self.fr(gp)
        for i in reversed(range(sp.n_layers)):
            row = saved[i]
            n = B * sp.channels[i] * sp.spatial[i] ** 2 * d
            if not sp.relu_inplace:
                self.fs(row[3])
            gr = self.e("ReluBackward0", n) if not sp.relu_inplace else None
            self._grad(3 * i + 1, "CudnnBatchNormBackward0")
            self._grad(3 * i + 2, "CudnnBatchNormBackward0")
            gb = self.e("CudnnBatchNormBackward0", n)
            if gr is not None:
                self.fr(gr)
            self.fs(row[1])
            self.fs(row[2])
            self._grad(3 * i, "ConvolutionBackward0")
            gin = self.e("ConvolutionBackward0", B * 3 * sp.image * sp.image * d if i == 0 else n)
            self.fr(gb)
            self.fs(row[0])
            self.fr(g)
            g = gin
        self.fr(g)
        locals_ = [ims, tgt, loss]
        if not kept_logits:
            locals_.append(logits)
        self.prev_locals = locals_


# --------------------------------------------------------------------------------------------
# A world: device, process, program, model, allocator settings, identity
# --------------------------------------------------------------------------------------------


@dataclass
class World:
    name: str
    seed: int
    rng: random.Random
    gpu: Gpu
    total_bytes: int
    device_name: str
    ctx_bytes: int
    device_index: int
    num_devices: int
    pid: int
    pids: list[int]
    prog: Program
    spec: ModelSpec
    alloc_kw: dict[str, Any]
    alloc_seed: int
    start_us: int
    op_us: int
    ident: dict[str, Any]
    others: list[dict[str, Any]] = field(default_factory=list)
    declared_total: int | None = None
    mig_profile: str | None = None
    fraction: float | None = None

    def capacity(self, others: int | None = None) -> int:
        o = sum(p["used_bytes"] for p in self.others) if others is None else others
        cap = self.total_bytes - self.ctx_bytes - o
        if self.fraction is not None:
            cap = min(cap, int(self.fraction * self.total_bytes))
        return cap

    def make_alloc(self, *, history: bool = True, **over: Any) -> CachingAllocator:
        kw: dict[str, Any] = dict(self.alloc_kw)
        kw.update(
            device=self.device_index,
            num_devices=self.num_devices,
            total_bytes=self.total_bytes,
            context_bytes=self.ctx_bytes,
            other_processes=self.others,
            device_name=self.device_name,
            pid=self.pid,
            seed=self.alloc_seed,
            start_time_us=self.start_us,
            fraction_cap_bytes=int(self.fraction * self.total_bytes) if self.fraction is not None else None,
        )
        kw.update(over)
        if not history:
            kw["record_history"] = False
        return CachingAllocator(**kw)


def _pick_gpu(rng: random.Random, allowed: list[str] | None = None) -> Gpu:
    keys = allowed or list(GPUS)
    return GPUS[rng.choice(keys)]


def _new_world(
    name: str,
    seed: int,
    attempt: int,
    *,
    gpu: Gpu | None = None,
    arch: str | None = None,
    fixed_frac: tuple[float, float] = (0.12, 0.45),
    layers: tuple[int, int] | None = None,
    record_frames: bool = True,
    max_entries: int | str | None = "auto",
) -> World:
    rng = random.Random(f"oom-triage-sim:{name}:{seed}:{attempt}")
    gpu = gpu or _pick_gpu(rng)
    ctx = rng.randint(*gpu.ctx_range) * MiB
    ctx -= ctx % (2 * MiB)
    arch = arch or ("transformer" if rng.random() < 0.7 else "cnn")
    style = "all" if rng.random() < 0.35 else "python"
    prog = Program(rng, style=style, arch=arch, record_frames=record_frames)
    total = gpu.total_bytes
    cap = total - ctx
    frac = rng.uniform(*fixed_frac)
    if arch == "transformer":
        mult = 4 if rng.random() < 0.8 else 3
        spec = _transformer_spec(rng, int(frac * cap / (mult + 0.6)), layers=layers or (2, 5))
        # keep at least a few samples' worth of activations on the device
        free = cap - spec.weight_bytes * 5
        for s in (4096, 2048, 1024, 512, 256, 128):
            spec.seq = min(spec.seq, s)
            if spec.per_sample_bytes() * 6 < free:
                break
    else:
        spec = _cnn_spec(rng, int(min(frac * cap / 4.6, 1.5 * GiB)), layers=layers or (4, 9))
    prog.norm_op = spec.norm
    world_size = rng.choice([1, 1, 2, 4, 8, 8, 16, 32])
    local_world = min(world_size, 8)
    rank = rng.randrange(world_size)
    local_rank = rank % local_world
    per_process_visible = rng.random() < 0.4
    device_index = 0 if per_process_visible else local_rank
    num_devices = 1 if per_process_visible else local_world
    pid = rng.randrange(2000, 4_000_000)
    pids = [pid, max(1, pid - rng.randint(1, 40))] + [
        pid + i + rng.randint(1, 9) for i in range(rng.randint(0, 6))
    ]
    if max_entries == "auto":
        me: int | None = rng.choice([None, 100_000, 100_000, 50_000, 200_000, 1_000_000])
    else:
        me = max_entries if isinstance(max_entries, int) else None
    alloc_kw: dict[str, Any] = {
        "max_entries": me,
        "record_frames": record_frames,
        "own_process_label": "self" if rng.random() < 0.15 else "pid",
    }
    if rng.random() < 0.08:
        alloc_kw["max_split_size"] = rng.choice([128, 256, 512]) * MiB
    start_us = 1_767_225_600_000_000 + rng.randrange(0, 200 * 86_400) * 1_000_000 + rng.randrange(1_000_000)
    ident = _identity(rng, world_size, rank, local_rank, device_index, num_devices, per_process_visible, gpu)
    return World(
        name=name,
        seed=seed,
        rng=rng,
        gpu=gpu,
        total_bytes=total,
        device_name=gpu.name,
        ctx_bytes=ctx,
        device_index=device_index,
        num_devices=num_devices,
        pid=pid,
        pids=pids,
        prog=prog,
        spec=spec,
        alloc_kw=alloc_kw,
        alloc_seed=rng.randrange(1 << 30),
        start_us=start_us,
        op_us=rng.randint(150, 2500),
        ident=ident,
    )


def _identity(
    rng: random.Random,
    world_size: int,
    rank: int,
    local_rank: int,
    device_index: int,
    num_devices: int,
    per_process_visible: bool,
    gpu: Gpu,
) -> dict[str, Any]:
    team = rng.choice(
        ["nlp-research", "vision", "speech", "recsys", "applied-ml", "foundation-models", "ads-ranking"]
    )
    namespace = rng.choice([team, f"team-{team}", "ml-training", "research", f"{team}-prod"])
    model = rng.choice(["llama", "gpt", "vit", "resnet", "bert", "whisper", "dino", "t5", "mixtral"])
    job = (
        f"{model}-{rng.choice(['ft', 'pretrain', 'sft', 'dpo', 'train', 'eval'])}-{rng.randrange(16**6):06x}"
    )
    owner_kind = rng.choice(["PyTorchJob", "PyTorchJob", "Job", "JobSet", "RayJob"])
    role = "master" if rank == 0 and owner_kind == "PyTorchJob" else "worker"
    pod_index = rank // 8 if world_size > 8 else (0 if role == "master" else max(0, rank - 1))
    pod = f"{job}-{role}-{pod_index}"
    if owner_kind == "Job":
        pod = f"{job}-{rng.randrange(36**5):05x}"
    node = f"{rng.choice(['gpu-node', 'gpu', 'trn', 'ml-gpu'])}-{rng.randint(1, 96):02d}.{rng.choice(['us-east1', 'eu-west4', 'dc2', 'az1'])}"
    cvd = str(device_index if per_process_visible else ",".join(str(i) for i in range(num_devices)))
    if per_process_visible:
        cvd = str(local_rank)
    torch_version = rng.choice(["2.6.0", "2.7.1", "2.8.0", "2.9.1", "2.11.0", "2.13.0"])
    cuda = rng.choice(["12.4", "12.6", "12.8", "13.0"])
    return {
        "namespace": namespace,
        "pod": pod,
        "node": node,
        "container": rng.choice(["trainer", "pytorch", "main", "worker"]),
        "hostname": pod,
        "job": job,
        "owner_kind": owner_kind,
        "owner_name": job,
        "labels": {"app.kubernetes.io/name": job, "team": team},
        "annotations": {},
        "team": team,
        "rank": rank,
        "local_rank": local_rank,
        "world_size": world_size,
        "restart_count": 0,
        "CUDA_VISIBLE_DEVICES": cvd,
        "torch_version": torch_version,
        "cuda_version": cuda,
        "driver_version": rng.choice(["550.127.05", "560.35.03", "570.124.06", "575.57.08", "580.65.06"]),
        "uuid": "GPU-" + str(uuid.UUID(int=rng.getrandbits(128))),
        "cpu_count": rng.choice([8, 16, 24, 32, 48, 64]),
        "workers": rng.choice([0, 2, 4, 6, 8, 12, 16]),
        "shm_total": rng.choice([64 * GiB, 64 * GiB, 128 * GiB, 32 * GiB, 16 * GiB, 64 * MiB]),
        "mem_limit": rng.choice([64, 128, 200, 256, 512]) * GiB,
    }


# --------------------------------------------------------------------------------------------
# Running the loop
# --------------------------------------------------------------------------------------------


@dataclass
class Run:
    alloc: CachingAllocator
    job: Job
    timeline: list[dict[str, Any]]
    oom: SimulatedOOM | None
    oom_step: int | None
    steps_done: int
    oom_site: str = ""


def _run(
    w: World,
    *,
    steps: int,
    batch: int | Callable[[int], int],
    seq: Callable[[int], int] | None = None,
    history: bool = True,
    leak: Leak | None = None,
    cache: Leak | None = None,
    use_mems: bool = False,
    events: dict[int, Callable[[CachingAllocator], None]] | None = None,
    empty_cache_every: int = 0,
    alloc: CachingAllocator | None = None,
    retain_graph: bool = False,
    **over: Any,
) -> Run:
    a = alloc or w.make_alloc(history=history, **over)
    job = Job(w.spec, w.prog, a, w.op_us)
    job.retain_graph = retain_graph
    job.leak = leak
    job.cache_spec = cache
    job.use_mems = use_mems
    job.empty_cache_every = empty_cache_every
    timeline: list[dict[str, Any]] = []
    if callable(batch):
        bfn = batch
    else:
        fixed_b = int(batch)

        def bfn(_k: int) -> int:
            return fixed_b

    try:
        a.tag = -1
        job.setup()
    except SimulatedOOM as exc:
        return Run(a, job, timeline, exc, -1, 0, job.site)
    for k in range(steps):
        if events and k in events:
            events[k](a)
        B = bfn(k)
        try:
            job.step(k, B, seq(k) if seq else None)
        except SimulatedOOM as exc:
            return Run(a, job, timeline, exc, k, k, job.site)
        a.advance(w.op_us * 40)
        timeline.append(
            {
                "step": k,
                "allocated_bytes": a.allocated_bytes,
                "reserved_bytes": a.reserved,
                "peak_allocated_bytes": a.stat("allocated_bytes.all.peak"),
                "peak_reserved_bytes": a.stat("reserved_bytes.all.peak"),
                "time_us": a.now_us,
                "batch_size": B,
            }
        )
        a.reset_peak_stats()
    return Run(a, job, timeline, None, None, steps, job.site)


def _fits(w: World, B: int, *, steps: int = 2, **kw: Any) -> bool:
    return _run(w, steps=steps, batch=B, history=False, **kw).oom is None


def _max_batch(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """Largest b in [lo, hi) with fits(b), given fits(lo) and not fits(hi) (binary search)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _first_failing(fits: Callable[[int], bool], start: int) -> int:
    """Smallest power-of-two multiple of ``start`` that does not fit."""
    b = max(1, start)
    for _ in range(40):
        if not fits(b):
            return b
        b *= 2
    raise _Retry("never fails")


def _batch_estimate(w: World, frac: float, seq: int | None = None) -> int:
    """A batch size whose activations take about ``frac`` of what is left after the fixed memory."""
    sp = w.spec
    fixed = sp.weight_bytes * (5 if sp.optimizer in ("adam", "adamw") else 4)
    left = w.capacity() - fixed
    return max(1, int(frac * left / max(1, sp.per_sample_bytes(seq))))


# --------------------------------------------------------------------------------------------
# Bundles and results
# --------------------------------------------------------------------------------------------


def _iso(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _json_snapshot(snap: dict[str, Any] | None) -> dict[str, Any] | None:
    if snap is None:
        return None
    segs = []
    for s in snap["segments"]:
        s2 = dict(s)
        if isinstance(s2.get("segment_pool_id"), tuple):
            s2["segment_pool_id"] = list(s2["segment_pool_id"])
        segs.append(s2)
    out = dict(snap)
    out["segments"] = segs
    return out


def _traceback(frames: list[Frame], exc_line: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for fr in reversed(frames):
        fn = str(fr.get("filename", ""))
        if not fn.startswith("/") or fn.endswith((".c", ".h")):
            continue
        lines.append(f'  File "{fn}", line {fr["line"]}, in {fr["name"]}')
    lines.append(exc_line)
    return "\n".join(lines)


def _incident_id(name: str, seed: int, params: dict[str, Any]) -> str:
    key = json.dumps({"name": name, "seed": seed, "params": params}, sort_keys=True, default=str)
    return str(uuid.uuid5(_NS, key))


def _truth(
    verdict: str,
    family: str,
    *,
    leak_site: dict[str, Any] | None = None,
    max_batch_size: int | None = None,
    hard_negative: bool = False,
    notes: str = "",
) -> dict[str, Any]:
    owner = {
        "tensor_leak": "algorithm",
        "workload_too_large": "algorithm",
        "fragmentation": "algorithm",
        "other_process": "platform",
        "gpu_quota": "platform",
        "shm_exhausted": "platform",
        "host_memory_limit": "platform",
    }.get(verdict)
    return {
        "verdict": verdict,
        "owner": owner,
        "leak_site": leak_site,
        "max_batch_size": max_batch_size,
        "family": family,
        "hard_negative": hard_negative,
        "notes": notes,
    }


def _gpu_result(
    w: World,
    run: Run,
    truth: dict[str, Any],
    params: dict[str, Any],
    *,
    batch_size: int,
    crash_message: str | None = None,
    probe: Callable[[int], bool] | None = None,
) -> ScenarioResult:
    a = run.alloc
    legacy = bool(params.get("legacy", False))
    snap = a.snapshot(legacy=legacy)
    exc = run.oom
    ident = w.ident
    if exc is not None:
        kind = "cuda_oom"
        message: str | None = exc.message
        is_assert = exc.observer is None
        etype = "RuntimeError" if is_assert else "torch.OutOfMemoryError"
        py = w.prog.backward_python() if run.oom_site == "engine" else w.prog.python_frames(run.oom_site)
        tb = _traceback(py, f"{etype}: {exc.message}")
        occurred = a.now_us
    else:
        kind = "crash"
        message = crash_message
        etype = (crash_message or "RuntimeError").split(":", 1)[0]
        tb = _traceback(w.prog.backward_python(), crash_message or "")
        occurred = a.now_us
    procs = [{"pid": p["pid"], "used_bytes": p["used_bytes"], "name": p["name"]} for p in a.nvml_processes()]
    # an OOM while the model is moved to the device happens before the first step
    step: int | None = run.oom_step if run.oom_step is not None else run.steps_done
    if step is not None and step < 0:
        step = None
    bundle: dict[str, Any] = {
        "schema": SCHEMA,
        "incident_id": _incident_id(w.name, w.seed, params),
        "occurred_at": _iso(occurred),
        "kind": kind,
        "error": {"type": etype, "message": message, "traceback": tb},
        "workload": {
            **{
                k: ident[k]
                for k in ("namespace", "pod", "node", "container", "hostname", "job", "owner_kind")
            },
            **{k: ident[k] for k in ("owner_name", "labels", "annotations", "team", "rank", "local_rank")},
            "world_size": ident["world_size"],
            "restart_count": ident["restart_count"],
            "step": step,
            "batch_size": batch_size,
            "pid": w.pid,
            "pids": list(w.pids),
        },
        "device": {
            "index": w.device_index,
            "name": w.device_name,
            "uuid": ident["uuid"],
            "total_bytes": w.total_bytes,
            "free_bytes": a.device_free_bytes(),
            "declared_total_bytes": w.declared_total,
            "mig_mode": w.mig_profile is not None,
            "mig_profile": w.mig_profile,
            "processes": procs,
        },
        "allocator": {
            "memory_stats": a.memory_stats(),
            "settings": a.allocator_settings(),
            "fraction": w.fraction,
            "fraction_cap_bytes": a.fraction_cap_bytes,
            "observer": (
                dict(
                    zip(
                        ("device", "alloc_size", "device_total_or_cap", "device_free"),
                        exc.observer,
                        strict=True,
                    )
                )
                if exc is not None and exc.observer is not None
                else None
            ),
        },
        "timeline": run.timeline,
        "host": _host(w, shm_used=None),
        "environment": _environment(w, a),
        "snapshot": _json_snapshot(snap) if not legacy else snap,
        "collector": {
            "version": "0.1.0",
            "history_max_entries": a.max_entries,
            "capture_ms": w.rng.randint(8, 900),
        },
    }
    return ScenarioResult(
        name=w.name,
        seed=w.seed,
        snapshot=snap,
        message=message,
        bundle=bundle,
        truth=truth,
        probe=probe,
        allocator=a,
    )


def _host(
    w: World, *, shm_used: int | None, cgroup: dict[str, Any] | None = None, rss: int | None = None
) -> dict[str, Any]:
    ident = w.ident
    shm_total = ident["shm_total"]
    lim = ident["mem_limit"]
    usage = cgroup["memory_usage_bytes"] if cgroup else int(lim * w.rng.uniform(0.15, 0.6))
    return {
        "shm_total_bytes": shm_total,
        "shm_used_bytes": shm_used
        if shm_used is not None
        else int(min(shm_total, 48 * MiB) * w.rng.uniform(0.0, 0.3)),
        "cgroup": cgroup
        or {"version": 2, "memory_limit_bytes": lim, "memory_usage_bytes": usage, "oom_kill_count": 0},
        "rss_bytes": rss if rss is not None else int(usage * w.rng.uniform(0.5, 0.9)),
        "cpu_count": ident["cpu_count"],
        "cpu_affinity": list(range(ident["cpu_count"])),
        "dataloader_workers": ident["workers"],
    }


def _environment(w: World, a: CachingAllocator | None) -> dict[str, Any]:
    ident = w.ident
    return {
        "CUDA_VISIBLE_DEVICES": ident["CUDA_VISIBLE_DEVICES"],
        "PYTORCH_CUDA_ALLOC_CONF": (a.allocator_settings()["PYTORCH_CUDA_ALLOC_CONF"] if a else "") or None,
        "torch_version": ident["torch_version"],
        "cuda_version": ident["cuda_version"],
        "driver_version": ident["driver_version"],
        "python_version": w.prog.python_version,
        "RANK": str(ident["rank"]),
        "LOCAL_RANK": str(ident["local_rank"]),
        "WORLD_SIZE": str(ident["world_size"]),
    }


def _crash_text(rng: random.Random, w: World) -> str:
    rank = w.ident["rank"]
    return rng.choice(
        [
            f"torch.distributed.DistBackendError: [Rank {rank}] Watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum={rng.randint(1000, 90000)}, OpType=ALLREDUCE, NumelIn={rng.randint(10**6, 10**8)}, "
            f"NumelOut={rng.randint(10**6, 10**8)}, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.",
            "RuntimeError: CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
            "asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
            f"ValueError: Expected input batch_size ({rng.randint(8, 64)}) to match target batch_size ({rng.randint(1, 7)}).",
            "RuntimeError: DataLoader worker (pid(s) 4121) exited unexpectedly",
            "KeyError: 'attention_mask'",
            "RuntimeError: Function 'LogSoftmaxBackward0' returned nan values in its 0th output.",
        ]
    )


# --------------------------------------------------------------------------------------------
# Families
# --------------------------------------------------------------------------------------------

Family = Callable[..., ScenarioResult]
_REGISTRY: dict[str, Family] = {}


def scenario(name: str) -> Callable[[Family], Family]:
    def deco(fn: Family) -> Family:
        _REGISTRY[name] = fn
        return fn

    return deco


def _attempts(
    name: str, seed: int, params: dict[str, Any], body: Callable[[int], ScenarioResult]
) -> ScenarioResult:
    last: Exception | None = None
    for attempt in range(int(params.get("attempts", 12))):
        try:
            return body(attempt)
        except _Retry as exc:
            last = exc
    raise RuntimeError(f"scenario {name} seed {seed}: no attempt produced the family ({last})")


def _choice(name: str, seed: int, options: list[Any]) -> Any:
    """A variant that depends on the seed only (not on the attempt), cycling through the options."""
    off = random.Random(f"variant:{name}").randrange(len(options))
    return options[(seed + off) % len(options)]


def _leak_truth_site(w: World, run: Run) -> dict[str, Any] | None:
    site = run.job.leak_site
    if site is None or not w.prog.record_frames:
        return None
    return w.prog.innermost_user(w.prog.python_frames(site))


@scenario("healthy")
def healthy(seed: int, **params: Any) -> ScenarioResult:
    """Trains N steps without an OOM; the job then crashes for a reason that is not memory."""

    def body(attempt: int) -> ScenarioResult:
        w = _new_world("healthy", seed, attempt)
        steps = int(params.get("steps", w.rng.randint(4, 24)))
        B = max(1, int(_batch_estimate(w, w.rng.uniform(0.2, 0.6))))
        run = _run(w, steps=steps, batch=B)
        if run.oom is not None:
            raise _Retry("healthy run hit an OOM")
        return _gpu_result(
            w,
            run,
            _truth("inconclusive", "healthy", notes="no memory problem; the job crashed for another reason"),
            params,
            batch_size=B,
            crash_message=_crash_text(w.rng, w),
        )

    return _attempts("healthy", seed, params, body)


_LEAK_KINDS = ["logits", "hidden", "pooled", "last_logits", "metrics", "features"]


def _leak_run(
    name: str,
    seed: int,
    attempt: int,
    params: dict[str, Any],
    *,
    record_frames: bool = True,
    kinds: list[str] | None = None,
    target: tuple[int, int] = (20, 220),
    final_big: bool = False,
) -> tuple[World, Run, int, Leak]:
    small_ring = params.get("small_ring")
    w = _new_world(name, seed, attempt, record_frames=record_frames, max_entries=None)
    rng = w.rng
    sp = w.spec
    kind = str(params.get("leak_kind") or rng.choice(kinds or [*_LEAK_KINDS, "metrics"]))
    if kind == "last_logits" and sp.arch != "transformer":
        kind = "pooled"
    T = int(params.get("target_steps", rng.randint(*target)))
    small = kind == "metrics"
    leak = Leak(kind)
    others = sum(p["used_bytes"] for p in w.others)

    def steady(b: int) -> tuple[int, int]:
        """(reserved after a cache flush and one more step, peak allocated) without the leak."""

        def flush(a: CachingAllocator) -> None:
            a.empty_cache()

        r = _run(w, steps=4, batch=b, history=False, events={3: flush}, total_bytes=1 << 50)
        return r.alloc.reserved, max(int(t["peak_allocated_bytes"]) for t in r.timeline)

    def fit_line(f: Callable[[int], int], b0: int) -> tuple[float, float]:
        """f(b) ~ c + slope * b from two batch sizes."""
        b1 = max(b0 + 1, int(b0 * 1.6))
        y0, y1 = f(b0), f(b1)
        slope = max(1.0, (y1 - y0) / (b1 - b0))
        return y0 - slope * b0, slope

    cap = w.capacity()
    empty_every = 0
    if small:
        # A small leak (a few KiB to 1 MiB a step: metric tensors, per-token losses or predictions
        # kept in a list) reaches the limit in tens-hundreds of steps only in a job that already
        # runs at the limit (a failing cudaMalloc releases the cache and the retry succeeds, step
        # after step): the batch is picked so that the job's peak plus the process's own
        # non-PyTorch memory (context, NCCL, cuBLAS workspaces) leaves about T steps of leak.
        empty_every = 1 if rng.random() < 0.3 else 0
        leak.count = rng.randint(1, 4)
        leak.per_sample = rng.choice([4096, 65536, 262144, 524288, 786432])
        per_step = leak.count * max(512, leak.per_sample)
        T = min(T, 160)
        want = per_step * T
        ctx_target = rng.randint(w.gpu.ctx_range[0], 1536) * MiB
        target_need = w.total_bytes - others - ctx_target - want

        def need(b: int) -> int:
            r = _run(w, steps=3, batch=b, history=False, empty_cache_every=empty_every, total_bytes=1 << 50)
            return max(int(t["peak_allocated_bytes"]) for t in r.timeline)

        b0 = max(1, _batch_estimate(w, 0.3))
        c0, slope = fit_line(need, b0)
        B = max(1, int((target_need - c0) / slope))
        ctx = 0
        for _outer in range(3):
            cap_new = need(B) + want
            for _ in range(5):
                w.ctx_bytes = w.total_bytes - others - cap_new
                r = _run(
                    w, steps=3 * T + 10, batch=B, history=False, leak=leak, empty_cache_every=empty_every
                )
                if r.oom is None:
                    cap_new -= want // 2
                elif r.oom_step is not None and r.oom_step < max(3, T // 3):
                    cap_new += max(0, r.oom.alloc_size - r.oom.device_free) + want // 2
                else:
                    break
            ctx = w.total_bytes - others - cap_new
            if 280 * MiB <= ctx <= 3 * GiB:
                break
            # the job's own overhead (fragmentation under pressure) moved the need: move the batch
            nb = max(1, B + int((ctx - ctx_target) / slope))
            if nb == B:
                break
            B = nb
        if not 280 * MiB <= ctx <= 3 * GiB:
            raise _Retry(f"cannot place a small leak near the limit ({ctx / GiB:.2f} GiB left)")
        w.ctx_bytes = ctx
    elif kind in ("pooled", "features"):
        B = max(1, _batch_estimate(w, rng.uniform(0.25, 0.6)))
        _R, peak = steady(B)
        headroom = cap - peak  # the leak can use everything above the step's peak
        if headroom < 0.1 * cap:
            raise _Retry("the job does not fit even without the leak")
        per_step = max(512, headroom // T)
        leak.per_sample = max(64, per_step // B)
        leak.per_sample -= leak.per_sample % 4
    else:
        # the leaked tensor's size is fixed by the batch: solve headroom(B) / leak(B) ~ T
        e = _leak_event_bytes(sp, kind, 1)
        b0 = max(1, _batch_estimate(w, 0.25))
        c0, slope = fit_line(lambda b: steady(b)[1], b0)
        every = 1
        B = int((cap - c0) / (slope + T * e))
        if B < 1:
            B = 1
            every = max(1, round(T * e / max(1, cap - c0 - slope)))
        _R, peak = steady(B)
        per_event = _leak_event_bytes(sp, kind, B)
        headroom = cap - peak
        if headroom <= 0:
            raise _Retry("the job does not fit even without the leak")
        if per_event * 3 > headroom:
            raise _Retry("one leaked tensor is a third of the headroom")
        leak.every = max(every, min(50, round(T * per_event / max(1, headroom))))
    me: int | None = None
    if small_ring or (small_ring is None and rng.random() < 0.3):
        me = rng.choice([1000, 2000, 5000, 10_000])
    elif rng.random() < 0.5:
        me = rng.choice([100_000, 200_000, 500_000])
    w.alloc_kw["max_entries"] = me
    max_steps = int(params.get("max_steps", max(40, T * 3 + 40)))
    run = _run(w, steps=max_steps, batch=B, leak=leak, empty_cache_every=empty_every)
    if run.oom is None or run.oom_step is None or run.oom_step < 3:
        raise _Retry(
            f"the leak did not end in an OOM after a few steps ({kind}, {run.oom_step}, {max_steps})"
        )
    # honest label: without the leak the same job runs the same steps
    if not params.get("skip_verify") and not _fits(
        w, B, steps=min(run.oom_step + 2, 12), empty_cache_every=empty_every
    ):
        raise _Retry("the job OOMs without the leak too")
    if final_big:
        biggest = max((e["size"] for e in _trace_allocs(run.alloc)), default=0)
        if run.oom.requested_size < 0.5 * biggest or run.oom.alloc_size < 256 * MiB:
            raise _Retry("the final request is not the big one")
    return w, run, B, leak


def _leak_event_bytes(sp: ModelSpec, kind: str, B: int) -> int:
    d = sp.act_bytes
    if sp.arch == "transformer":
        bsh = B * sp.seq * sp.hidden * d
        return {"logits": B * sp.seq * sp.vocab * d, "hidden": bsh, "last_logits": B * sp.vocab * 4}.get(
            kind, bsh
        )
    hid = B * sp.channels[-1] * sp.spatial[-1] ** 2 * d
    return {"logits": B * sp.classes * d, "hidden": hid}.get(kind, hid)


def _trace_allocs(a: CachingAllocator) -> list[dict[str, Any]]:
    return [e for e in a.trace if e["action"] == "alloc"]


@scenario("tensor_leak")
def tensor_leak(seed: int, **params: Any) -> ScenarioResult:
    """A loop keeps a reference per step (logits, hidden states, features, metric tensors, grad norms)."""

    def body(attempt: int) -> ScenarioResult:
        w, run, B, leak = _leak_run("tensor_leak", seed, attempt, params)
        site = _leak_truth_site(w, run)
        return _gpu_result(
            w,
            run,
            _truth(
                "tensor_leak",
                "tensor_leak",
                leak_site=site,
                notes=f"leak kind {leak.kind} every {leak.every} step(s); OOM at step {run.oom_step}",
            ),
            params,
            batch_size=B,
        )

    return _attempts("tensor_leak", seed, params, body)


@scenario("leak_like_big_batch")
def leak_like_big_batch(seed: int, **params: Any) -> ScenarioResult:
    """Hard negative: a real leak whose final OOM is a big request, like a batch that is too large."""

    def body(attempt: int) -> ScenarioResult:
        p = dict(params)
        p.setdefault("target_steps", random.Random(f"llbb:{seed}:{attempt}").randint(4, 14))
        p.setdefault("small_ring", False)
        w, run, B, leak = _leak_run(
            "leak_like_big_batch", seed, attempt, p, kinds=["hidden", "features", "pooled"], final_big=True
        )
        return _gpu_result(
            w,
            run,
            _truth(
                "tensor_leak",
                "leak_like_big_batch",
                leak_site=_leak_truth_site(w, run),
                hard_negative=True,
                notes=f"leak kind {leak.kind}; the failing request ({format_size(run.oom.alloc_size if run.oom else 0)}) "
                "is the step's largest tensor",
            ),
            params,
            batch_size=B,
        )

    return _attempts("leak_like_big_batch", seed, params, body)


@scenario("leak_no_frames")
def leak_no_frames(seed: int, **params: Any) -> ScenarioResult:
    """Hard negative: a leak recorded without stacks (frames [] everywhere): no leak site to name."""

    def body(attempt: int) -> ScenarioResult:
        w, run, B, leak = _leak_run("leak_no_frames", seed, attempt, params, record_frames=False)
        return _gpu_result(
            w,
            run,
            _truth(
                "tensor_leak",
                "leak_no_frames",
                leak_site=None,
                hard_negative=True,
                notes=f"leak kind {leak.kind}; history recorded without stacks",
            ),
            params,
            batch_size=B,
        )

    return _attempts("leak_no_frames", seed, params, body)


@scenario("workload_too_large")
def workload_too_large(seed: int, **params: Any) -> ScenarioResult:
    """Fixed memory plus per-sample activations: the batch cannot fit; OOM in the first step(s)."""

    def body(attempt: int) -> ScenarioResult:
        w = _new_world("workload_too_large", seed, attempt, fixed_frac=(0.1, 0.55))
        rng = w.rng

        def fits(b: int) -> bool:
            return _fits(w, b, steps=2)

        if not fits(1):
            raise _Retry("batch size 1 does not fit")
        guess = max(1, _batch_estimate(w, 0.9))
        if fits(guess):
            lo, hi = guess, _first_failing(fits, guess * 2)
            if hi > guess * 2:
                lo = hi // 2
        else:
            lo, hi = 1, guess
        best = _max_batch(fits, lo, hi)
        B = int(params.get("batch_size", max(best + 1, int(best * rng.uniform(1.15, 3.5)))))
        if best >= B:
            raise _Retry("requested batch size fits")
        run = _run(w, steps=3, batch=B)
        if run.oom is None:
            raise _Retry("no OOM")
        return _gpu_result(
            w,
            run,
            _truth(
                "workload_too_large",
                "workload_too_large",
                max_batch_size=best,
                notes=f"batch {B}; largest batch that runs two full steps: {best}",
            ),
            params,
            batch_size=B,
            probe=fits,
        )

    return _attempts("workload_too_large", seed, params, body)


@scenario("eval_leak")
def eval_leak(seed: int, **params: Any) -> ScenarioResult:
    """A validation loop run with gradients on (no ``torch.no_grad()``) after some training steps.
    ``kept``: it keeps every batch's output, and with it the batch's whole autograd graph (every saved
    activation), until the device is full: a leak at the line that calls the model, with no optimizer
    step in between. ``big_batch`` (hard negative): nothing is kept, but the validation batch is several
    times the training batch and its one forward pass does not fit: nothing leaks."""

    def body(attempt: int) -> ScenarioResult:
        w = _new_world("eval_leak", seed, attempt)
        rng = w.rng
        variant = str(
            params.get("variant", _choice("eval_leak", seed, ["kept", "kept", "kept", "big_batch"]))
        )
        B = max(1, _batch_estimate(w, rng.uniform(0.2, 0.55)))
        steps = int(params.get("steps", rng.randint(3, 24)))
        run = _run(w, steps=steps, batch=B)
        if run.oom is not None:
            raise _Retry("the training steps do not fit")
        job, a = run.job, run.alloc
        eval_batch = B if variant == "kept" else B * rng.randint(3, 8)
        kept: list[list[int]] = []
        oom: SimulatedOOM | None = None
        passes = 0
        while oom is None and passes < 2000:
            passes += 1
            try:
                job.eval_pass(eval_batch, kept, keep=variant == "kept")
            except SimulatedOOM as exc:
                oom = exc
            a.advance(w.op_us * 10)
        if oom is None:
            raise _Retry("the validation loop never ran out of memory")
        if variant == "kept" and passes < 5:
            raise _Retry("too few validation batches before the OOM")
        if variant != "kept" and passes > 1:
            raise _Retry("the first validation batch fitted")
        done = Run(a, job, run.timeline, oom, steps, steps, job.site)
        if variant == "kept":
            site = (
                {"filename": w.prog.loop_file, "line": w.prog.eval_lines["call"], "name": w.prog.eval_fn}
                if w.prog.record_frames
                else None
            )
            truth = _truth(
                "tensor_leak",
                "eval_leak",
                leak_site=site,
                notes=f"{passes - 1} validation outputs kept with their graphs after {steps} training steps",
            )
        else:
            truth = _truth(
                "workload_too_large",
                "eval_leak",
                hard_negative=True,
                notes=f"validation batch {eval_batch} (training batch {B}) run with gradients on; nothing kept",
            )
        return _gpu_result(w, done, truth, params, batch_size=B)

    return _attempts("eval_leak", seed, params, body)


@scenario("carried_graph")
def carried_graph(seed: int, **params: Any) -> ScenarioResult:
    """A state carried from one step into the next without ``.detach()`` (an RNN's hidden state, a memory)
    with ``backward(retain_graph=True)`` to silence the error that says the graph was freed: every step's
    saved activations stay referenced, and live memory grows by a forward pass a step until the device is
    full. A leak at the line that calls the model (where the state is carried in); without it the job
    runs."""

    def body(attempt: int) -> ScenarioResult:
        w = _new_world("carried_graph", seed, attempt)
        rng = w.rng
        B = max(1, _batch_estimate(w, rng.uniform(0.03, 0.12)))
        if not _fits(w, B, steps=3):
            raise _Retry("the batch does not fit without the carried graph")
        run = _run(w, steps=int(params.get("max_steps", 300)), batch=B, retain_graph=True)
        if run.oom is None or run.oom_step is None or run.oom_step < 4:
            raise _Retry(f"the carried graphs did not fill the device after a few steps ({run.oom_step})")
        call = w.prog.loop("forward")[0]
        site = dict(call) if w.prog.record_frames else None
        truth = _truth(
            "tensor_leak",
            "carried_graph",
            leak_site=site,
            notes=f"every step's graph kept by a carried state; OOM at step {run.oom_step}, batch {B}",
        )
        return _gpu_result(w, run, truth, params, batch_size=B)

    return _attempts("carried_graph", seed, params, body)


def _frag_state(run: Run, cap: int) -> tuple[bool, int, int]:
    """(fits if compact, reserved - allocated, request) at the OOM."""
    a = run.alloc
    exc = run.oom
    assert exc is not None
    free_res = a.reserved - a.allocated_bytes
    return a.allocated_bytes + exc.rounded_size <= cap, free_res, exc.rounded_size


@scenario("fragmentation")
def fragmentation(seed: int, **params: Any) -> ScenarioResult:
    """Variable sequence lengths and long-lived per-step memories interleave: free memory in the
    cache is large but no block is big enough. ``expandable=True`` runs the same kind of job with
    expandable segments, which usually removes the fragmentation: that variant is labelled with what
    really happened (most often a step that is simply too large)."""

    def body(attempt: int) -> ScenarioResult:
        w = _new_world(
            "fragmentation", seed, attempt, arch="transformer", fixed_frac=(0.08, 0.3), max_entries=None
        )
        rng = w.rng
        expandable = bool(params.get("expandable", _choice("fragmentation", seed, [False, False, True])))
        sp = w.spec
        w.alloc_kw["max_entries"] = rng.choice([None, 200_000, 500_000])
        smax = sp.seq
        smin = max(64, smax // rng.choice([4, 8, 16]))
        srng = random.Random(f"seq:{w.seed}:{attempt}")
        seqs = [smin + 8 * srng.randrange((smax - smin) // 8 + 1) for _ in range(400)]
        if expandable:
            w.alloc_kw["expandable_segments"] = True
        # size the batch so the longest step nearly fills the device
        frac = rng.uniform(0.8, 0.97) if not expandable else rng.uniform(0.95, 1.15)
        B = max(1, _batch_estimate(w, frac, smax))
        steps = int(params.get("steps", 80))
        run = _run(w, steps=steps, batch=B, seq=lambda k: seqs[k], use_mems=True)
        if run.oom is None or run.oom_step is None or run.oom_step < 1:
            raise _Retry("no OOM after the first step")
        cap = w.capacity()
        compact_fits, free_res, req = _frag_state(run, cap)
        largest = run.alloc.largest_free_block()
        s_fail = seqs[run.oom_step]
        if compact_fits and free_res >= req and largest < req:
            truth = _truth(
                "fragmentation",
                "fragmentation",
                hard_negative=expandable,
                notes=(
                    f"{format_size(free_res)} reserved but unallocated, largest free block {format_size(largest)}, "
                    f"request {format_size(req)}; sequence lengths {smin}..{smax}"
                    + ("; expandable_segments on" if expandable else "")
                ),
            )
            return _gpu_result(w, run, truth, params, batch_size=B)
        if not expandable:
            raise _Retry("not a fragmentation OOM")

        # expandable segments on and still an OOM: what it really is, decided by simulation
        def fits(b: int) -> bool:
            return _fits(w, b, steps=2, seq=lambda _k: s_fail, use_mems=True)

        if fits(B):
            raise _Retry("ambiguous: the failing step fits on its own")
        if not fits(1):
            raise _Retry("batch 1 does not fit")
        best = _max_batch(fits, 1, B)
        truth = _truth(
            "workload_too_large",
            "fragmentation",
            max_batch_size=best,
            hard_negative=True,
            notes=(
                f"expandable_segments on; step {run.oom_step} has sequence length {s_fail} and needs more than the "
                "device holds: the message's expandable_segments hint does not apply"
            ),
        )
        return _gpu_result(w, run, truth, params, batch_size=B, probe=fits)

    return _attempts("fragmentation", seed, params, body)


def _neighbours(rng: random.Random, total_need: int, *, zombie: bool, n: int) -> list[dict[str, Any]]:
    parts = [rng.uniform(0.5, 1.5) for _ in range(n)]
    s = sum(parts)
    out = []
    for p in parts:
        used = int(total_need * p / s)
        used -= used % (2 * MiB)
        out.append(
            {
                "pid": rng.randrange(2000, 4_000_000),
                "used_bytes": used,
                "name": "python"
                if zombie
                else rng.choice(["python3", "python", "jupyter-kernel", "tritonserver", "vllm"]),
            }
        )
    return out


@scenario("other_process")
def other_process(seed: int, **params: Any) -> ScenarioResult:
    """Another process holds a big share of the device; the job alone would fit."""

    def body(attempt: int) -> ScenarioResult:
        w = _new_world("other_process", seed, attempt, fixed_frac=(0.1, 0.35))
        rng = w.rng
        variant = str(
            params.get(
                "variant", _choice("other_process", seed, ["from_start", "mid_run", "zombie", "several"])
            )
        )
        B = max(1, _batch_estimate(w, rng.uniform(0.3, 0.7)))
        steps = rng.randint(6, 16)
        empty_every = 0
        if variant == "mid_run":
            empty_every = rng.choice([1, 2, 5])
        alone = _run(w, steps=steps, batch=B, history=False, empty_cache_every=empty_every)
        if alone.oom is not None:
            raise _Retry("does not fit alone")
        peak_reserved = alone.alloc.stat("reserved_bytes.all.peak")
        cap = w.capacity()
        # the neighbour leaves the job between 30% and 90% of what it needs
        need = int(cap - peak_reserved * rng.uniform(0.3, 0.9))
        if need < 0.15 * w.total_bytes:
            need = int(0.15 * w.total_bytes + (cap - peak_reserved))
        if need > cap:
            raise _Retry("neighbour would take the whole device")
        procs = _neighbours(
            rng, need, zombie=variant == "zombie", n=rng.randint(2, 3) if variant == "several" else 1
        )
        events: dict[int, Callable[[CachingAllocator], None]] | None = None
        at = 0
        if variant == "mid_run":
            at = rng.randint(2, steps - 2)

            def arrive(a: CachingAllocator, _p: list[dict[str, Any]] = procs) -> None:
                a.other_processes.extend(_p)

            events = {at: arrive}
        else:
            w.others = procs
        if variant == "zombie":
            w.ident["restart_count"] = rng.randint(1, 4)
        run = _run(w, steps=steps, batch=B, events=events, empty_cache_every=empty_every)
        if run.oom is None:
            raise _Retry("no OOM with the neighbour")
        w.others = list(run.alloc.other_processes)
        notes = {
            "from_start": "a neighbour process holds memory from the start",
            "mid_run": f"a neighbour started at step {at} (the job calls empty_cache)",
            "zombie": "a leftover process of an earlier attempt still holds memory",
            "several": "several neighbour processes",
        }[variant]
        return _gpu_result(
            w,
            run,
            _truth("other_process", "other_process", notes=f"{notes}; {format_size(need)} held by others"),
            params,
            batch_size=B,
        )

    return _attempts("other_process", seed, params, body)


@scenario("gpu_quota")
def gpu_quota(seed: int, **params: Any) -> ScenarioResult:
    """The process gets less than declared: a fraction cap, a MIG slice, or a smaller GPU."""

    def body(attempt: int) -> ScenarioResult:
        rng0 = random.Random(f"quota:{seed}:{attempt}")
        variant = str(
            params.get("variant", _choice("gpu_quota", seed, ["fraction", "mig", "smaller_device"]))
        )
        if variant == "mig":
            full = GPUS[rng0.choice(list(MIG_PROFILES))]
        elif variant == "smaller_device":
            full = GPUS[rng0.choice(["A100-80GB", "H100-80GB", "A100-80GB"])]
        else:
            full = _pick_gpu(rng0)
        w = _new_world("gpu_quota", seed, attempt, gpu=full, fixed_frac=(0.1, 0.3))
        rng = w.rng
        B = max(1, _batch_estimate(w, rng.uniform(0.3, 0.75)))
        steps = rng.randint(3, 10)
        full_run = _run(w, steps=steps, batch=B, history=False)
        if full_run.oom is not None:
            raise _Retry("does not fit the declared device")
        need = full_run.alloc.stat("reserved_bytes.all.peak") + w.ctx_bytes
        w.declared_total = full.total_bytes
        if variant == "fraction":
            choices = [f for f in (0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75) if f * full.total_bytes < need * 0.95]
            if not choices:
                raise _Retry("no fraction below the need")
            w.fraction = rng.choice(choices)
            w.declared_total = None if rng.random() < 0.5 else full.total_bytes
            notes = f"set_per_process_memory_fraction({w.fraction})"
        elif variant == "mig":
            slices = [s for s in MIG_PROFILES[full.key] if s[1] < need * 0.95]
            if not slices:
                raise _Retry("no MIG slice below the need")
            prof, tot = rng.choice(slices)
            w.mig_profile = prof
            w.total_bytes = tot
            w.device_name = f"{full.name} MIG {prof}"
            w.ctx_bytes = rng.randint(180, 320) * MiB
            w.alloc_kw["nvml_lists_processes"] = False
            # one MIG device per container: index 0 of one visible device
            w.device_index = 0
            w.num_devices = 1
            w.ident["CUDA_VISIBLE_DEVICES"] = "MIG-" + str(uuid.UUID(int=rng.getrandbits(128)))
            w.alloc_kw["nvml_fails"] = rng.random() < 0.2
            notes = f"MIG slice {prof} where a full {full.key} was declared"
        else:
            small = [
                g for g in GPUS.values() if g.total_bytes < need * 0.95 and g.total_bytes < full.total_bytes
            ]
            if not small:
                raise _Retry("no smaller device")
            g = rng.choice(small)
            w.gpu = g
            w.total_bytes = g.total_bytes
            w.device_name = g.name
            notes = f"declared {full.key}, got {g.key}"
        run = _run(w, steps=steps, batch=B)
        if run.oom is None:
            raise _Retry("fits the quota")
        res = _gpu_result(w, run, _truth("gpu_quota", "gpu_quota", notes=notes), params, batch_size=B)
        if variant == "mig":
            res.bundle["device"]["processes"] = []
        return res

    return _attempts("gpu_quota", seed, params, body)


@scenario("bounded_cache")
def bounded_cache(seed: int, **params: Any) -> ScenarioResult:
    """Hard negative: a cache of the last K tensors grows, then plateaus (looks like a leak at first);
    the OOM comes later from a batch-size ramp that does not fit."""

    def body(attempt: int) -> ScenarioResult:
        w = _new_world("bounded_cache", seed, attempt, fixed_frac=(0.1, 0.3), layers=(2, 4))
        rng = w.rng
        K = rng.randint(4, 12)
        B0 = max(1, _batch_estimate(w, rng.uniform(0.2, 0.4)))
        cache = Leak("features", maxlen=K)
        base = _run(w, steps=2, batch=B0, history=False)
        if base.oom is not None:
            raise _Retry("does not fit")
        head = w.capacity() - base.alloc.reserved
        cache.per_sample = max(256, int(head * rng.uniform(0.15, 0.35) / K / B0))
        cache.per_sample -= cache.per_sample % 4
        ramp = K + rng.randint(3, 10)
        B1 = int(params.get("batch_size", 0)) or 0

        def sched(b1: int) -> Callable[[int], int]:
            return lambda k: B0 if k < ramp else b1

        def fits(b: int) -> bool:
            # the cache must turn over completely at the new size: K steps after the ramp, then two more
            return _run(w, steps=ramp + K + 2, batch=sched(b), history=False, cache=cache).oom is None

        if not fits(B0):
            raise _Retry("the cached plateau does not fit")
        hi = _first_failing(fits, B0 * 2)
        best = _max_batch(fits, max(B0, hi // 2), hi)
        if not B1:
            B1 = max(best + 1, int(best * rng.uniform(1.2, 2.5)))
        run = _run(w, steps=ramp + 3, batch=sched(B1), cache=cache)
        if run.oom is None or run.oom_step is None or run.oom_step < ramp:
            raise _Retry("no OOM after the ramp")
        return _gpu_result(
            w,
            run,
            _truth(
                "workload_too_large",
                "bounded_cache",
                max_batch_size=best,
                hard_negative=True,
                notes=f"a cache of the last {K} feature tensors plateaus; batch size ramps {B0} -> {B1} at step {ramp}",
            ),
            params,
            batch_size=B1,
            probe=fits,
        )

    return _attempts("bounded_cache", seed, params, body)


def _failure_points(
    w: World, *, steps: int, B: int, want: Callable[[dict[str, Any]], bool], **kw: Any
) -> list[tuple[int, int, dict[str, Any]]]:
    """Run without a device limit and list the device-allocation attempts ``want`` accepts that can
    be made the first failure, with the capacity range that does it: every earlier attempt fits,
    this one does not, and releasing the cached unsplit segments does not make room for the retry."""
    a = w.make_alloc(history=False, total_bytes=1 << 50)
    a.device_alloc_log = []
    _run(w, steps=steps, batch=B, alloc=a, **kw)
    prev_need = 0
    out: list[tuple[int, int, dict[str, Any]]] = []
    for ev in a.device_alloc_log:
        top = ev["reserved"] + ev["alloc_size"]
        lo = max(prev_need, ev["reserved"])
        hi = top - ev["unsplit_free"] - 1
        if lo <= hi and want(ev):
            out.append((lo, hi, ev))
        prev_need = max(prev_need, top)
    return out


@scenario("small_request_big_hole")
def small_request_big_hole(seed: int, **params: Any) -> ScenarioResult:
    """Hard negative: a small request ("Tried to allocate 2.00 MiB") fails while the snapshot shows a
    large free block. The block cannot serve it: it is cached for a side stream (a data prefetcher
    keeps one batch in flight there), and a small request needs a small-pool segment anyway. The
    label is what it really is, decided by re-running the job: ``neighbour`` -> other_process (the
    job runs without the neighbour); ``other_stream`` -> fragmentation when the same job with the
    prefetcher on the default stream runs, else workload_too_large with the largest batch that runs."""

    def body(attempt: int) -> ScenarioResult:
        w = _new_world(
            "small_request_big_hole",
            seed,
            attempt,
            arch="transformer",
            fixed_frac=(0.1, 0.4),
            max_entries=None,
        )
        rng = w.rng
        variant = str(params.get("variant", _choice("srbh", seed, ["other_stream", "neighbour"])))
        w.alloc_kw.pop("max_split_size", None)
        w.alloc_kw["max_entries"] = rng.choice([None, 100_000, 500_000])
        sp = w.spec
        # keep the per-token small tensors (norm statistics) in the small pool
        sp.seq = min(sp.seq, 1024)
        side = rng.choice(
            [94_312_772_118_016, 94_850_224_521_216, 140_231_982_735_360]
        ) + 512 * rng.randrange(4096)
        steps = rng.randint(2, 6)
        total = w.total_bytes
        window = (int(total * 0.12), total - w.ctx_bytes - int(total * 0.15))
        if variant == "neighbour":
            fracs: tuple[float, ...] = (0.3, 0.45, 0.6, 0.8)
        else:
            fracs = (0.5, 0.7, 0.85, 1.0, 1.15, 1.3, 1.5, 1.8, 2.2, 2.6)
        prefetch = _PrefetchHook(side, w)

        def want(ev: dict[str, Any]) -> bool:
            return bool(
                ev["small"]
                and ev["stream"] == 0
                and ev["tag"] is not None
                and ev["tag"] >= 0
                and ev["largest_free_other_stream"] >= 32 * MiB
            )

        # (batch, capacity, device) choices where the small request is the first failure
        choices: list[tuple[int, int, Gpu]] = []
        for f in fracs:
            B = max(1, _batch_estimate(w, f))
            if B * sp.seq > 96 * 1024:
                continue
            for lo, hi, _ev in _failure_points(w, steps=steps, B=B, want=want, events=prefetch.events(steps)):
                if variant == "neighbour":
                    lo2, hi2 = max(lo, window[0]), min(hi, window[1])
                    if lo2 <= hi2:
                        choices.append((B, rng.randint(lo2, hi2), w.gpu))
                    continue
                for g in GPUS.values():
                    # the process's own non-PyTorch memory stays plausible on that device
                    lo2, hi2 = max(lo, g.total_bytes - 3 * GiB), min(hi, g.total_bytes - g.ctx_range[0] * MiB)
                    if lo2 <= hi2:
                        choices.append((B, rng.randint(lo2, hi2), g))
            if len(choices) >= 3:
                break
        if not choices:
            raise _Retry("no device allocation to fail at")
        B, cap, g = rng.choice(choices)
        if variant == "neighbour":
            used = total - w.ctx_bytes - cap
            name = rng.choice(["python3", "vllm", "python", "tritonserver"])
            w.others = [{"pid": rng.randrange(2000, 4_000_000), "used_bytes": used, "name": name}]
        else:
            w.gpu = g
            w.total_bytes = g.total_bytes
            w.device_name = g.name
            w.ctx_bytes = g.total_bytes - cap
        run = _run(w, steps=steps, batch=B, events=prefetch.events(steps))
        if run.oom is None or run.oom.rounded_size > 1 * MiB:
            raise _Retry("calibrated run did not fail on the small request")
        largest = run.alloc.largest_free_block()
        if largest < 32 * MiB:
            raise _Retry("no big hole at the OOM")
        hole = f"a {format_size(run.oom.rounded_size)} request needs a new small-pool segment while a {format_size(largest)} free block is cached for a side stream"
        probe: Callable[[int], bool] | None = None
        if variant == "neighbour":
            alone = _run(
                w,
                steps=steps + 1,
                batch=B,
                history=False,
                other_processes=[],
                events=prefetch.events(steps + 1),
            )
            if alone.oom is not None:
                raise _Retry("does not fit without the neighbour")
            truth = _truth(
                "other_process",
                "small_request_big_hole",
                hard_negative=True,
                notes=f"{hole}; a neighbour holds {format_size(w.others[0]['used_bytes'])}",
            )
        else:
            same = _PrefetchHook(0, w)
            if _run(w, steps=steps + 1, batch=B, history=False, events=same.events(steps + 1)).oom is None:
                truth = _truth(
                    "fragmentation",
                    "small_request_big_hole",
                    hard_negative=True,
                    notes=f"{hole}; with the prefetcher on the default stream the job runs",
                )
            else:

                def fits(b: int) -> bool:
                    return _fits(w, b, steps=2, events=prefetch.events(2))

                if not fits(1):
                    raise _Retry("batch 1 does not fit")
                best = _max_batch(fits, 1, B)
                probe = fits
                truth = _truth(
                    "workload_too_large",
                    "small_request_big_hole",
                    max_batch_size=best,
                    hard_negative=True,
                    notes=f"{hole}; but the step needs more than the device holds either way",
                )
        return _gpu_result(w, run, truth, params, batch_size=B, probe=probe)

    return _attempts("small_request_big_hole", seed, params, body)


class _PrefetchHook:
    """A data prefetcher copying the next batch on a side stream (one batch always in flight)."""

    def __init__(self, stream: int, w: World) -> None:
        self.stream = stream
        self.w = w
        # a pinned host batch plus its features (e.g. packed sequences with precomputed embeddings)
        self.nbytes = max(48 * MiB, min(1 * GiB, w.total_bytes // 64))
        self.nbytes -= self.nbytes % (2 * MiB)
        self.inflight: list[int] = []

    def events(self, steps: int) -> dict[int, Callable[[CachingAllocator], None]]:
        self.inflight = []
        prog = self.w.prog

        def ev(a: CachingAllocator) -> None:
            if not self.inflight:
                # warm-up: a double-size staging buffer, freed: its segment is reused below
                t = a.malloc(2 * self.nbytes + 4 * MiB, prog.stack("prefetch"), self.stream)
                a.free(t, prog.free_stack("next"))
                self.inflight.append(a.malloc(self.nbytes, prog.stack("prefetch"), self.stream))
            nxt = a.malloc(self.nbytes, prog.stack("prefetch"), self.stream)
            a.free(self.inflight.pop(0), prog.free_stack("next"))
            self.inflight.append(nxt)

        return {k: ev for k in range(steps)}


# ---------------------------------------------------------------------- host-side incidents


def _host_world(name: str, seed: int) -> World:
    return _new_world(
        name, seed, 0, arch="cnn" if random.Random(f"{name}:{seed}").random() < 0.5 else "transformer"
    )


def _host_bundle(
    w: World, *, kind: str, message: str, etype: str, host: dict[str, Any], params: dict[str, Any], step: int
) -> dict[str, Any]:
    ident = w.ident
    return {
        "schema": SCHEMA,
        "incident_id": _incident_id(w.name, w.seed, params),
        "occurred_at": _iso(w.start_us + step * 450_000),
        "kind": kind,
        "error": {"type": etype, "message": message, "traceback": None},
        "workload": {
            **{
                k: ident[k]
                for k in ("namespace", "pod", "node", "container", "hostname", "job", "owner_kind")
            },
            **{k: ident[k] for k in ("owner_name", "labels", "annotations", "team", "rank", "local_rank")},
            "world_size": ident["world_size"],
            "restart_count": ident["restart_count"],
            "step": step,
            "batch_size": None,
            "pid": w.pid,
            "pids": list(w.pids),
        },
        "device": None,
        "allocator": None,
        "timeline": [],
        "host": host,
        "environment": _environment(w, None),
        "snapshot": None,
        "collector": {"version": "0.1.0", "history_max_entries": None, "capture_ms": w.rng.randint(2, 60)},
    }


@scenario("shm_exhausted")
def shm_exhausted(seed: int, **params: Any) -> ScenarioResult:
    """DataLoader workers run out of /dev/shm (a container's default 64 MiB, or a small emptyDir)."""
    w = _host_world("shm_exhausted", seed)
    rng = w.rng
    total = int(params.get("shm_total_bytes", rng.choice([64 * MiB, 64 * MiB, 64 * MiB, 256 * MiB, 1 * GiB])))
    used = total - rng.randrange(0, min(total // 50, 2 * MiB) + 1, 4096)
    workers = rng.choice([2, 4, 6, 8, 12, 16])
    w.ident["workers"] = workers
    wpid = rng.randrange(2000, 4_000_000)
    step = rng.randint(0, 5000)
    fname = f"/torch_{w.pid}_{rng.randrange(10**9, 10**10)}_{rng.randrange(10)}"
    variant = rng.choice(["bus_error", "no_space", "both"])
    lines = []
    if variant in ("bus_error", "both"):
        lines.append(
            "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm)."
        )
    if variant in ("no_space", "both"):
        lines.append(f"RuntimeError: unable to write to file <{fname}>: No space left on device (28)")
    lines.append(
        f"RuntimeError: DataLoader worker (pid {wpid}) is killed by signal: Bus error. It is possible that "
        "dataloader's workers are out of shared memory. Please try to raise your shared memory limit."
    )
    message = "\n".join(lines)
    w.pids = [*w.pids, wpid]
    host = _host(w, shm_used=used)
    host["shm_total_bytes"] = total
    host["dataloader_workers"] = workers
    bundle = _host_bundle(
        w, kind="shm_exhausted", message=message, etype="RuntimeError", host=host, params=params, step=step
    )
    return ScenarioResult(
        name="shm_exhausted",
        seed=seed,
        snapshot=None,
        message=message,
        bundle=bundle,
        truth=_truth(
            "shm_exhausted", "shm_exhausted", notes=f"/dev/shm {format_size(total)}, {workers} workers"
        ),
    )


@scenario("host_memory_limit")
def host_memory_limit(seed: int, **params: Any) -> ScenarioResult:
    """The pod's cgroup memory limit kills the process (exit 137, OOMKilled)."""
    w = _host_world("host_memory_limit", seed)
    rng = w.rng
    limit = int(params.get("memory_limit_bytes", rng.choice([16, 32, 48, 64, 96, 128]) * GiB))
    usage = limit - rng.randrange(0, 64 * MiB, 4096)
    kills = rng.randint(1, 3)
    step = rng.randint(0, 20000)
    variant = rng.choice(["killed", "torchrun", "worker"])
    if variant == "killed":
        message = f"step {step} loss {rng.uniform(0.5, 4):.4f}\nKilled\ncommand terminated with exit code 137"
    elif variant == "torchrun":
        message = (
            f"E{rng.randint(1000, 1231)} {rng.randint(10, 23)}:{rng.randint(10, 59)}:{rng.randint(10, 59)}.000000 "
            f"{w.pid} torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: -9) local_rank: "
            f"{w.ident['local_rank']} (pid: {w.pid}) of binary: /usr/bin/python3\n"
            f"Signal 9 (SIGKILL) received by PID {w.pid}"
        )
    else:
        wpid = rng.randrange(2000, 4_000_000)
        message = (
            f"RuntimeError: DataLoader worker (pid(s) {wpid}) exited unexpectedly\n"
            "Pod terminated: reason OOMKilled, exit code 137"
        )
    cg = {"version": 2, "memory_limit_bytes": limit, "memory_usage_bytes": usage, "oom_kill_count": kills}
    host = _host(w, shm_used=None, cgroup=cg, rss=int(usage * rng.uniform(0.85, 0.99)))
    bundle = _host_bundle(
        w, kind="host_oom", message=message, etype="Killed", host=host, params=params, step=step
    )
    bundle["error"]["exit_code"] = 137
    return ScenarioResult(
        name="host_memory_limit",
        seed=seed,
        snapshot=None,
        message=message,
        bundle=bundle,
        truth=_truth("host_memory_limit", "host_memory_limit", notes=f"cgroup limit {format_size(limit)}"),
    )


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def scenario_names() -> list[str]:
    return sorted(_REGISTRY)


_COMMON_PARAMS = {"attempts", "legacy"}
_LEAK_PARAMS = {"leak_kind", "target_steps", "small_ring", "max_steps", "skip_verify"}
PARAMS: dict[str, set[str]] = {
    "healthy": {"steps"},
    "tensor_leak": _LEAK_PARAMS,
    "leak_like_big_batch": _LEAK_PARAMS,
    "leak_no_frames": _LEAK_PARAMS,
    "workload_too_large": {"batch_size"},
    "eval_leak": {"variant", "steps"},
    "fragmentation": {"expandable", "steps"},
    "other_process": {"variant"},
    "gpu_quota": {"variant"},
    "bounded_cache": {"batch_size"},
    "small_request_big_hole": {"variant"},
    "shm_exhausted": {"shm_total_bytes"},
    "host_memory_limit": {"memory_limit_bytes"},
}
VARIANTS: dict[str, list[str]] = {
    "other_process": ["from_start", "mid_run", "zombie", "several"],
    "gpu_quota": ["fraction", "mig", "smaller_device"],
    "small_request_big_hole": ["other_stream", "neighbour"],
    "eval_leak": ["kept", "big_batch"],
}


def run_scenario(name: str, seed: int = 0, **params: Any) -> ScenarioResult:
    """Run one scenario; unknown names, parameters or variants are input errors."""
    fn = _REGISTRY.get(name)
    if fn is None:
        raise InputError(f"unknown scenario {name!r}; known: {', '.join(scenario_names())}")
    allowed = PARAMS.get(name, set()) | _COMMON_PARAMS
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise InputError(
            f"scenario {name}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}"
        )
    if "variant" in params and params["variant"] not in VARIANTS.get(name, []):
        raise InputError(
            f"scenario {name}: unknown variant {params['variant']!r}; known: {', '.join(VARIANTS[name])}"
        )
    if "leak_kind" in params and params["leak_kind"] not in _LEAK_KINDS:
        raise InputError(f"scenario {name}: unknown leak_kind {params['leak_kind']!r}")
    return fn(seed, **params)


def labelled_set(seeds: Iterable[int]) -> list[ScenarioResult]:
    """Every family x every seed (with the variants the seed draws)."""
    out: list[ScenarioResult] = []
    seeds = list(seeds)
    for name in scenario_names():
        for seed in seeds:
            out.append(run_scenario(name, seed))
    # extra cases per seed: a plain fragmentation case, a leak whose history ring is too small
    for seed in seeds:
        out.append(run_scenario("fragmentation", seed + 1000, expandable=False))
        out.append(run_scenario("tensor_leak", seed + 1000, small_ring=True))
    return out


# --------------------------------------------------------------------------------------------
# A big trace, fast (benchmarks)
# --------------------------------------------------------------------------------------------


def large_trace_snapshot(entries: int, frames_per_entry: int = 20, seed: int = 0) -> dict[str, Any]:
    """A long healthy-training trace of about ``entries`` entries (alloc/free pairs and a few
    segment_alloc), about ``frames_per_entry`` frames per entry, sharing a few hundred frame dicts
    like real pickles do; the final segments are what replaying the trace gives.

    Fast path: a persistent set of weights plus per-iteration scratch tensors allocated from the
    front of one scratch segment and all freed (what the caching allocator does when a single free
    block serves every request of an iteration)."""
    rng = random.Random(f"large-trace:{seed}")
    base = 0x7F00_0000_0000 + rng.randrange(1, 1 << 20) * 2 * MiB
    # realistic stacks from a training program, cut or padded to about frames_per_entry frames;
    # a few hundred distinct frame dicts shared by every entry, as in real pickles
    prog = Program(rng, style="all", arch="transformer")
    sites = ["embed", "ln1", "qkv", "sdpa", "proj", "res1", "ln2", "fc1", "act", "fc2", "res2", "final_norm"]
    sites += [
        "head",
        "loss",
        "data.to",
        "adam_state",
        "adam_foreach",
        "clip",
        "metrics",
        "leak.clone",
        "init.to",
    ]
    # interpreter frames between Python frames repeat, as the same dicts, in real stacks
    interp = [
        prog.f(n, fn) for n, fn in (("_PyEval_EvalFrameDefault", "??"), ("_PyFunction_Vectorcall", "??"))
    ]
    interp += [prog.f("PyObject_Call", "??"), prog.f("method_vectorcall", "")]

    def fit(frames: list[Frame]) -> FrameList:
        """Keep the Python frames (innermost first), then as much of the C++ head as fits."""
        n = max(1, frames_per_entry)
        py = [
            f
            for f in frames
            if str(f["filename"]).startswith("/") and not str(f["filename"]).endswith((".c", ".h"))
        ]
        head = [f for f in frames[: frames.index(py[0])]] if py else list(frames)
        if len(py) >= n:
            return py[:n]
        out = head[: n - len(py)] + py
        i = 0
        while len(out) < n:
            out.append(interp[i % len(interp)])
            i += 1
        return out

    stacks: list[FrameList] = [fit(list(prog.stack(site))) for site in sites]
    for node in (
        "MmBackward0",
        "GeluBackward0",
        "NativeLayerNormBackward0",
        "AddmmBackward0",
        "EmbeddingBackward0",
    ):
        stacks.append(fit(list(prog.engine(node))))
    while len(stacks) < 120:
        i = len(stacks)
        st = list(stacks[i % len(sites)])
        st[-1 - (i % 3)] = prog.f("forward", prog.model_file, 1000 + i)  # another call site
        stacks.append(fit(st))
    free_stack = fit(list(prog.free_stack("forward")))
    t = 1_767_225_600_000_000 + rng.randrange(10**12)
    trace: list[dict[str, Any]] = []
    app = trace.append
    segments: list[tuple[int, int, list[tuple[int, int, int, FrameList]]]] = []  # (addr, size, blocks)
    top = base + (1 << 42)

    def seg_alloc(size: int, frames: FrameList) -> int:
        nonlocal top, t
        top -= size
        t += 3
        app(
            {
                "action": "segment_alloc",
                "addr": top,
                "size": size,
                "stream": 0,
                "time_us": t,
                "frames": frames,
                "compile_context": "N/A",
                "user_metadata": "",
            }
        )
        return top

    # weights: persistent, one per large segment
    persistent: list[tuple[int, int, int, FrameList]] = []
    for i in range(8):
        size = rng.randrange(4, 64) * 2 * MiB
        st = stacks[i]
        addr = seg_alloc(size, st)
        t += 2
        app(
            {
                "action": "alloc",
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": t,
                "frames": st,
                "compile_context": "N/A",
                "user_metadata": "",
            }
        )
        segments.append((addr, size, [(addr, size, size, st)]))
        persistent.append((addr, size, size, st))
    scratch_size = 2 * GiB
    scratch = seg_alloc(scratch_size, stacks[9])
    sizes = [rng.randrange(1, 4096) * 512 + rng.randrange(512) for _ in range(64)]
    rounded = [512 * ((s + 511) // 512) for s in sizes]
    while len(trace) + 3 * 8 < entries:
        n = min(len(sizes), max(1, (entries - len(trace)) // 3))
        addrs = []
        off = scratch
        for j in range(n):
            t += 1 + (j & 3)
            app(
                {
                    "action": "alloc",
                    "addr": off,
                    "size": sizes[j],
                    "stream": 0,
                    "time_us": t,
                    "frames": stacks[10 + (j * 13) % 110],
                    "compile_context": "N/A",
                    "user_metadata": "",
                }
            )
            addrs.append((off, sizes[j]))
            off += rounded[j]
        for addr, sz in reversed(addrs):
            t += 1
            app(
                {
                    "action": "free_requested",
                    "addr": addr,
                    "size": sz,
                    "stream": 0,
                    "time_us": t,
                    "frames": free_stack,
                    "compile_context": "N/A",
                    "user_metadata": "",
                }
            )
            app(
                {
                    "action": "free_completed",
                    "addr": addr,
                    "size": sz,
                    "stream": 0,
                    "time_us": t,
                    "frames": free_stack,
                    "compile_context": "N/A",
                    "user_metadata": "",
                }
            )
        t += 50
    segs_out: list[dict[str, Any]] = []
    for addr, size, blocks in segments:
        segs_out.append(
            {
                "device": 0,
                "address": addr,
                "total_size": size,
                "allocated_size": size,
                "active_size": size,
                "requested_size": blocks[0][2],
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": blocks[0][3],
                "blocks": [
                    {
                        "address": b[0],
                        "size": b[1],
                        "requested_size": b[2],
                        "state": "active_allocated",
                        "frames": b[3],
                    }
                    for b in blocks
                ],
            }
        )
    segs_out.append(
        {
            "device": 0,
            "address": scratch,
            "total_size": scratch_size,
            "allocated_size": 0,
            "active_size": 0,
            "requested_size": 0,
            "stream": 0,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": stacks[9],
            "blocks": [
                {
                    "address": scratch,
                    "size": scratch_size,
                    "requested_size": sizes[0],
                    "state": "inactive",
                    "frames": [],
                }
            ],
        }
    )
    segs_out.sort(key=lambda s: s["address"])
    return {
        "segments": segs_out,
        "device_traces": [trace],
        "allocator_settings": CachingAllocator(record_history=False, seed=seed).allocator_settings(),
        "external_annotations": [],
    }
