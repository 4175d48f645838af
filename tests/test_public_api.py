"""The public APIs of `triage` and `collector` are small and pinned: changing them is a decision."""

from __future__ import annotations

import subprocess
import sys

import triage
from tests.conftest import REAL_SNAPSHOTS, ROOT


def test_triage_public_api_is_pinned() -> None:
    assert sorted(triage.__all__) == sorted(
        [
            "Diagnosis",
            "InputError",
            "TriageError",
            "__version__",
            "diagnose_bundle",
            "diagnose_file",
            "diagnose_text",
            "load_snapshot",
        ]
    )
    for name in triage.__all__:
        assert getattr(triage, name) is not None


def test_replay_never_imports_torch_or_the_server() -> None:
    snap = REAL_SNAPSHOTS / "Maphsge4__select_n__1f2f5480__snapshot.pickle"
    code = (
        "import sys, io, contextlib\n"
        "from triage.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    rc = main(['replay', {str(snap)!r}, '--json'])\n"
        "assert rc == 0, rc\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main(['replay', {str(snap)!r}])\n"
        "assert rc == 0, rc\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'fastapi', 'sqlalchemy', 'pydantic', 'numpy'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")


def test_collector_imports_with_the_standard_library_alone() -> None:
    code = (
        "import sys\n"
        "import collector\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triage', 'fastapi', 'pydantic', 'sqlalchemy', 'jinja2', 'rich'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    r = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert r.returncode == 0, r.stderr
