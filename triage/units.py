"""Byte sizes: torch's formatting and parsing of the sizes printed in OOM messages."""

from __future__ import annotations

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

_UNITS = {
    "B": 1,
    "BYTES": 1,
    "KIB": KiB,
    "MIB": MiB,
    "GIB": GiB,
    "TIB": TiB,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
}


def format_bytes(n: int) -> str:
    """c10's ``format_size``, as in torch's OOM message: bytes up to 1024, then KiB/MiB/GiB with two
    decimals (the boundaries are inclusive: 1 MiB prints as ``1024.00 KiB``)."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= MiB:
        return f"{n / 1024.0:.2f} KiB"
    if n <= GiB:
        return f"{n / float(MiB):.2f} MiB"
    return f"{n / float(GiB):.2f} GiB"


def human(n: int | float) -> str:
    """Short human size for tables: 1.5 GiB, 12.0 MiB, 512 B."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, div in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= div:
            return f"{sign}{n / div:.1f} {unit}"
    return f"{sign}{int(n)} B"


def parse_size(value: str, unit: str) -> int:
    """`"20.00", "MiB"` → bytes. Torch prints two decimals, so results are exact to the printed precision."""
    mult = _UNITS[unit.strip().upper()]
    return round(float(value) * mult)
