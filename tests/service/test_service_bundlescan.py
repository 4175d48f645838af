"""The bounded-memory bundle reader: gunzip with a cap and a hash, a JSON scan that keeps the small
fields and only checks the snapshot's syntax."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tracemalloc

import pytest

from triage.errors import InputTooLarge
from triage.service.bundlescan import BadBundle, GunzipReader, scan_bundle


def scan(
    data: bytes, *, gzipped: bool = True, max_bytes: int = 1 << 40, **kw: int
) -> tuple[object, GunzipReader]:
    body = gzip.compress(data, compresslevel=1) if gzipped else data
    reader = GunzipReader(io.BytesIO(body), gzipped=gzipped, max_bytes=max_bytes)
    return scan_bundle(reader, **kw), reader


def big_snapshot_json(segments: int, blocks: int, *, frames: int = 20, pad: int = 0) -> bytes:
    frame = '{"filename": "/w/' + "p" * pad + 'train.py", "line": 12, "name": "f\\"}{["}'
    block = '{"size": 512, "state": "active_allocated", "frames": [' + ", ".join([frame] * frames) + "]}"
    segment = '{"address": 1, "total_size": 2097152, "blocks": [' + ", ".join([block] * blocks) + "]}"
    return ('{"segments": [' + ", ".join([segment] * segments) + '], "device_traces": [[]]}').encode()


def test_keeps_fields_and_skips_the_snapshot_wherever_it_is() -> None:
    snap = big_snapshot_json(4, 10).decode()
    for doc in (
        f'{{"snapshot": {snap}, "schema": "s", "kind": "cuda_oom", "n": 12345678901234567890}}',
        f'{{"schema": "s", "kind": "cuda_oom", "n": 12345678901234567890, "snapshot": {snap}}}',
    ):
        result, reader = scan(doc.encode())
        assert result.fields == {"schema": "s", "kind": "cuda_oom", "n": 12345678901234567890}  # type: ignore[attr-defined]
        assert result.snapshot == "object"  # type: ignore[attr-defined]
        assert reader.size == len(doc.encode())
        assert reader.sha256.hexdigest() == hashlib.sha256(doc.encode()).hexdigest()


def test_plain_json_and_multi_member_gzip() -> None:
    doc = b'{"schema": "s", "snapshot": null, "workload": {"rank": 3}}'
    result, _ = scan(doc, gzipped=False)
    assert result.fields["workload"] == {"rank": 3}  # type: ignore[attr-defined]
    assert result.snapshot == "null"  # type: ignore[attr-defined]
    body = gzip.compress(doc[:10]) + gzip.compress(doc[10:])
    reader = GunzipReader(io.BytesIO(body), gzipped=True, max_bytes=1 << 20)
    assert scan_bundle(reader).fields["workload"] == {"rank": 3}
    assert reader.size == len(doc)


def test_a_large_snapshot_is_scanned_in_bounded_memory() -> None:
    # few, long strings: tracemalloc costs per allocation, and the bound is about bytes
    data = b'{"schema": "s", "snapshot": ' + big_snapshot_json(60, 200, frames=4, pad=1000) + b"}"
    assert len(data) > 50_000_000
    body = gzip.compress(data, compresslevel=1)
    tracemalloc.start()
    try:
        reader = GunzipReader(io.BytesIO(body), gzipped=True, max_bytes=1 << 40)
        result = scan_bundle(reader)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.snapshot == "object"
    assert reader.size == len(data)
    assert peak < 40_000_000, f"peak {peak / 1e6:.1f} MB while scanning {len(data) / 1e6:.0f} MB"


def test_a_decompression_bomb_stops_at_the_cap() -> None:
    data = b'{"schema": "s", "pad": "' + b"0" * 5_000_000 + b'"}'
    with pytest.raises(InputTooLarge):
        scan(data, max_bytes=1_000_000)


def test_an_oversized_field_is_skipped_not_kept() -> None:
    data = json.dumps({"schema": "s", "timeline": [{"step": i} for i in range(2000)]}).encode()
    result, _ = scan(data, field_chars=1000)
    assert "timeline" not in result.fields  # type: ignore[attr-defined]
    assert result.skipped == ["timeline"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[1, 2]", "must be a JSON object"),
        (b'{"a": 1', "expected ','"),
        (b'{"a": 1} x', "extra data"),
        (b'{"a": 1,}', "expected a key"),
        (b'{"snapshot": {"a": [1, 2}}', "malformed JSON"),
        (b'{"snapshot": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested too deeply"),
        (b'{"a": "\xff"}', "not UTF-8"),
        (b"", "must be a JSON object"),
    ],
)
def test_malformed_bundles_are_refused_with_a_reason(data: bytes, message: str) -> None:
    with pytest.raises(BadBundle, match=message):
        scan(data)


def test_a_truncated_or_corrupt_gzip_stream_is_refused() -> None:
    body = gzip.compress(b'{"schema": "s", "pad": "' + b"x" * 100_000 + b'"}')
    with pytest.raises(BadBundle, match="ends early"):
        scan_bundle(GunzipReader(io.BytesIO(body[: len(body) // 2]), gzipped=True, max_bytes=1 << 30))
    with pytest.raises(BadBundle, match="not a valid gzip"):
        scan_bundle(GunzipReader(io.BytesIO(b"not gzip at all"), gzipped=True, max_bytes=1 << 30))
