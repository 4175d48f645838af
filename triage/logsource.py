"""A log as it arrives from a log pipeline, turned back into the lines the job printed.

On-call pastes what their log tool exports, not the container's output:
- JSON lines, one record per line: Google Cloud Logging (``textPayload``, ``jsonPayload.message``), Docker's
  json-file driver (``log``, a line split at 16 KiB continued in the next record), Fluent Bit (``log``),
  journald's JSON (``MESSAGE``), Loki's line format (``line``), generic ``message`` / ``msg``;
- one JSON document: an array of those records (the Cloud Console's download), Loki's ``query_range``
  answer (streams of ``[nanoseconds, line]``), an Elasticsearch search answer (``hits.hits[]._source``),
  Datadog's logs API (``data[].attributes.message``);
- a CSV export with a message column (Datadog's, Kibana's).

Exports are often newest first, and several streams (stdout, stderr) are merged by time: the records are
put back in time order when every record carries a time. A record whose message is itself a JSON object (a
structured logger's line) is written as its message followed by ``key=value`` for its other fields, so a
memory reading in a field (``"alloc_gb": 12.3``) reads like one printed in text. Anything else is returned
as it came.
"""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import datetime
from typing import Any

# keys that hold a record's text, in the order looked for
_TEXT_KEYS = ("textPayload", "log", "MESSAGE", "message", "msg", "line", "Message", "content")
_NESTED = ("jsonPayload", "_source", "attributes", "fields")
_TIME_KEYS = (
    "timestamp",
    "@timestamp",
    "time",
    "date",
    "ts",
    "__REALTIME_TIMESTAMP",
    "Date",
    "receiveTimestamp",
)
_MIN_RECORDS = 2
_RE_ISO = re.compile(r"^(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(?:[.,](\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?$")
_CSV_TEXT = ("message", "log", "content", "line", "textpayload")


def plain_text(text: str) -> str:
    """The lines the job printed, from a log pipeline's export; ``text`` itself when it is not one."""
    start = text[:4096].lstrip()
    if start.startswith("==> "):
        return _file_sections(text)
    head = start[:1]
    records: list[tuple[float | None, str]] | None = None
    if head in ("{", "["):
        records = _json_records(text)
    elif "," in text[:2000] and (col := _csv_header(text)) is not None:
        records = _csv_records(text, col)
    if not records or len(records) < _MIN_RECORDS:
        return text
    return _flatten_lines(_join(_ordered(records)))


_RE_FILE_HEADER = re.compile(r"^==> (.{1,512}) <==$", re.MULTILINE)
_RE_RANK_IN_NAME = re.compile(r"rank[_-]?(\d{1,7})", re.IGNORECASE)
_RE_NUMBER = re.compile(r"\d{1,7}")


def _file_sections(text: str) -> str:
    """Several files' logs as ``tail``/``head`` print them (each after ``==> name <==``): each file's lines
    marked as one rank's, so one rank's memory prints are not read as another's. The rank is the one the file
    name gives (``rank3.log``, ``worker-1.out``: its number), else the file's place. A line's own rank prefix
    still decides its rank. One file alone is returned as it is."""
    heads = list(_RE_FILE_HEADER.finditer(text))
    if len(heads) < 2:
        return text
    out = [text[: heads[0].start()]]
    for i, h in enumerate(heads):
        name = h.group(1).strip().rsplit("/", 1)[-1]
        m = _RE_RANK_IN_NAME.search(name)
        nums = _RE_NUMBER.findall(name)
        rank = int(m.group(1)) if m else int(nums[-1]) if len(nums) == 1 else i
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        body = text[h.end() : end]
        out.append(h.group(0))
        out.append("\n".join(f"[rank{rank}]: {ln}" if ln.strip() else ln for ln in body.split("\n")))
    return "".join(out)


def _json_records(text: str) -> list[tuple[float | None, str]] | None:
    stripped = text.strip()
    try:
        doc = json.loads(stripped)
    except ValueError:
        doc = None
    if doc is not None:
        return _document(doc)
    out: list[tuple[float | None, str]] = []
    lines = [ln for ln in stripped.split("\n") if ln.strip()]
    for ln in lines:
        try:
            rec = json.loads(ln)
        except ValueError:
            return None  # not JSON lines: a log that happens to start with a brace
        got = _record(rec)
        if got is None:
            return None
        out.append(got)
    return out


def _document(doc: Any) -> list[tuple[float | None, str]] | None:
    if isinstance(doc, list):
        recs = [_record(r) for r in doc]
        return None if not recs or any(r is None for r in recs) else [r for r in recs if r is not None]
    if not isinstance(doc, dict):
        return None
    data = doc.get("data")
    if isinstance(data, dict) and isinstance(data.get("result"), list):  # Loki query_range
        out: list[tuple[float | None, str]] = []
        for stream in data["result"]:
            for pair in stream.get("values", []) if isinstance(stream, dict) else []:
                if isinstance(pair, list) and len(pair) >= 2 and isinstance(pair[1], str):
                    out.append((_time(pair[0]), pair[1]))
        return out or None
    if isinstance(data, list):  # Datadog's logs API
        return _document(data)
    hits = doc.get("hits")
    if isinstance(hits, dict) and isinstance(hits.get("hits"), list):  # Elasticsearch
        return _document(hits["hits"])
    for key in ("entries", "logs", "records", "events"):
        if isinstance(doc.get(key), list):
            return _document(doc[key])
    return None


def _record(rec: Any) -> tuple[float | None, str] | None:
    """(time, text) of one exported record; None when it holds no text."""
    if not isinstance(rec, dict):
        return None
    for key in _TEXT_KEYS:
        value = rec.get(key)
        if isinstance(value, str):
            if key in ("message", "msg") and "\n" not in value.strip():
                # a structured logger's own record (not a pipeline's wrapper): its other fields are the line's
                return _record_time(rec), _fields(rec)
            return _record_time(rec), value
    for key in _NESTED:
        inner = rec.get(key)
        if isinstance(inner, dict):
            got = _record(inner)
            if got is not None:
                return (got[0] if got[0] is not None else _record_time(rec)), got[1]
    return None


def _record_time(rec: dict[str, Any]) -> float | None:
    for key in _TIME_KEYS:
        if key in rec:
            t = _time(rec[key])
            if t is not None:
                return t
    return None


def _time(value: Any) -> float | None:
    """Seconds since the epoch from an export's time: a number or numeric string (seconds, ms, µs or ns by
    its size) or an ISO 8601 string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        x = float(value)
    elif isinstance(value, str):
        s = value.strip()
        try:
            x = float(s)
        except ValueError:
            m = _RE_ISO.match(s)
            if m is None:
                return None
            frac = (m.group(3) or "0")[:6].ljust(6, "0")
            zone = m.group(4) or "+00:00"
            zone = "+00:00" if zone == "Z" else zone
            try:
                dt = datetime.fromisoformat(f"{m.group(1)}T{m.group(2)}.{frac}{zone}")
            except ValueError:
                return None
            return dt.timestamp()
    else:
        return None
    for scale in (1e9, 1e6, 1e3):
        if x > scale * 1e8:  # later than 1973 in that unit
            return x / scale
    return x


def _fields(obj: dict[str, Any]) -> str:
    """A structured logger's record as ``message key=value …`` (its scalar fields)."""
    msg = next((obj[k] for k in ("msg", "message", "event", "text") if isinstance(obj.get(k), str)), "")
    rest = " ".join(
        f"{k}={v}"
        for k, v in obj.items()
        if k not in ("msg", "message", "event", "text") and not isinstance(v, dict | list)
    )
    return f"{msg.rstrip()} {rest}".strip()


def _flatten_lines(text: str) -> str:
    """Each line that is a JSON object (a structured logger's line inside a pipeline's record) as
    ``message key=value …``; other lines as they are."""
    if '{"' not in text:
        return text
    out = []
    for line in text.split("\n"):
        s = line.strip()
        if s.startswith("{") and s.endswith("}"):
            try:
                obj = json.loads(s)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                line = _fields(obj)
        out.append(line)
    return "\n".join(out)


def _csv_header(text: str) -> int | None:
    first = text[:4096].lstrip().split("\n", 1)[0]
    try:
        cells = next(csv.reader([first]))
    except (csv.Error, StopIteration):
        return None
    low = [c.strip().lower() for c in cells]
    return next((i for i, c in enumerate(low) if c in _CSV_TEXT), None)


def _csv_records(text: str, col: int) -> list[tuple[float | None, str]] | None:
    """(time, text) of each row of a CSV export whose column ``col`` holds the message."""
    try:
        rows = list(csv.reader(io.StringIO(text.lstrip())))
    except csv.Error:
        return None
    header = [c.strip().lower() for c in rows[0]]
    tcol = next((i for i, c in enumerate(header) if c in ("date", "timestamp", "time", "@timestamp")), None)
    out: list[tuple[float | None, str]] = []
    for row in rows[1:]:
        if len(row) <= col:
            continue
        out.append((_time(row[tcol]) if tcol is not None and len(row) > tcol else None, row[col]))
    return out


def _ordered(records: list[tuple[float | None, str]]) -> list[str]:
    """The records' texts in time order: an export newest first is turned round, and several streams merged
    by time are sorted (stably) when every record has a time; else the order they came in."""
    times = [t for t, _ in records]
    if any(t is None for t in times):
        return [text for _, text in records]
    known = [t for t in times if t is not None]
    if known[0] > known[-1]:
        records = records[::-1]
    return [text for _, text in sorted(records, key=lambda r: r[0] or 0.0)]


def _join(texts: list[str]) -> str:
    """One text. Where the records end their lines themselves (Docker's json-file keeps the newline), one that
    does not is a line split at 16 KiB and runs on into the next; elsewhere each record is a line (or more)."""
    if any(t.endswith("\n") for t in texts):
        return "".join(texts)
    return "\n".join(texts) + "\n"
