"""The contract file: packaged defaults (DESIGN.md numbers), namespace overrides, lookup order, errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.contract.conftest import GiB, MiB, Result
from triage.contract.errors import ContractError
from triage.contract.load import (
    PACKAGED_SOURCE,
    ContractFile,
    load_contract,
    load_contract_file,
    parse_contract,
)
from triage.errors import InputError

PACKAGED = (Path(__file__).resolve().parents[2] / "triage" / "contract" / "contract.toml").read_text()


def test_packaged_defaults_are_the_design_numbers(contract_file: ContractFile) -> None:
    c = contract_file.default
    assert (c.version, c.source, c.overrides) == ("2025.1", PACKAGED_SOURCE, None)
    assert c.shm.sla_bytes == 64 * GiB
    assert c.shm.floor_bytes == 16 * GiB
    assert c.shm.runtime_default_bytes == 64 * MiB
    assert c.shm.usage_warn == 0.9
    assert c.cpu.min_per_gpu == 4.0
    assert c.memory.require_limit is True
    assert c.gpu.resources == ("nvidia.com/gpu", "amd.com/gpu")
    assert c.gpu.mig_prefix == "nvidia.com/mig-"
    assert (c.dataloader.min_workers, c.dataloader.numa_pinning) == (1, True)
    assert (c.mfu.job_gate, c.mfu.algorithm_sla) == (0.35, 0.45)
    s = c.scale_up
    assert (s.min_mfu, s.min_gpu_utilization, s.report_min_gpus, s.report_max_gpus) == (0.40, 0.65, 4, 8)
    assert c.header() == {
        "contract_version": "2025.1",
        "contract_namespace": None,
        "contract_source": PACKAGED_SOURCE,
    }


def test_namespace_overrides_merge_over_defaults(contract_file: ContractFile) -> None:
    sandbox = contract_file.for_namespace("dev-sandbox")
    assert sandbox.overrides == "dev-sandbox"
    assert (sandbox.shm.sla_bytes, sandbox.shm.floor_bytes) == (16 * GiB, 2 * GiB)
    assert sandbox.shm.usage_warn == 0.9  # not overridden: the default
    assert sandbox.cpu.min_per_gpu == 2.0
    assert (sandbox.mfu.job_gate, sandbox.mfu.algorithm_sla) == (0.0, 0.45)
    assert sandbox.version == "2025.1"
    other = contract_file.for_namespace("ml-train")  # no override section: the defaults
    assert other.overrides is None and other.shm.floor_bytes == 16 * GiB
    assert contract_file.for_namespace(None) == contract_file.default


def test_lookup_order_flag_then_env_then_packaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_file = tmp_path / "env.toml"
    env_file.write_text(PACKAGED.replace('version = "2025.1"', 'version = "env-1"'))
    flag_file = tmp_path / "flag.toml"
    flag_file.write_text(PACKAGED.replace('version = "2025.1"', 'version = "flag-1"'))
    assert load_contract().version == "2025.1"
    monkeypatch.setenv("TRIAGE_CONTRACT", str(env_file))
    assert load_contract().version == "env-1"
    assert load_contract().source == str(env_file)
    assert load_contract(flag_file).version == "flag-1"
    monkeypatch.setenv("TRIAGE_CONTRACT", "")
    assert load_contract().source == PACKAGED_SOURCE


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("[cpu]", "[cpus]"), "unknown key 'cpus'"),
        (
            ("job_gate = 0.35", "job_gate = 35"),
            "mfu.job_gate must be a fraction between 0 and 1 (35% is 0.35), got 35",
        ),
        (('floor = "16Gi"', 'floor = "16 GB"'), "shm.floor must be a Kubernetes quantity"),
        (('floor = "16Gi"', 'floor = "128Gi"'), "defaults: shm.floor exceeds shm.sla"),
        (("min_per_gpu = 4 ", "min_per_gpu = 0 "), "cpu.min_per_gpu must be a positive number of CPU cores"),
        (("require_limit = true", "require_limit = 1"), "memory.require_limit must be true or false"),
        (("report_min_gpus = 4", "report_min_gpus = 9"), "report_min_gpus ≤ scale_up.report_max_gpus"),
        (('version = "2025.1"', 'version = ""'), "`version` must be a non-empty string"),
        (('schema = "oom-triage/contract@1"', 'schema = "x"'), "schema must be 'oom-triage/contract@1'"),
        (
            ("[namespaces.dev-sandbox.cpu]", "[namespaces.dev-sandbox.gpus]"),
            "[namespaces.dev-sandbox]: unknown table 'gpus'",
        ),
        (('floor = "2Gi"', 'floor = "32Gi"'), "[namespaces.dev-sandbox]: shm.floor exceeds shm.sla"),
        (("min_per_gpu = 2", "min_per_gpus = 2"), "[namespaces.dev-sandbox.cpu]: unknown key 'min_per_gpus'"),
        (("usage_warn = 0.9", "usage_warn = [0.9"), "not valid TOML"),
    ],
)
def test_bad_contract_names_file_and_key(edit: tuple[str, str], message: str) -> None:
    old, new = edit
    assert old in PACKAGED
    with pytest.raises(ContractError) as info:
        parse_contract(PACKAGED.replace(old, new, 1), "bad.toml")
    assert str(info.value).startswith("contract bad.toml: ")
    assert message in str(info.value)
    assert isinstance(info.value, InputError)


def test_missing_table_and_missing_key() -> None:
    without_mfu = PACKAGED.replace("[mfu]\njob_gate = 0.35          # MFU to pass the job gate\n", "[mfu]\n")
    with pytest.raises(ContractError, match=r"\[mfu\]: missing job_gate"):
        parse_contract(without_mfu, "x.toml")
    with pytest.raises(ContractError, match=r"missing table \[memory\]"):
        parse_contract(PACKAGED.replace("[memory]\nrequire_limit = true", ""), "x.toml")


def test_unreadable_contract_file(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match=r"cannot read contract .*nope\.toml: No such file or directory"):
        load_contract_file(tmp_path / "nope.toml")


def test_cli_bad_contract_is_a_one_line_error(tmp_path: Path, triage: Callable[..., Result]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('schema = "oom-triage/contract@1"\nversion = "x"\n')
    rc, out, err = triage(
        "audit",
        "mfu",
        "--contract",
        str(bad),
        "--flops-per-step",
        "1e15",
        "--step-time",
        "1",
        "--gpu",
        "A100",
    )
    assert rc == 2 and out == ""
    assert err == f"triage audit: error: contract {bad}: missing table [shm]\n"


def test_cli_reads_triage_contract_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, triage_json: Callable[..., tuple[int, dict[str, Any]]]
) -> None:
    custom = tmp_path / "strict.toml"
    custom.write_text(
        PACKAGED.replace('version = "2025.1"', 'version = "strict-7"').replace(
            "job_gate = 0.35", "job_gate = 0.5"
        )
    )
    args = ("audit", "mfu", "--flops-per-step", "4.5e14", "--step-time", "1", "--peak-flops", "1e15")
    monkeypatch.setenv("TRIAGE_CONTRACT", str(custom))
    rc, report = triage_json(*args)
    assert (rc, report["contract_version"], report["contract_source"]) == (1, "strict-7", str(custom))
    rc, report = triage_json(
        *args, "--contract", str(Path(__file__).resolve().parents[2] / "triage/contract/contract.toml")
    )
    assert (rc, report["contract_version"]) == (0, "2025.1")
