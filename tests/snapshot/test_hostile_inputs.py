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
