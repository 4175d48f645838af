"""What NVML says about the device (when ``pynvml`` / ``nvidia-ml-py`` is importable; optional).

The device is found by its UUID (what torch reports for the CUDA device, MIG slices included), so the
``CUDA_VISIBLE_DEVICES`` renumbering cannot mislead. Each call is guarded on its own: a driver that
lacks one query still answers the others.
"""

from __future__ import annotations

import os
import re
from typing import Any

from collector import _host


def _s(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _norm_uuid(u: str) -> str:
    u = u.strip().lower()
    for p in ("gpu-", "mig-"):
        if u.startswith(p):
            u = u[len(p) :]
    return u


def _handle(nv: Any, uuid: str | None, index: int | None) -> Any:
    if uuid:
        for candidate in (uuid, "GPU-" + uuid, "MIG-" + uuid):
            try:
                return nv.nvmlDeviceGetHandleByUUID(candidate)
            except Exception:
                continue
        want = _norm_uuid(uuid)
        try:
            count = nv.nvmlDeviceGetCount()
        except Exception:
            count = 0
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
            except Exception:
                continue
            try:
                if _norm_uuid(_s(nv.nvmlDeviceGetUUID(h))) == want:
                    return h
            except Exception:
                pass
            try:  # MIG slices of this GPU
                for j in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                        if _norm_uuid(_s(nv.nvmlDeviceGetUUID(m))) == want:
                            return m
                    except Exception:
                        continue
            except Exception:
                pass
    if index is not None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        nvml_index = index
        if visible:
            entries = [v.strip() for v in visible.split(",") if v.strip()]
            if index < len(entries) and entries[index].isdigit():
                nvml_index = int(entries[index])
            elif index < len(entries):
                try:
                    return nv.nvmlDeviceGetHandleByUUID(entries[index])
                except Exception:
                    return None
        try:
            return nv.nvmlDeviceGetHandleByIndex(nvml_index)
        except Exception:
            return None
    return None


def facts(uuid: str | None, index: int | None) -> dict[str, Any]:
    """``device`` keys (name, uuid, total_bytes, mig_mode, mig_profile, processes) and ``driver_version``."""
    try:
        import pynvml as nv  # type: ignore[import-not-found,unused-ignore]
    except Exception:
        return {}
    out: dict[str, Any] = {}
    try:
        nv.nvmlInit()
    except Exception:
        return {}
    try:
        try:
            out["driver_version"] = _s(nv.nvmlSystemGetDriverVersion())
        except Exception:
            pass
        h = _handle(nv, uuid, index)
        if h is None:
            return out
        is_mig = False
        try:
            is_mig = bool(nv.nvmlDeviceIsMigDeviceHandle(h))
        except Exception:
            pass
        try:
            out["name"] = _s(nv.nvmlDeviceGetName(h))
        except Exception:
            pass
        try:
            out["uuid"] = _s(nv.nvmlDeviceGetUUID(h))
        except Exception:
            pass
        try:
            out["total_bytes"] = int(nv.nvmlDeviceGetMemoryInfo(h).total)
        except Exception:
            pass
        if is_mig:
            out["mig_mode"] = True
            m = re.search(r"MIG\s+(\S+)", out.get("name", ""))
            if m:
                out["mig_profile"] = m.group(1)
        else:
            try:
                current, _pending = nv.nvmlDeviceGetMigMode(h)
                out["mig_mode"] = bool(current)
            except Exception:
                pass
        try:
            procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
            plist = []
            for p in procs[:256]:
                pid = int(p.pid)
                used = getattr(p, "usedGpuMemory", None)
                plist.append(
                    {
                        "pid": pid,
                        "used_bytes": int(used) if isinstance(used, int) and 0 <= used < 1 << 62 else None,
                        "name": _host.process_name(pid),
                    }
                )
            out["processes"] = plist
        except Exception:
            pass
        return out
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
