"""Settings: explicit arguments to ``install()``, else ``TRIAGE_*`` environment variables, else defaults.

Read once, at install time (never into module constants at import). A malformed value falls back to
its default with a debug line; configuration never raises into the training process.

| variable | default | meaning |
|---|---|---|
| TRIAGE_URL | (unset: the auto-activation stays inert) | the service, e.g. ``http://oom-triage.platform:8080`` |
| TRIAGE_TOKEN | unset | sent as ``Authorization: Bearer …`` |
| TRIAGE_SPOOL | ``$TMPDIR/oom-triage-spool`` | where bundles are written before sending (a volume in Kubernetes) |
| TRIAGE_SEND_BUDGET | 5 | seconds a crash may be delayed by capture plus delivery |
| TRIAGE_HISTORY | 1 | 0 leaves ``_record_memory_history`` alone (no trace, no stacks in the snapshot) |
| TRIAGE_HISTORY_MAX_ENTRIES | 100000 | the allocator's trace ring (see README: the trade-off) |
| TRIAGE_HISTORY_STACKS | python | ``python`` or ``all`` (C++ too: far slower to capture) |
| TRIAGE_TIMELINE_MAX | 4096 | per-step memory samples kept (a ring) |
| TRIAGE_STEP_PEAK | run | ``run``: never touch the peak counters; ``reset``: reset them each step |
| TRIAGE_SPOOL_MAX_MB | 2048 | the spool's size cap; the oldest bundles are dropped beyond it |
| TRIAGE_DISABLE | unset | 1: never install, whatever else is set |
| TRIAGE_DEBUG | unset | 1: say what the collector does on stderr |
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Chosen by measurement (bench/collector_overhead.py, README "History size"): 100,000 entries hold
# roughly 10-30 training steps of a mid-sized model; capture+spool stays around or under a second.
DEFAULT_HISTORY_MAX_ENTRIES = 100_000
DEFAULT_SEND_BUDGET_S = 5.0
DEFAULT_TIMELINE_MAX = 4096
DEFAULT_SPOOL_MAX_MB = 2048
MAX_CAPTURES_PER_PROCESS = 3


class Config:
    """The effective settings (plain class: ``dataclasses`` costs ~5 ms to import at interpreter start)."""

    __slots__ = (
        "debug",
        "history",
        "history_max_entries",
        "history_stacks",
        "send_budget",
        "spool",
        "spool_max_bytes",
        "step_peak",
        "timeline_max",
        "token",
        "url",
    )

    def __init__(
        self,
        *,
        url: str | None,
        token: str | None,
        spool: str,
        send_budget: float,
        history: bool,
        history_max_entries: int,
        history_stacks: str,
        timeline_max: int,
        step_peak: str,
        spool_max_bytes: int,
        debug: bool,
    ) -> None:
        self.url = url
        self.token = token
        self.spool = spool
        self.send_budget = send_budget
        self.history = history
        self.history_max_entries = history_max_entries
        self.history_stacks = history_stacks
        self.timeline_max = timeline_max
        self.step_peak = step_peak
        self.spool_max_bytes = spool_max_bytes
        self.debug = debug

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__ if k != "token")
        return f"Config({fields})"


def _flag(value: str | None, default: bool) -> bool:
    if value is None or not value.strip():
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


def _number(value: str | None, default: float, lo: float, hi: float, bad: list[str], name: str) -> float:
    if value is None or not value.strip():
        return default
    try:
        v = float(value)
    except ValueError:
        bad.append(f"{name}={value!r} is not a number; using {default}")
        return default
    if not lo <= v <= hi:
        bad.append(f"{name}={value!r} is outside [{lo}, {hi}]; using {default}")
        return default
    return v


def default_spool() -> str:
    import tempfile

    return os.path.join(tempfile.gettempdir(), "oom-triage-spool")


def load(
    env: Mapping[str, str] | None = None,
    *,
    url: str | None = None,
    token: str | None = None,
    spool: str | None = None,
    send_budget: float | None = None,
    history: bool | None = None,
    history_max_entries: int | None = None,
) -> tuple[Config, list[str]]:
    """The effective settings and the complaints about malformed values (for a debug line)."""
    e = os.environ if env is None else env
    bad: list[str] = []
    stacks = (e.get("TRIAGE_HISTORY_STACKS") or "python").strip().lower()
    if stacks not in ("python", "all"):
        bad.append(f"TRIAGE_HISTORY_STACKS={stacks!r} is not python|all; using python")
        stacks = "python"
    step_peak = (e.get("TRIAGE_STEP_PEAK") or "run").strip().lower()
    if step_peak not in ("run", "reset"):
        bad.append(f"TRIAGE_STEP_PEAK={step_peak!r} is not run|reset; using run")
        step_peak = "run"
    cfg = Config(
        url=(url if url is not None else e.get("TRIAGE_URL", "")).strip().rstrip("/") or None,
        token=(token if token is not None else e.get("TRIAGE_TOKEN", "")).strip() or None,
        spool=spool or e.get("TRIAGE_SPOOL", "").strip() or default_spool(),
        send_budget=float(send_budget)
        if send_budget is not None
        else _number(e.get("TRIAGE_SEND_BUDGET"), DEFAULT_SEND_BUDGET_S, 0, 600, bad, "TRIAGE_SEND_BUDGET"),
        history=history if history is not None else _flag(e.get("TRIAGE_HISTORY"), True),
        history_max_entries=int(history_max_entries)
        if history_max_entries is not None
        else int(
            _number(
                e.get("TRIAGE_HISTORY_MAX_ENTRIES"),
                DEFAULT_HISTORY_MAX_ENTRIES,
                1,
                100_000_000,
                bad,
                "TRIAGE_HISTORY_MAX_ENTRIES",
            )
        ),
        history_stacks=stacks,
        timeline_max=int(
            _number(
                e.get("TRIAGE_TIMELINE_MAX"), DEFAULT_TIMELINE_MAX, 1, 10_000_000, bad, "TRIAGE_TIMELINE_MAX"
            )
        ),
        step_peak=step_peak,
        spool_max_bytes=int(
            _number(
                e.get("TRIAGE_SPOOL_MAX_MB"), DEFAULT_SPOOL_MAX_MB, 1, 10_000_000, bad, "TRIAGE_SPOOL_MAX_MB"
            )
        )
        * 1024
        * 1024,
        debug=_flag(e.get("TRIAGE_DEBUG"), False),
    )
    return cfg, bad


def disabled(env: Mapping[str, str] | None = None) -> bool:
    e = os.environ if env is None else env
    return _flag(e.get("TRIAGE_DISABLE"), False)
