"""Malicious and broken inputs: refused with exit 2, a one-line error naming the file, nothing executed.

The corpus (well over 20 files) is generated here, in the test, from opcodes: GLOBAL, STACK_GLOBAL,
REDUCE, INST, OBJ, NEWOBJ, BUILD, EXT1, persistent ids, truncations, huge length headers, a memo bomb,
deep nesting, a gzip bomb, and well-formed data that is not a snapshot.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import struct
import zlib
from pathlib import Path

import pytest

from tests.conftest import REAL_SNAPSHOTS, run_cli
from triage.errors import (
    ForbiddenGlobal,
    InputError,
    InputTooLarge,
    MemoBomb,
    NotASnapshot,
    TooDeep,
    TruncatedInput,
)
from triage.snapshot.loader import load_snapshot

P4 = b"\x80\x04"


def _canary_global(marker: Path) -> bytes:
    # os.system("touch MARKER") via GLOBAL + REDUCE: creates the marker if anything executes it
    cmd = f"touch {marker}".encode()
    return b"\x80\x02cos\nsystem\n(X" + struct.pack("<I", len(cmd)) + cmd + b"tR."


def corpus(tmp: Path) -> dict[str, tuple[bytes, type[InputError], str]]:
    """name -> (bytes, expected error class, a word the message must contain)."""
    marker = tmp / "EXECUTED"
    real = (REAL_SNAPSHOTS / "silmont2000__assignment2-systems__133f0643__mem_snapshot.pickle").read_bytes()
    cmd = f"touch {marker}".encode()
    arg = b"X" + struct.pack("<I", len(cmd)) + cmd
    c: dict[str, tuple[bytes, type[InputError], str]] = {
        "global_os_system.pickle": (_canary_global(marker), ForbiddenGlobal, "os.system"),
        "stack_global.pickle": (
            P4 + b"\x8c\x02os\x94\x8c\x06system\x94\x93\x94" + arg + b"\x85R.",
            ForbiddenGlobal,
            "os.system",
        ),
        "reduce_builtins_eval.pickle": (
            b"\x80\x02c__builtin__\neval\n(X\x0e\x00\x00\x00print('pwned')tR.",
            ForbiddenGlobal,
            "__builtin__.eval",
        ),
        "inst_subprocess.pickle": (
            b"(" + arg + b"isubprocess\nPopen\n.",
            ForbiddenGlobal,
            "subprocess.Popen",
        ),
        "obj_opcode.pickle": (b"\x80\x02(cos\nsystem\n" + arg + b"o.", ForbiddenGlobal, "os.system"),
        "newobj.pickle": (b"\x80\x02cbuiltins\nobject\n)\x81.", ForbiddenGlobal, "builtins.object"),
        "build_setstate.pickle": (
            b"\x80\x02ccollections\nOrderedDict\n)R}b.",
            ForbiddenGlobal,
            "collections.OrderedDict",
        ),
        "ext1.pickle": (b"\x80\x02\x82\x01.", InputError, ""),
        "persid.pickle": (b"\x80\x02X\x03\x00\x00\x00abcQ.", ForbiddenGlobal, "persistent"),
        "persid_text.pickle": (b"Pabc\n.", ForbiddenGlobal, "persistent"),
        "global_inside_snapshot.pickle": (
            P4 + b"}\x94(\x8c\x08segments\x94]\x94\x8c\x04evil\x94cposix\nsystem\n\x94u.",
            ForbiddenGlobal,
            "posix.system",
        ),
        "truncated_half.pickle": (real[: len(real) // 2], TruncatedInput, "truncated"),
        "truncated_10_bytes.pickle": (real[:10], TruncatedInput, "truncated"),
        "truncated_one_short.pickle": (real[:-1], InputError, ""),
        "binunicode8_2gb.pickle": (
            P4 + b"\x8d" + struct.pack("<Q", 2 * 1024**3) + b"abc",
            InputError,
            "refused|truncated",
        ),
        "binbytes8_2gb.pickle": (
            P4 + b"\x8e" + struct.pack("<Q", 2 * 1024**3) + b"abc",
            InputError,
            "refused|truncated",
        ),
        "binunicode_2gb.pickle": (
            P4 + b"X" + struct.pack("<I", 2**31) + b"abc",
            InputError,
            "refused|truncated",
        ),
        "frame_2gb.pickle": (
            P4 + b"\x95" + struct.pack("<Q", 2 * 1024**3) + b"N.",
            InputError,
            "refused|truncated",
        ),
        "memo_bomb_long_binput.pickle": (
            P4 + b"N" + b"r" + struct.pack("<I", 0x10000000) + b".",
            MemoBomb,
            "memory",
        ),
        "memo_bomb_put.pickle": (b"N" + b"p268435456\n.", MemoBomb, "memory"),
        "deeply_nested_list.pickle": (
            b"\x80\x02" + b"]" * 300_000 + b"a" * 299_999 + b".",
            TooDeep,
            "nested deeper",
        ),
        "deep_marks.pickle": (b"(" * 200_000 + b"l" * 200_000 + b".", TooDeep, "nested deeper"),
        "not_a_snapshot_list_of_ints.pickle": (pickle.dumps([1, 2, 3]), NotASnapshot, "segment"),
        "not_a_snapshot_dict.pickle": (pickle.dumps({"hello": 1}), NotASnapshot, "segments"),
        "segments_not_list.pickle": (pickle.dumps({"segments": 5}), NotASnapshot, "segments"),
        "block_without_size.pickle": (
            pickle.dumps({"segments": [{"blocks": [{"state": "inactive"}]}]}),
            NotASnapshot,
            "block",
        ),
        "random_bytes.bin": (bytes(range(256)) * 4, InputError, ""),
        "empty.pickle": (b"", TruncatedInput, "empty"),
        "text_file.txt": (b"hello world, this is not a snapshot\n", InputError, ""),
        "json_truncated.json": (b'{"segments": [{"blocks": [', TruncatedInput, "truncated"),
        "json_deep.json": (b"[" * 200_000 + b"]" * 200_000, InputError, ""),
        "json_not_snapshot.json": (json.dumps({"a": 1}).encode(), NotASnapshot, "segments"),
        "gzip_truncated.pickle.gz": (gzip.compress(real)[:200], TruncatedInput, "truncated"),
        "gzip_garbage.gz": (b"\x1f\x8b\x08\x00" + b"\xff" * 100, InputError, ""),
        "gzip_of_global.pickle.gz": (gzip.compress(_canary_global(marker)), ForbiddenGlobal, "os.system"),
    }
    return c


def gzip_bomb(size: int) -> bytes:
    """`size` zero bytes, gzip'd: ~1000x smaller than what it inflates to."""
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9) as g:
        chunk = b"\0" * (1 << 20)
        for _ in range(size // len(chunk)):
            g.write(chunk)
    return out.getvalue()


@pytest.fixture(scope="module")
def corpus_dir(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, tuple[bytes, type[InputError], str]]]:
    d = tmp_path_factory.mktemp("hostile")
    c = corpus(d)
    for name, (data, _, _) in c.items():
        (d / name).write_bytes(data)
    return d, c


def test_corpus_is_large_enough(
    corpus_dir: tuple[Path, dict[str, tuple[bytes, type[InputError], str]]],
) -> None:
    assert len(corpus_dir[1]) >= 20


def test_each_is_refused_in_process(
    corpus_dir: tuple[Path, dict[str, tuple[bytes, type[InputError], str]]],
) -> None:
    d, c = corpus_dir
    for name, (_, err, word) in c.items():
        with pytest.raises(err) as info:
            load_snapshot(d / name)
        assert any(w in str(info.value).lower() for w in word.lower().split("|")), (name, str(info.value))
        assert str(d / name) in str(info.value), name
    assert not (d / "EXECUTED").exists(), "a hostile pickle ran code"


def test_each_is_refused_by_the_cli_with_exit_2(
    corpus_dir: tuple[Path, dict[str, tuple[bytes, type[InputError], str]]],
) -> None:
    d, c = corpus_dir
    for name in c:
        r = run_cli("replay", str(d / name), "--json")
        err = r.stderr.decode()
        assert r.returncode == 2, (name, r.returncode, err[-400:])
        assert "Traceback" not in err, (name, err)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1, (name, err)
        assert name in lines[0] and lines[0].startswith("triage replay: error:"), lines[0]
        assert r.stdout == b"", name
    assert not (d / "EXECUTED").exists(), "a hostile pickle ran code"


def test_gzip_bomb_is_refused(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.pickle.gz"
    bomb.write_bytes(gzip_bomb(256 * 1024 * 1024))
    assert bomb.stat().st_size < 1024 * 1024
    with pytest.raises(InputTooLarge, match="gzip bomb"):
        load_snapshot(bomb, max_bytes=64 * 1024 * 1024)
    r = run_cli("replay", str(bomb), "--json", "--max-bytes", str(64 * 1024 * 1024))
    assert r.returncode == 2 and b"gzip bomb" in r.stderr and b"Traceback" not in r.stderr


def test_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "big.pickle"
    p.write_bytes((REAL_SNAPSHOTS / "Yiyi-philosophy__LLM-inference__oom_snapshot.pickle").read_bytes())
    r = run_cli("replay", str(p), "--json", env={"TRIAGE_MAX_SNAPSHOT_BYTES": "1000"})
    assert r.returncode == 2 and b"exceeds the 1000-byte limit" in r.stderr


def test_missing_file_and_directory(tmp_path: Path) -> None:
    r = run_cli("replay", str(tmp_path / "nope.pickle"))
    assert r.returncode == 2 and b"no such file" in r.stderr
    r = run_cli("replay", str(tmp_path))
    assert r.returncode == 2 and b"is a directory" in r.stderr


def test_zlib_stream_without_gzip_header_is_not_a_snapshot(tmp_path: Path) -> None:
    p = tmp_path / "z.bin"
    p.write_bytes(zlib.compress(b"x" * 1000))
    with pytest.raises(InputError):
        load_snapshot(p)


# --------------------------------------------------------------------------- well-formed, wrong types inside


def _small_snapshot() -> dict[str, object]:
    frame = {"filename": "/w/train.py", "line": 57, "name": "train_step"}
    return {
        "segments": [
            {
                "device": 0,
                "address": 1 << 32,
                "total_size": 20 << 20,
                "stream": 0,
                "segment_type": "large",
                "allocated_size": 4 << 20,
                "active_size": 4 << 20,
                "requested_size": 4 << 20,
                "blocks": [
                    {
                        "address": 1 << 32,
                        "size": 4 << 20,
                        "requested_size": 4 << 20,
                        "state": "active_allocated",
                        "frames": [dict(frame)],
                    },
                    {
                        "address": (1 << 32) + (4 << 20),
                        "size": 16 << 20,
                        "requested_size": 0,
                        "state": "inactive",
                        "frames": [],
                    },
                ],
                "frames": [dict(frame)],
            }
        ],
        "device_traces": [
            [
                {
                    "action": "segment_alloc",
                    "addr": 1 << 32,
                    "size": 20 << 20,
                    "stream": 0,
                    "time_us": 1,
                    "frames": [dict(frame)],
                },
                {
                    "action": "alloc",
                    "addr": 1 << 32,
                    "size": 4 << 20,
                    "stream": 0,
                    "time_us": 2,
                    "frames": [dict(frame)],
                },
            ]
        ],
    }


def _set(obj: object, path: tuple[object, ...], value: object) -> None:
    for k in path[:-1]:
        obj = obj[k]  # type: ignore[index]
    obj[path[-1]] = value  # type: ignore[index]


ODD_VALUES = [
    # a frame's fields of another type read as unknown; the file still replays
    (("segments", 0, "blocks", 0, "frames", 0, "name"), {"a": 1}, 0),
    (("segments", 0, "blocks", 0, "frames", 0, "filename"), ["x"], 0),
    (("segments", 0, "frames", 0, "line"), [1, 2], 0),
    (("device_traces", 0, 1, "frames", 0, "name"), ["x"], 0),
    # a trace entry that is not a dict, or whose action, address or frames cannot be one: refused, exit 2
    (("device_traces", 0, 1), [1, 2], 2),
    (("device_traces", 0, 1, "action"), {"a": 1}, 2),
    (("device_traces", 0, 1, "action"), None, 2),
    (("device_traces", 0, 1, "addr"), [1], 2),
    (("device_traces", 0, 1, "addr"), "0x100000000", 2),
    (("device_traces", 0, 1, "frames"), "train.py:57", 2),
]


@pytest.mark.parametrize("suffix", [".json", ".pickle"])
@pytest.mark.parametrize(
    ("path", "value", "rc"), ODD_VALUES, ids=[f"{p[-1]}-{i}" for i, (p, _, _) in enumerate(ODD_VALUES)]
)
def test_a_field_of_the_wrong_type_is_read_or_refused_never_a_traceback(
    tmp_path: Path, suffix: str, path: tuple[object, ...], value: object, rc: int
) -> None:
    snap = _small_snapshot()
    _set(snap, path, value)
    f = tmp_path / f"odd{suffix}"
    f.write_bytes(json.dumps(snap).encode() if suffix == ".json" else pickle.dumps(snap))
    r = run_cli("replay", str(f), "--json")
    err = r.stderr.decode()
    assert "Traceback" not in err, err
    assert r.returncode == rc, (r.returncode, err[-400:])
    if rc == 0:
        assert json.loads(r.stdout)["summary"]["allocated_bytes"] == 4 << 20
    else:
        assert err.startswith("triage replay: error:") and "trace entr" in err, err


def _bundle(snapshot: object) -> dict[str, object]:
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": "00000000-0000-4000-8000-000000000002",
        "occurred_at": "2026-11-30T10:00:00+00:00",
        "kind": "cuda_oom",
        "error": {
            "type": "torch.OutOfMemoryError",
            "message": (
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
                "1.21 GiB is free. Process 4242 has 46.00 GiB memory in use. Including non-PyTorch memory, this "
                "process has 31.92 GiB memory in use. Of the allocated memory 30.10 GiB is allocated by PyTorch, "
                "and 1.20 GiB is reserved by PyTorch but unallocated."
            ),
        },
        "workload": {"pid": 7, "pids": [7]},
        "snapshot": snapshot,
    }


def test_a_bundle_whose_snapshot_cannot_be_read_is_diagnosed_without_it(tmp_path: Path) -> None:
    snap = _small_snapshot()
    _set(snap, ("device_traces", 0, 1, "action"), {"a": 1})
    f = tmp_path / "bundle.json"
    f.write_text(json.dumps(_bundle(snap)))
    r = run_cli("replay", str(f), "--json")
    assert r.returncode == 0, r.stderr.decode()[-400:]
    d = json.loads(r.stdout)
    assert d["verdict"] == "other_process"  # the message's neighbour still decides
    assert any("snapshot could not be read" in e["fact"] for e in d["evidence"])


@pytest.mark.parametrize("part", ["device", "host", "workload", "allocator", "k8s", "occurred_at"])
@pytest.mark.parametrize("value", [5, "x", [1, 2], True])
def test_a_bundle_part_of_the_wrong_type_reads_as_absent(tmp_path: Path, part: str, value: object) -> None:
    b = _bundle(None)
    b[part] = value
    f = tmp_path / "bundle.json"
    f.write_text(json.dumps(b))
    r = run_cli("replay", str(f), "--json")
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr.decode()[-600:]
    assert json.loads(r.stdout)["verdict"] in ("other_process", "inconclusive")
