"""The auto-activation .pth reaches the top of site-packages from a regular and from an editable wheel
(setup.py's build_py; see collector/README.md, "Packaging")."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheels_carry_the_pth_at_their_root(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    for pkg in ("collector", "triage", "rules"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    code = (
        "import sys\n"
        "from setuptools import build_meta as b\n"
        "out = sys.argv[1]\n"  # build_meta rewrites sys.argv
        "print(b.build_wheel(out))\n"
        "print(b.build_editable(out))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "dist")],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    wheels = sorted((tmp_path / "dist").glob("*.whl"))
    assert len(wheels) == 2, [w.name for w in wheels]
    pth = (ROOT / "collector" / "_boot" / "oom_triage_collector.pth").read_bytes()
    for whl in wheels:
        with zipfile.ZipFile(whl) as z:
            assert z.read("oom_triage_collector.pth") == pth, whl.name
