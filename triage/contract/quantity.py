"""Kubernetes resource quantities (`64Gi`, `500m`, `1e9`) and the size/number formats of our sentences."""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
# A number (optionally with a decimal exponent), then at most one suffix. `1E` is one exa; `1e3` is 1000.
_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:[eE]([+-]?[0-9]+))?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$"
)


def parse_quantity(value: object) -> Decimal:
    """A Kubernetes quantity as an exact Decimal; ValueError when it is not one."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    match = _QUANTITY.match(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    number, exponent, suffix = match.groups()
    try:
        result = Decimal(number)
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    if exponent is not None:
        if abs(int(exponent)) > 30:
            raise ValueError(f"{value!r} is out of range")
        result = result.scaleb(int(exponent))
    return result * _SUFFIX[suffix or ""]


def parse_bytes(value: object) -> int:
    """A memory quantity in bytes, rounded up like Kubernetes does (`1.5Ki` → 1536)."""
    quantity = parse_quantity(value)
    if quantity < 0:
        raise ValueError(f"{value!r} is negative")
    return int(quantity.to_integral_value(rounding=ROUND_CEILING))


def parse_millicores(value: object) -> int:
    """A CPU quantity in millicores (`500m` → 500, `4` → 4000), rounded up to a millicore."""
    quantity = parse_quantity(value)
    if quantity < 0:
        raise ValueError(f"{value!r} is negative")
    return int((quantity * 1000).to_integral_value(rounding=ROUND_CEILING))


_BINARY = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def fmt_bytes(n: int) -> str:
    """`68719476736` → `64 GiB`, `1610612736` → `1.5 GiB`, `512` → `512 B`.

    Inexact values are cut, not rounded, to two decimals, so a size just under a threshold never
    prints as the threshold (16 GiB − 1 MiB is `15.99 GiB`; 15 GiB + 1 KiB is `15.00 GiB`).
    """
    for unit, div in _BINARY:
        if n >= div:
            if n % div == 0:
                return f"{n // div} {unit}"
            hundredths = n * 100 // div
            text = f"{hundredths // 100}.{hundredths % 100:02d}"
            if not text.endswith("00"):
                text = text.rstrip("0")
            return f"{text} {unit}"
    return f"{n} B"


def fmt_quantity(n: int) -> str:
    """Bytes as a Kubernetes quantity for a fix: `68719476736` → `64Gi`, `1000` → `1000` (exact units only)."""
    for suffix, div in (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if n >= div and n % div == 0:
            return f"{n // div}{suffix}"
    return str(n)


def fmt_number(x: float) -> str:
    """`4.0` → `4`, `3.875` → `3.88`, `0.5` → `0.5`."""
    if float(x).is_integer():
        return str(int(x))
    return f"{x:.2f}".rstrip("0").rstrip(".")


def fmt_percent(fraction: float) -> str:
    """`0.35` → `35%`, `0.320513` → `32.05%`, `0.3499` → `34.99%`, `0.34999` → `35.00%` (not exactly 35%)."""
    pct = fraction * 100
    if abs(pct - round(pct)) < 1e-6:
        return f"{round(pct)}%"
    return f"{pct:.2f}%"


def millicores_to_cores(millicores: int) -> int | float:
    """JSON value for a CPU amount: an int when whole (`32000` → 32), else a float (`500` → 0.5)."""
    if millicores % 1000 == 0:
        return millicores // 1000
    return millicores / 1000
