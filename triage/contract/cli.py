"""`triage audit manifest|pod|mfu`: check a job, a running pod, or an MFU figure against the contract.

Exit codes: 0 every check passes or warns, 1 a check failed, 2 bad input (a one-line error).
Only argparse is imported at module level; the handlers import the rest.
"""

from __future__ import annotations

import argparse
from typing import Any

_DTYPES = ("bf16", "fp16", "tf32")


def register(subparsers: Any) -> None:
    """Add `audit` and its subcommands to the `triage` parser."""
    parser = subparsers.add_parser(
        "audit",
        help="check a job manifest, a running pod or an MFU figure against the platform resource contract",
        description="Check a job manifest (pre-submit), the pod this runs in, or an MFU figure against the "
        "platform resource contract. Exit 0: pass (warnings allowed); 1: a check failed; 2: bad input.",
    )
    parser.set_defaults(func=lambda args: _usage(parser))
    sub = parser.add_subparsers(dest="audit_command", metavar="WHAT")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--contract",
        metavar="FILE",
        help="contract TOML file (default: $TRIAGE_CONTRACT, else the packaged contract)",
    )
    common.add_argument(
        "--namespace",
        metavar="NS",
        help="apply this namespace's overrides (default: the manifest's / pod's namespace)",
    )
    common.add_argument("--json", action="store_true", help="print one JSON object instead of a table")

    manifest = sub.add_parser(
        "manifest",
        parents=[common],
        help="pre-submit gate for a Job/PyTorchJob/Deployment/Pod/... manifest",
        description="Check every pod template of a YAML manifest: /dev/shm, CPUs per GPU, memory limits, "
        "GPU/MIG requests, DataLoader workers, NUMA alignment.",
    )
    manifest.add_argument("manifest", metavar="JOB.yaml", help="the manifest (one or more YAML documents)")
    manifest.set_defaults(func=_manifest)

    pod = sub.add_parser(
        "pod",
        parents=[common],
        help="audit the pod this command runs in (/dev/shm, CPUs, NUMA, cgroup memory)",
        description="Read this pod's /dev/shm, CPU count and affinity, the NUMA node of each visible GPU and "
        "the cgroup memory limit, and check them against the contract.",
    )
    pod.add_argument(
        "--gpu-pci-bus-id",
        action="append",
        metavar="BUS_ID",
        help="a GPU's PCI bus id (e.g. 0000:3b:00.0); repeat for several. Default: the GPUs NVML sees",
    )
    pod.add_argument(
        "--dataloader-workers", type=int, metavar="N", help="DataLoader num_workers per GPU process"
    )
    pod.add_argument(
        "--root", default="/", metavar="DIR", help="read /proc, /sys and /dev under DIR (default /)"
    )
    pod.add_argument(
        "--shm-path", default="/dev/shm", metavar="PATH", help="the shared-memory mount to measure"
    )
    pod.add_argument("--no-nvml", action="store_true", help="do not ask NVML for the GPUs")
    pod.set_defaults(func=_pod)

    mfu = sub.add_parser(
        "mfu",
        parents=[common],
        help="model FLOPs utilisation and the job gate / algorithm SLA decisions",
        description="MFU = model FLOPs per step / step time / (peak FLOP/s per GPU × GPUs).",
    )
    mfu.add_argument(
        "--flops-per-step", type=float, metavar="F", help="model FLOPs of one step, summed over all GPUs"
    )
    mfu.add_argument("--step-time", type=float, metavar="S", help="seconds per step")
    mfu.add_argument("--gpus", type=int, default=1, metavar="N", help="GPUs of the run (default 1)")
    which = mfu.add_mutually_exclusive_group()
    which.add_argument("--gpu", metavar="NAME", help="GPU model from the peak table, e.g. A100-SXM4-80GB")
    which.add_argument("--peak-flops", type=float, metavar="P", help="peak FLOP/s of one GPU")
    mfu.add_argument("--dtype", choices=_DTYPES, default="bf16", help="training dtype (default bf16)")
    mfu.add_argument("--list-gpus", action="store_true", help="print the peak-FLOPs table and exit")
    mfu.set_defaults(func=_mfu)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _contract_file(args: argparse.Namespace) -> Any:
    from triage.contract.load import load_contract_file

    return load_contract_file(args.contract)


def _manifest(args: argparse.Namespace) -> int:
    from triage.contract.manifest import audit_manifest

    report = audit_manifest(args.manifest, _contract_file(args), namespace=args.namespace)
    return _emit(report, args)


def _pod(args: argparse.Namespace) -> int:
    import os

    from triage.contract.pod import audit_pod
    from triage.errors import InputError

    if args.dataloader_workers is not None and args.dataloader_workers < 0:
        raise InputError("--dataloader-workers must be 0 or more")
    report = audit_pod(
        _contract_file(args),
        namespace=args.namespace,
        root=args.root,
        shm_path=args.shm_path,
        gpu_pci_bus_ids=args.gpu_pci_bus_id,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        dataloader_workers=args.dataloader_workers,
        use_nvml=not args.no_nvml,
    )
    return _emit(report, args)


def _mfu(args: argparse.Namespace) -> int:
    from triage.contract.mfu import audit_mfu
    from triage.errors import InputError

    if args.list_gpus:
        _print_peaks(args.json)
        return 0
    for flag, value in (("--flops-per-step", args.flops_per_step), ("--step-time", args.step_time)):
        if value is None:
            raise InputError(f"{flag} is required")
    if args.gpu is None and args.peak_flops is None:
        raise InputError("give --gpu NAME (see --list-gpus) or --peak-flops P")
    contract = _contract_file(args).for_namespace(args.namespace)
    report = audit_mfu(
        contract,
        flops_per_step=args.flops_per_step,
        step_time_s=args.step_time,
        gpus=args.gpus,
        gpu=args.gpu,
        peak_flops=args.peak_flops,
        dtype=args.dtype,
    )
    return _emit(report, args)


def _emit(report: Any, args: argparse.Namespace) -> int:
    if args.json:
        import json

        print(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
    else:
        render(report)
    return int(report.exit_code)


_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}


def render(report: Any) -> None:
    """The human table of an AuditReport."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    contract = report.contract
    overrides = f", namespace overrides {contract.overrides}" if contract.overrides else ""
    table = Table(
        title=Text(f"triage audit {report.audit}: {report.target}"),
        caption=Text(f"contract {contract.version} ({contract.source}{overrides})"),
        expand=False,
    )
    table.add_column("check", no_wrap=True)
    table.add_column("subject")
    table.add_column("status", no_wrap=True)
    table.add_column("finding")
    table.add_column("fix")
    for check in report.checks:
        table.add_row(
            Text(check.id),
            Text(check.subject),
            Text(check.status, style=_STYLE[check.status]),
            Text(check.sentence),
            Text(check.fix or ""),
        )
    console.print(table)
    counts = report.counts()
    summary = Text(f"{counts['pass']} pass, {counts['warn']} warn, {counts['fail']} fail: ")
    summary.append(report.status.upper(), style=_STYLE[report.status])
    console.print(summary)


def _print_peaks(as_json: bool) -> None:
    from triage.contract.mfu import PEAKS

    if as_json:
        import json

        rows = [
            {"gpu": p.name, "aliases": list(p.aliases), "bf16": p.bf16, "fp16": p.fp16, "tf32": p.tf32}
            for p in PEAKS
        ]
        print(json.dumps({"peak_flops_dense": rows}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    def tf(x: float | None) -> str:
        return "—" if x is None else f"{x / 1e12:g}"

    table = Table(title="dense peak TFLOP/s per GPU (vendor datasheets)")
    for column in ("gpu", "bf16", "fp16", "tf32", "also known as"):
        table.add_column(column)
    for p in PEAKS:
        table.add_row(Text(p.name), tf(p.bf16), tf(p.fp16), tf(p.tf32), Text(", ".join(p.aliases)))
    Console().print(table)
