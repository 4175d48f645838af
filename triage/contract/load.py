"""Reading the contract file: `--contract FILE`, else `$TRIAGE_CONTRACT`, else the packaged default.

The whole file is validated when it is read, every namespace override included, so a typo in an
override fails at load time with the file and the key in the message, not when that namespace's
first job is audited.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triage.contract.errors import ContractError
from triage.contract.model import (
    Contract,
    CpuTerms,
    DataLoaderTerms,
    GpuTerms,
    MemoryTerms,
    MfuTerms,
    ScaleUpTerms,
    ShmTerms,
)
from triage.contract.quantity import parse_bytes

SCHEMA = "oom-triage/contract@1"
ENV_VAR = "TRIAGE_CONTRACT"
PACKAGED_SOURCE = "package:triage/contract/contract.toml"
_MAX_BYTES = 1024 * 1024

# section → key → kind. Kinds: size (quantity → bytes), fraction (0..1), cores (> 0), count (int ≥ 0),
# bool, str, strs (list of str).
_KEYS: dict[str, dict[str, str]] = {
    "shm": {"sla": "size", "floor": "size", "runtime_default": "size", "usage_warn": "fraction"},
    "cpu": {"min_per_gpu": "cores"},
    "memory": {"require_limit": "bool"},
    "gpu": {"resources": "strs", "mig_prefix": "str"},
    "dataloader": {"min_workers": "count", "numa_pinning": "bool"},
    "mfu": {"job_gate": "fraction", "algorithm_sla": "fraction"},
    "scale_up": {
        "min_mfu": "fraction",
        "min_gpu_utilization": "fraction",
        "report_min_gpus": "count",
        "report_max_gpus": "count",
    },
}


@dataclass(frozen=True)
class ContractFile:
    """The parsed file: version, defaults and per-namespace overrides (all validated)."""

    version: str
    source: str
    defaults: Mapping[str, Mapping[str, Any]]
    namespaces: Mapping[str, Mapping[str, Mapping[str, Any]]]

    def for_namespace(self, namespace: str | None) -> Contract:
        """The contract for pods in `namespace`: its overrides if the file has any, else the defaults."""
        if namespace is not None and namespace in self.namespaces:
            return _build(self, namespace, self.namespaces[namespace])
        return _build(self, None, {})

    @property
    def default(self) -> Contract:
        return self.for_namespace(None)


def resolve_path(path: str | os.PathLike[str] | None) -> str | None:
    """The file to read: the explicit path, else `$TRIAGE_CONTRACT`, else None (the packaged default)."""
    if path is not None and str(path) != "":
        return str(path)
    env = os.environ.get(ENV_VAR, "")
    return env or None


def load_contract_file(path: str | os.PathLike[str] | None = None) -> ContractFile:
    """Read and validate a contract file (see `resolve_path` for which one)."""
    chosen = resolve_path(path)
    if chosen is None:
        from importlib import resources

        text = resources.files("triage.contract").joinpath("contract.toml").read_text(encoding="utf-8")
        return parse_contract(text, PACKAGED_SOURCE)
    file = Path(chosen)
    try:
        if file.stat().st_size > _MAX_BYTES:
            raise ContractError(f"contract {chosen}: larger than {_MAX_BYTES} bytes")
        text = file.read_text(encoding="utf-8")
    except ContractError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ContractError(f"cannot read contract {chosen}: {reason}")
    return parse_contract(text, chosen)


def load_contract(path: str | os.PathLike[str] | None = None, namespace: str | None = None) -> Contract:
    """Shorthand: read the contract file and resolve it for `namespace`."""
    return load_contract_file(path).for_namespace(namespace)


def parse_contract(text: str, source: str) -> ContractFile:
    """Parse and validate contract TOML; `source` names it in errors and results."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ContractError(f"contract {source}: not valid TOML: {exc}")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise ContractError(f"contract {source}: schema must be {SCHEMA!r}, got {schema!r}")
    version = data.get("version")
    if not isinstance(version, str) or not version.strip():
        raise ContractError(f"contract {source}: `version` must be a non-empty string")
    allowed_top = {"schema", "version", "namespaces", *_KEYS}
    for key in data:
        if key not in allowed_top:
            raise ContractError(
                f"contract {source}: unknown key {key!r} (known: {', '.join(sorted(allowed_top))})"
            )
    defaults: dict[str, dict[str, Any]] = {}
    for section, keys in _KEYS.items():
        table = data.get(section)
        if not isinstance(table, dict):
            raise ContractError(f"contract {source}: missing table [{section}]")
        defaults[section] = _validate_section(source, section, table, keys, required=True)
    namespaces: dict[str, dict[str, dict[str, Any]]] = {}
    raw_ns = data.get("namespaces", {})
    if not isinstance(raw_ns, dict):
        raise ContractError(f"contract {source}: `namespaces` must be a table of tables")
    for ns, overrides in raw_ns.items():
        if not isinstance(overrides, dict):
            raise ContractError(f"contract {source}: [namespaces.{ns}] must be a table")
        namespaces[ns] = {}
        for section, table in overrides.items():
            if section not in _KEYS:
                raise ContractError(
                    f"contract {source}: [namespaces.{ns}]: unknown table {section!r} "
                    f"(known: {', '.join(_KEYS)})"
                )
            if not isinstance(table, dict):
                raise ContractError(f"contract {source}: [namespaces.{ns}.{section}] must be a table")
            namespaces[ns][section] = _validate_section(
                source, f"namespaces.{ns}.{section}", table, _KEYS[section], required=False
            )
    result = ContractFile(version=version.strip(), source=source, defaults=defaults, namespaces=namespaces)
    result.for_namespace(None)
    for ns in namespaces:  # cross-key rules (floor ≤ SLA, …) hold for every namespace
        result.for_namespace(ns)
    return result


def _validate_section(
    source: str, where: str, table: Mapping[str, Any], keys: Mapping[str, str], *, required: bool
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        kind = keys.get(key)
        if kind is None:
            raise ContractError(
                f"contract {source}: [{where}]: unknown key {key!r} (known: {', '.join(keys)})"
            )
        out[key] = _coerce(source, f"{where}.{key}", kind, value)
    if required:
        missing = [k for k in keys if k not in out]
        if missing:
            raise ContractError(f"contract {source}: [{where}]: missing {', '.join(missing)}")
    return out


def _coerce(source: str, where: str, kind: str, value: Any) -> Any:
    def bad(expected: str) -> ContractError:
        return ContractError(f"contract {source}: {where} must be {expected}, got {value!r}")

    if kind == "size":
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise bad('a Kubernetes quantity such as "16Gi"')
        try:
            return parse_bytes(value)
        except ValueError:
            raise bad('a Kubernetes quantity such as "16Gi"')
    if kind == "fraction":
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise bad("a fraction between 0 and 1 (35% is 0.35)")
        return float(value)
    if kind == "cores":
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise bad("a positive number of CPU cores")
        return float(value)
    if kind == "count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad("a non-negative integer")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if kind == "str":
        if not isinstance(value, str) or not value:
            raise bad("a non-empty string")
        return value
    if kind == "strs":
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise bad("a list of non-empty strings")
        return tuple(value)
    raise AssertionError(kind)  # pragma: no cover


def _build(file: ContractFile, overrides: str | None, patch: Mapping[str, Mapping[str, Any]]) -> Contract:
    merged = {section: {**values, **patch.get(section, {})} for section, values in file.defaults.items()}
    where = f"[namespaces.{overrides}]" if overrides else "defaults"
    shm, sc = merged["shm"], merged["scale_up"]
    if shm["floor"] > shm["sla"]:
        raise ContractError(f"contract {file.source}: {where}: shm.floor exceeds shm.sla")
    if sc["report_min_gpus"] < 1 or sc["report_min_gpus"] > sc["report_max_gpus"]:
        raise ContractError(
            f"contract {file.source}: {where}: need 1 ≤ scale_up.report_min_gpus ≤ scale_up.report_max_gpus"
        )
    return Contract(
        version=file.version,
        source=file.source,
        overrides=overrides,
        shm=ShmTerms(
            sla_bytes=shm["sla"],
            floor_bytes=shm["floor"],
            runtime_default_bytes=shm["runtime_default"],
            usage_warn=shm["usage_warn"],
        ),
        cpu=CpuTerms(min_per_gpu=merged["cpu"]["min_per_gpu"]),
        memory=MemoryTerms(require_limit=merged["memory"]["require_limit"]),
        gpu=GpuTerms(resources=merged["gpu"]["resources"], mig_prefix=merged["gpu"]["mig_prefix"]),
        dataloader=DataLoaderTerms(
            min_workers=merged["dataloader"]["min_workers"], numa_pinning=merged["dataloader"]["numa_pinning"]
        ),
        mfu=MfuTerms(job_gate=merged["mfu"]["job_gate"], algorithm_sla=merged["mfu"]["algorithm_sla"]),
        scale_up=ScaleUpTerms(
            min_mfu=sc["min_mfu"],
            min_gpu_utilization=sc["min_gpu_utilization"],
            report_min_gpus=sc["report_min_gpus"],
            report_max_gpus=sc["report_max_gpus"],
        ),
    )
