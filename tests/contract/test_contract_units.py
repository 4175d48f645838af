"""Kubernetes quantities, CPU lists, and the number formats of the sentences."""

from __future__ import annotations

import pytest

from triage.contract.checks import fmt_cpulist, parse_cpulist
from triage.contract.quantity import (
    fmt_bytes,
    fmt_number,
    fmt_percent,
    fmt_quantity,
    parse_bytes,
    parse_millicores,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64Gi", 64 * 1024**3),
        ("16Gi", 17179869184),
        ("15Gi", 16106127360),
        ("1.5Gi", 1610612736),
        ("64Mi", 67108864),
        ("1Ti", 1024**4),
        ("1e9", 1_000_000_000),
        ("1E", 10**18),
        ("129M", 129_000_000),
        ("128974848", 128974848),
        (1024, 1024),
        ("1.5Ki", 1536),
        ("0.5", 1),  # bytes round up, as in Kubernetes
        ("100m", 1),
    ],
)
def test_parse_bytes(text: object, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("500m", 500), ("4", 4000), (4, 4000), ("0.5", 500), ("31500m", 31500), (2.5, 2500), ("1k", 1_000_000)],
)
def test_parse_millicores(text: object, expected: int) -> None:
    assert parse_millicores(text) == expected


@pytest.mark.parametrize("bad", ["4 cores", "Gi", "", "16 GB", "1.2.3", True, None, [4], "-1", "1e99"])
def test_not_a_quantity(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_bytes(bad)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (64 * 1024**3, "64 GiB"),
        (16106127360, "15 GiB"),
        (1610612736, "1.5 GiB"),
        (25276059648, "23.54 GiB"),
        (16 * 1024**3 - 1024**2, "15.99 GiB"),  # never reads as the floor it misses
        (64 * 1024**2, "64 MiB"),
        (512, "512 B"),
        (3 * 1024**4, "3 TiB"),
    ],
)
def test_fmt_bytes(n: int, text: str) -> None:
    assert fmt_bytes(n) == text


def test_fmt_percent_number_quantity() -> None:
    assert [fmt_percent(x) for x in (0.35, 0.45, 0.320513, 0.3499, 0.34999, 1.0, 0.0)] == [
        "35%",
        "45%",
        "32.05%",
        "34.99%",
        "35.00%",
        "100%",
        "0%",
    ]
    assert [fmt_number(x) for x in (4.0, 3.875, 0.5, 31)] == ["4", "3.88", "0.5", "31"]
    assert [fmt_quantity(x) for x in (64 * 1024**3, 16 * 1024**3, 64 * 1024**2, 1000)] == [
        "64Gi",
        "16Gi",
        "64Mi",
        "1000",
    ]


def test_cpulists() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []
    assert fmt_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert fmt_cpulist(parse_cpulist("0-15,32-47")) == "0-15,32-47"
    for bad in ("3-1", "a", "-1"):
        with pytest.raises(ValueError):
            parse_cpulist(bad)
